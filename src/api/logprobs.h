// OpenAI's two logprobs shapes, built from the sampler's tokens: chat's
// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]} and the
// completions API's {tokens, token_logprobs, top_logprobs: [{text: logprob}], text_offset}.
// Used by whole responses and by stream chunks alike, so both carry the same numbers.
// `tokens_as_ids` (vLLM's return_tokens_as_token_ids): every token, chosen or top, is written
// "token_id:<id>" instead of its text, so that tokens whose bytes are not valid UTF-8 on their
// own (and decode to U+FFFD) stay distinguishable; text_offset still counts the text's bytes.
#pragma once

#include <cstddef>
#include <span>

#include <nlohmann/json.hpp>

#include "core/types.h"

namespace blend {

class Tokenizer;

nlohmann::json chat_logprobs(std::span<const SampledToken> tokens, const Tokenizer& tokenizer,
                             bool tokens_as_ids = false);

// Each top_logprobs dict holds the k most likely tokens and the sampled one (vLLM's shape: k + 1
// entries when the sampled token is not among the k); chat's top_logprobs stay OpenAI's k.
// `text_offset` counts from `first_offset`: the bytes of completion text before these tokens
// (0 for a whole response; the text already streamed for a chunk). Returns the offset after.
nlohmann::json completion_logprobs(std::span<const SampledToken> tokens, const Tokenizer& tokenizer,
                                   size_t first_offset = 0, size_t* end_offset = nullptr,
                                   bool tokens_as_ids = false);

// vLLM's prompt_logprobs of a prompt scored as `scored` (GenerationResult::prompt_logprobs, an
// entry per prompt token): null for an unscored token (the first), then per token a dict
// "<token id>" -> {logprob, rank, decoded_token} holding the token and its most likely
// alternatives.
nlohmann::json prompt_logprobs_json(std::span<const PromptLogprob> scored,
                                    const Tokenizer& tokenizer, bool tokens_as_ids = false);

// completion_logprobs with an echoed prompt first (OpenAI's legacy echo): the prompt's tokens
// as `scored` holds them, an unscored one (the first) with a null logprob and null
// alternatives, each other with its `top` most likely alternatives and itself; then the
// completion's `tokens`, whose text_offset starts at `completion_offset` (the bytes of echoed
// text before the completion).
nlohmann::json echo_completion_logprobs(std::span<const PromptLogprob> scored, int32_t top,
                                        std::span<const SampledToken> tokens,
                                        const Tokenizer& tokenizer, size_t completion_offset,
                                        bool tokens_as_ids = false);

}  // namespace blend
