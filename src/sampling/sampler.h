// Sampler — turns one logits row into the next token (logit_bias, repetition / frequency /
// presence penalties, then greedy, temperature, top-k, top-p, min-p) and, when asked, its
// log-probabilities. Randomness is a pure function of
// (seed, output index), so a request's tokens do not depend on which other requests share the
// batch, on the planner's order, or on preemption (DESIGN.md §2 Sampler).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/types.h"
#include "sampling/device_draw.h"

namespace blend {

// A uniform double in [0, 1) for output index `step` of a sequence seeded with `seed`.
double sampling_uniform(uint64_t seed, int64_t step);

// The weights a temperature draw gives a row whose largest logit is `max`, at 1 / temperature =
// inv_t, exactly as sample_token computes them: the GPU's draw (sampling/plain_draw.h) must
// match them bit for bit. `out` holds logits.size() floats.
void temperature_weights(std::span<const float> logits, float max, float inv_t,
                         std::span<float> out);

// The logprob sample_token reports for a token of logit `logit` in a row whose largest logit is
// `max` and whose temperature-1 weights (temperature_weights at inv_t 1) add up, block sum by
// block sum in order as plain_draw.h adds them, to `total`: log-softmax, logit - (max + log total).
// A backend that adds the weights where the logits are reports the same floats through it.
float row_logprob(float logit, float max, double total);

// The DeviceDraw of output index `step` of a sequence seeded with `seed` and sampled with
// `params` (an argmax below kGreedyTemperature or at top_k 1; the cuts only at a temperature).
// Whether a backend may run it is the caller's question: penalties, bias and masks are not in it.
DeviceDraw device_draw_of(const SamplingParams& params, uint64_t seed, int64_t step);

// Temperatures below this sample greedily (as vLLM does): 1/T overflows long before T = 0, and
// a draw at T = 1e-40 would otherwise read NaN weights.
constexpr float kGreedyTemperature = 1e-5f;

// What the penalties look at: the sequence's prompt and the tokens it has generated so far
// (`output.size()` is the output index of the token being sampled).
struct TokenHistory {
  std::span<const TokenId> prompt;
  std::span<const TokenId> output;
};

// Samples output index `step` of a sequence seeded with `seed`. Any logits are survivable: NaN
// counts as -inf, and a row with no finite logit gives token 0 (`SampledToken::invalid` says
// so, for the caller to report). Token ids in `history` and params.logit_bias must be inside
// the row.
// `allowed` (structured output): a bitset over the row, bit t of word t / 64 set = token t may
// be sampled; null = every token may.
SampledToken sample_token(std::span<const float> logits, const SamplingParams& params,
                          uint64_t seed, int64_t step, const TokenHistory& history = {},
                          const uint64_t* allowed = nullptr);

// vLLM's prompt logprob of `token` in a logits row: its log-softmax (the float sample_token
// reports as a logprob for that row), its rank and the `top` most likely tokens.
PromptLogprob score_token(std::span<const float> logits, TokenId token, int32_t top);

}  // namespace blend
