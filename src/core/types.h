// The engine's vocabulary types. No dependencies beyond the standard library.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace blend {

using TokenId = int32_t;
constexpr TokenId kNoToken = -1;  // what a simulating engine appends instead of a sampled token
using SeqId = int64_t;
using PageId = int32_t;

// What a request asks of the sampler (OpenAI fields; defaults are OpenAI's).
struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 or -1 = off
  float min_p = 0.0f;
  std::optional<uint64_t> seed;  // per-request RNG seed; unset = derived from the request id
  int32_t max_tokens = 16;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  std::optional<int32_t> logprobs;  // number of top logprobs per token, when set
};

enum class FinishReason { kNone, kStop, kLength };

}  // namespace blend
