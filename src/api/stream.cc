#include "api/stream.h"

#include <utility>

#include "api/logprobs.h"

namespace blend {

using nlohmann::json;

StreamChunks::StreamChunks(const ApiRequest& request, std::string id, std::string model,
                           int64_t created, const Tokenizer& tokenizer, int32_t index)
    : chat_(request.endpoint == Endpoint::kChatCompletions),
      logprobs_(request.params.logprobs.has_value()),
      tokens_as_ids_(request.tokens_as_ids),
      include_usage_(request.include_usage),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      index_(index),
      tokenizer_(tokenizer) {}

json StreamChunks::chunk(json choices) const {
  json c = {{"id", id_},
            {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_},
            {"choices", std::move(choices)}};
  // OpenAI: with include_usage every chunk has "usage": null but the last.
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

json StreamChunks::role() const {
  if (!chat_) return nullptr;
  return chunk(json::array({{{"index", index_},
                             {"delta", {{"role", "assistant"}, {"content", ""}}},
                             {"logprobs", nullptr},
                             {"finish_reason", nullptr}}}));
}

json StreamChunks::delta(std::string_view text, std::span<const SampledToken> tokens) {
  json logprobs = nullptr;
  if (logprobs_) {
    logprobs = chat_ ? chat_logprobs(tokens, tokenizer_, tokens_as_ids_)
                     : completion_logprobs(tokens, tokenizer_, text_offset_, &text_offset_,
                                           tokens_as_ids_);
  }
  json choice = {{"index", index_}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
  if (chat_)
    choice["delta"] = {{"content", text}};
  else
    choice["text"] = text;
  return chunk(json::array({choice}));
}

json StreamChunks::finish(FinishReason reason) const {
  json choice = {
      {"index", index_}, {"logprobs", nullptr}, {"finish_reason", finish_reason_name(reason)}};
  if (chat_)
    choice["delta"] = json::object();
  else
    choice["text"] = "";
  return chunk(json::array({choice}));
}

json StreamChunks::usage(const GenerationResult& result) const {
  return usage(std::span<const GenerationResult>(&result, 1));
}

json StreamChunks::usage(std::span<const GenerationResult> results) const {
  json c = chunk(json::array());
  c["usage"] = make_usage(results);
  return c;
}

}  // namespace blend
