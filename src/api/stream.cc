#include "api/stream.h"

#include <algorithm>
#include <utility>

#include "api/logprobs.h"
#include "api/tools.h"

namespace blend {

using nlohmann::json;

StreamChunks::StreamChunks(const ApiRequest& request, std::string id, std::string model,
                           int64_t created, const Tokenizer& tokenizer, int32_t index)
    : chat_(request.endpoint == Endpoint::kChatCompletions),
      logprobs_(request.params.logprobs.has_value()),
      tokens_as_ids_(request.tokens_as_ids),
      include_usage_(request.include_usage),
      continuous_usage_(request.continuous_usage),
      n_(std::max(request.n, 1)),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      index_(index),
      tokenizer_(tokenizer) {
  if (chat_ && request.tool_format) tools_.emplace(*request.tool_format, request.max_tool_calls);
  const auto prompt = static_cast<size_t>(index / n_);
  if (prompt < request.prompt_count()) prompt_tokens_ = request.prompt_at(prompt).size();
  if (prompt < request.echo.size()) echo_ = request.echo[prompt];
}

json StreamChunks::chunk(json choices) const {
  json c = {{"id", id_},
            {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_},
            {"choices", std::move(choices)}};
  // OpenAI: with include_usage every chunk has "usage": null but the last; vLLM's
  // continuous_usage_stats: the choice's usage so far.
  if (continuous_usage_)
    c["usage"] = {{"prompt_tokens", prompt_tokens_},
                  {"completion_tokens", completion_tokens_},
                  {"total_tokens", prompt_tokens_ + completion_tokens_}};
  else if (include_usage_)
    c["usage"] = nullptr;
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
  count(tokens);
  std::string echoed;
  if (!echo_.empty()) {  // vLLM: the prompt and the first token's text in one delta
    echoed = std::exchange(echo_, {}) + std::string(text);
    text = echoed;
  }
  json logprobs = nullptr;
  if (logprobs_) {
    logprobs = chat_ ? chat_logprobs(tokens, tokenizer_, tokens_as_ids_)
                     : completion_logprobs(tokens, tokenizer_, text_offset_, &text_offset_,
                                           tokens_as_ids_);
  }
  if (tools_) return tool_delta(tools_->feed(text), std::move(logprobs));
  json choice = {{"index", index_}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
  if (chat_)
    choice["delta"] = {{"content", text}};
  else
    choice["text"] = text;
  return chunk(json::array({choice}));
}

json StreamChunks::tool_delta(const ToolCallOutput& out, json logprobs) {
  if (out.empty() && logprobs.is_null()) return nullptr;
  json delta = json::object();
  if (!out.content.empty()) delta["content"] = out.content;
  if (!out.calls.empty()) {
    delta["tool_calls"] = tool_calls_json(out.calls, /*with_index=*/true, calls_sent_);
    calls_sent_ += out.calls.size();
  }
  return chunk(json::array(
      {{{"index", index_}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", nullptr}}}));
}

json StreamChunks::flush() {
  if (!tools_) return nullptr;
  return tool_delta(tools_->finish(), nullptr);
}

json StreamChunks::finish(FinishReason reason, const StopReason& stop_reason) {
  const char* name = finish_reason_name(reason);
  if (calls_sent_ > 0 && reason == FinishReason::kStop) name = "tool_calls";
  json choice = {{"index", index_},
                 {"logprobs", nullptr},
                 {"finish_reason", name},
                 {"stop_reason", stop_reason_json(stop_reason)}};
  if (chat_)
    choice["delta"] = json::object();
  else
    choice["text"] = std::exchange(echo_, {});
  return chunk(json::array({choice}));
}

json StreamChunks::usage(const GenerationResult& result) const {
  return usage(std::span<const GenerationResult>(&result, 1));
}

json StreamChunks::usage(std::span<const GenerationResult> results) const {
  json c = chunk(json::array());
  c["usage"] = make_usage(results, n_);
  return c;
}

}  // namespace blend
