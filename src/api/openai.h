// OpenAI wire format: parsing /v1/completions and /v1/chat/completions request bodies into
// engine requests, and building the response objects (text_completion, chat.completion) from
// engine results. Shared by `blend batch` (Batch API files) and `blend serve` (HTTP).
// Field names, defaults and error shapes follow the OpenAI API reference; vLLM's extensions
// top_k, min_p, ignore_eos and stop_token_ids are accepted too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/types.h"
#include "core/request.h"

namespace blend {

class ChatTemplate;
class Tokenizer;

// A request the API rejects: HTTP status, OpenAI error type and the offending parameter.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = "",
           std::string type = "invalid_request_error")
      : Error(message), status_(status), param_(std::move(param)), type_(std::move(type)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  // {"error": {"message", "type", "param", "code"}}
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_;
  std::string type_;
};

enum class Endpoint { kCompletions, kChatCompletions };

// "/v1/completions" or "/v1/chat/completions" (with or without the /v1 prefix); else ApiError.
Endpoint parse_endpoint(const std::string& url);

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::vector<TokenId> prompt;
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Extension fields (seconds): latency targets of a real-time request (BROS §4.1); unset =
  // the server's defaults.
  std::optional<double> ttft_slo, tpot_slo;
};

// Parses a request body; tokenizes the prompt (rendering `messages` through the chat template).
// Throws ApiError (status 400) naming the parameter on bad input.
ApiRequest parse_api_request(Endpoint endpoint, const nlohmann::json& body,
                             const Tokenizer& tokenizer, const ChatTemplate* chat_template);

// The response body for a finished request.
nlohmann::json make_response(const ApiRequest& request, const GenerationResult& result,
                             const std::string& response_id, const std::string& model,
                             int64_t created, const Tokenizer& tokenizer);

const char* finish_reason_name(FinishReason reason);

}  // namespace blend
