// The audit of every request field of /v1/completions and /v1/chat/completions (OpenAI's
// schema and the vLLM/SGLang extensions clients send): each is implemented, harmless (read
// and ignored on purpose), or refused with a 400 naming it unless it holds its default. A
// field that would change the result and is not implemented is never ignored (issue 25), and
// a field no schema has is refused as OpenAI refuses it ("Unrecognized request argument").
#pragma once

#include <nlohmann/json.hpp>

namespace blend {

enum class Endpoint;

// Throws ApiError (400, param = the field) for a field that is unknown, unsupported with a
// non-default value, or of the wrong type where only this audit reads it. The implemented
// fields' values are checked where they are parsed (api/openai.cc).
void check_request_fields(Endpoint endpoint, const nlohmann::json& body);

}  // namespace blend
