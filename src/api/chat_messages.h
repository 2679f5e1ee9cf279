// Chat messages as the chat template should see them. Clients (the openai SDKs, LangChain,
// most frameworks) send `content` as a list of parts, [{"type": "text", "text": ...}]; the
// template would print that list as a Python repr. Text parts are joined with "\n", as vLLM
// does (vllm/entrypoints/chat_utils.py, `"\n".join(texts)`); parts this text-only engine
// cannot read (image_url, input_audio, file, ...) are refused naming the part (issue 25).
#pragma once

#include <nlohmann/json.hpp>

namespace blend {

// A copy of `messages` with every content-part list flattened to a string. Throws ApiError
// (400, param "messages[i]..." ) for a message that is not an object, has no string role, has
// content that is neither a string, null nor a list of text parts, or holds invalid UTF-8.
nlohmann::json flatten_chat_messages(const nlohmann::json& messages);

}  // namespace blend
