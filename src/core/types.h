// The engine's vocabulary types. No dependencies beyond the standard library.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace blend {

class TokenConstraint;  // core/constraint.h

using TokenId = int32_t;
using SeqId = int64_t;
using PageId = int32_t;
// Which of an engine's models a request runs on (0 = the first, the default; see engine.h).
using ModelId = int32_t;

// What a request asks of the sampler (OpenAI fields; defaults are OpenAI's).
struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 or -1 = off
  float min_p = 0.0f;
  std::optional<uint64_t> seed;  // per-request RNG seed; unset = derived from the request id
  int32_t max_tokens = 16;
  std::vector<std::string> stop;  // stop strings (cut from the output unless included below)
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  // vLLM's min_tokens: until this many tokens are out, EOS and stop_token_ids cannot be sampled
  // (masked, as a grammar masks: the logprobs of those steps are the masked row's, where vLLM
  // reports the raw row's) and stop strings are not looked for.
  int32_t min_tokens = 0;
  // vLLM's include_stop_str_in_output: the stop string that ended the request stays in the
  // text, and so does the text of a final EOS or stop token (empty for a skipped special one).
  bool include_stop_str_in_output = false;
  // vLLM's skip_special_tokens: special tokens (tokenizer.json added tokens marked special)
  // leave no text; false writes them as they are spelled ("<|eot_id|>").
  bool skip_special_tokens = true;
  std::optional<int32_t> logprobs;  // number of top logprobs per token, when set
  // vLLM's prompt_logprobs: each prompt token's logprob given the tokens before it, with this
  // many top alternatives (GenerationResult::prompt_logprobs), when set.
  std::optional<int32_t> prompt_logprobs;
  // Penalties over the tokens generated so far (OpenAI: presence/frequency, subtracted from a
  // logit once / once per occurrence) and over prompt + output (vLLM/HF: repetition, positive
  // logits divided by it, negative ones multiplied); 0, 0 and 1 = off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  // OpenAI logit_bias: added to the raw logits of these tokens before sampling (and before
  // logprobs are taken, as OpenAI documents it), sorted by token id.
  std::vector<std::pair<TokenId, float>> logit_bias;
  // Structured output (response_format): only tokens that keep the output a prefix of a valid
  // value may be sampled, EOS only once it is complete; null = unconstrained.
  std::shared_ptr<const TokenConstraint> constraint;
};

// A model's own sampling defaults (generation_config.json), used where a request sets no value
// of its own, as vLLM does (its --generation-config auto): the fields vLLM takes from it.
struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  std::optional<int32_t> max_tokens;  // max_new_tokens
  bool empty() const {
    return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_tokens;
  }
};

// One sampled token and, when asked, log-probabilities (the sampler's output).
struct TopLogprob {
  TokenId token;
  float logprob;
};

struct SampledToken {
  TokenId token = 0;
  float logprob = 0.0f;         // log-softmax of the raw logits at `token`
  std::vector<TopLogprob> top;  // the `logprobs` most likely tokens, when asked
  bool invalid = false;         // the logits row held no finite value (a broken model)
};

// One prompt token scored by the model given the tokens before it (vLLM's prompt_logprobs):
// its log-softmax, its rank (1 + the tokens with a higher logit) and the most likely tokens
// there, each of rank i + 1 in `top`. Rank 0: not scored (a prompt's first token).
inline constexpr int32_t kMaxPromptLogprobs = 20;  // vLLM's default max_logprobs
struct PromptLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<TopLogprob> top;
};

// kError: the request failed while generating (GenerationResult::error says why; a model whose
// logits are NaN): its output is not an answer.
enum class FinishReason { kNone, kStop, kLength, kError };

}  // namespace blend
