// The OpenAI Responses API (POST /v1/responses), the subset vLLM serves, as a translation onto
// the chat path: a Responses body becomes the /v1/chat/completions body it means (input items
// -> messages, instructions -> a first system message, flat function tools -> chat tools,
// text.format -> response_format, max_output_tokens -> max_completion_tokens), which
// parse_api_request (api/openai.h) checks, renders and constrains as any chat request; the
// chat answer (make_response) becomes a "response" object, and a stream's chat chunks
// (api/stream.h) become the Responses events. So there is one generation path, one set of
// limits and one grammar path for both APIs.
//
// What is refused (400 naming the field): what would change the result and is not implemented
// (previous_response_id, store: true, reasoning, background, include, truncation other than
// "disabled", top_logprobs, max_tool_calls, prompt templates, conversation, text.verbosity,
// built-in tools such as web_search or file_search, images, files and audio in the input,
// reasoning or item_reference input items) and fields no schema has. Responses are not
// stored: GET /v1/responses/{id} is a 404 saying so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "core/request.h"

namespace blend {

struct ResponsesRequest {
  nlohmann::json chat_body;   // the /v1/chat/completions body it means
  std::string chat_raw_body;  // that body's text, keys in the client's order (tool rendering)
  // The request fields the response object repeats (instructions, tools, text, ...), in the
  // Responses shapes.
  nlohmann::json echo;
  bool stream = false;
};

// Translates a /v1/responses body. Throws ApiError 400 naming the field (in Responses terms:
// "input[2].content") for bad input and for what is refused (see above). `raw_body`: the text
// `body` was parsed from, when the caller has it; tools then keep the client's key order (as
// chat's do, api/tools.h tools_in_client_order).
ResponsesRequest parse_responses_request(const nlohmann::json& body,
                                         std::string_view raw_body = {});

// An ApiError of the chat parser with its parameter named as the Responses body names it
// ("messages" -> "input", "max_completion_tokens" -> "max_output_tokens", "response_format" ->
// "text.format", "tools[1].function.name" -> "tools[1].name").
ApiError responses_error(const ApiError& chat_error);

// The "response" object: id "resp_...", status, the request's echoed fields, `output` items and
// `usage` (null while in progress).
nlohmann::json make_responses_object(const ResponsesRequest& request, const std::string& id,
                                     const std::string& model, int64_t created_at,
                                     const std::string& status, nlohmann::json output,
                                     nlohmann::json usage);

// The Responses usage object over a chat usage object (api/openai.h make_usage).
nlohmann::json responses_usage(const nlohmann::json& chat_usage);

// The whole answer from a chat.completion object (make_response of the translated request):
// a "message" item with the text (one output_text part, annotations []) unless the reply is
// only calls, then one "function_call" item per call. A reply cut by the token limit is
// "incomplete" with incomplete_details.reason "max_output_tokens".
nlohmann::json responses_from_chat(const ResponsesRequest& request,
                                   const nlohmann::json& chat_completion, const std::string& id,
                                   int64_t created_at);

// A streamed response: the chat chunks of StreamChunks (api/stream.h) in, the Responses events
// out, each framed as SSE ("event: TYPE\ndata: JSON\n\n") with its sequence_number:
// response.created, response.in_progress, then per output item output_item.added, (message)
// content_part.added, output_text.delta..., output_text.done, content_part.done, (call)
// function_call_arguments.delta and .done, output_item.done; last response.completed with the
// whole response (the status "incomplete" when cut by max_output_tokens, as vLLM sends it).
class ResponsesEvents {
 public:
  // `request` must outlive this object.
  ResponsesEvents(const ResponsesRequest& request, std::string id, std::string model,
                  int64_t created_at);
  std::string start();
  // One chat.completion.chunk (null: nothing).
  std::string chat_chunk(const nlohmann::json& chunk);
  // After the last chunk: closes the open item and sends response.completed.
  std::string finish(FinishReason finish, const nlohmann::json& chat_usage);
  // A failure mid-stream: an "error" event (OpenAI's shape) from an error body.
  std::string error(const nlohmann::json& error_body);

 private:
  std::string event(nlohmann::json e);
  std::string open_message();
  std::string close_message(const std::string& status);
  std::string function_call(const nlohmann::json& call);
  nlohmann::json response(const std::string& status, nlohmann::json usage) const;

  const ResponsesRequest& request_;
  std::string id_, model_;
  int64_t created_at_;
  int64_t sequence_ = 0;
  nlohmann::json output_ = nlohmann::json::array();  // the items done
  std::optional<nlohmann::json> message_;            // the message item being streamed
  std::string text_;                                 // its text so far
};

}  // namespace blend
