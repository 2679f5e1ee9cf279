// The error a client sees: an HTTP status and OpenAI's error body. Everything in api/ that
// refuses client input throws this (a blend::Error, so callers that only know Error still
// print a clear message).
#pragma once

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend {

// A request the API rejects: HTTP status, OpenAI error type and the offending parameter.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = "",
           std::string type = "invalid_request_error", std::string code = "")
      : Error(message),
        status_(status),
        param_(std::move(param)),
        type_(std::move(type)),
        code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }  // OpenAI's error code, e.g. model_not_found
  // {"error": {"message", "type", "param", "code"}}
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_;
  std::string type_;
  std::string code_;
};

struct GenerationResult;

// The error of a request that failed while generating (FinishReason::kError): a 400 naming the
// field when the request itself was at fault (GenerationResult::error_param: its stop string
// cut its own structured value), else a 500 (NaN logits: the server's failure).
ApiError generation_error(const GenerationResult& failed);

}  // namespace blend
