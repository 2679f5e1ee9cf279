// Server-sent-event chunks of a streamed response in OpenAI's shapes: chat.completion.chunk
// ({"delta": {"role"|"content"}}) and text_completion chunks ({"text"}), each carrying the
// logprobs of the tokens it holds when the request asked for them (OpenAI sends them in
// stream chunks too; issue 25). The server makes one of these per engine token (or per batch
// of tokens) and frames it as "data: <json>\n\n".
//
// With tools (request.tool_format), the text goes through text/tool_calls.h's parser: content
// streams as it is decided, and each call is sent as one delta.tool_calls entry (index, id,
// type, function name and its whole arguments) as soon as its text is complete; text that may
// still be part of a call is held back until it is decided. The OpenAI clients accumulate such
// deltas the same way as argument fragments.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/openai.h"

namespace blend {

class StreamChunks {
 public:
  // Keeps what the chunks need from `request` (its endpoint, logprobs, usage options, the size
  // and echo text of this choice's prompt) and a reference to `tokenizer`, which must outlive
  // this object.
  // `index`: the choice these chunks carry (one StreamChunks per choice when n > 1 or several
  // prompts: prompt index / n).
  StreamChunks(const ApiRequest& request, std::string id, std::string model, int64_t created,
               const Tokenizer& tokenizer, int32_t index = 0);

  // Chat: the first chunk, {"delta": {"role": "assistant", "content": ""}}. Completions have
  // no such chunk: returns null.
  nlohmann::json role() const;
  // The chunk for `text` and the tokens that made it. With logprobs asked, `tokens` gives one
  // entry per token (text can lag its tokens: an incomplete UTF-8 character waits); the
  // completions API's text_offset continues across chunks.
  // Null when there is nothing to send yet (tools: the text is held back, no logprobs asked).
  // With echo, the first delta starts with the prompt's text.
  nlohmann::json delta(std::string_view text, std::span<const SampledToken> tokens);
  // Tokens the choice generated that no delta() carries (their text was held back and is not
  // sent): counted in the usage of continuous_usage_stats.
  void count(std::span<const SampledToken> tokens) { completion_tokens_ += tokens.size(); }
  // With tools, before finish(): what the parser held back, decided now (null when nothing).
  nlohmann::json flush();
  // The last choice chunk: an empty delta (or text: the echo when no delta sent it), the
  // finish reason ("tool_calls" when calls were sent and the model stopped by itself) and
  // vLLM's stop_reason.
  nlohmann::json finish(FinishReason reason, const StopReason& stop_reason = {});
  // With stream_options.include_usage: the final chunk, "choices": [] and the usage (of every
  // choice's result: make_usage).
  nlohmann::json usage(const GenerationResult& result) const;
  nlohmann::json usage(std::span<const GenerationResult> results) const;

 private:
  nlohmann::json chunk(nlohmann::json choices) const;
  nlohmann::json tool_delta(const ToolCallOutput& out, nlohmann::json logprobs);

  bool chat_;
  bool logprobs_;
  bool tokens_as_ids_;
  bool include_usage_;
  bool continuous_usage_;  // every chunk's usage: this choice's so far
  int32_t n_ = 1;
  size_t prompt_tokens_ = 0, completion_tokens_ = 0;
  std::string echo_;  // the prompt's text until a chunk has carried it
  std::string id_, model_;
  int64_t created_;
  int32_t index_ = 0;
  const Tokenizer& tokenizer_;
  size_t text_offset_ = 0;  // completion bytes the earlier chunks' logprobs covered
  std::optional<ToolCallParser> tools_;
  size_t calls_sent_ = 0;
};

}  // namespace blend
