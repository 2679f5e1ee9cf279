// Sampler — turns one logits row into the next token (greedy, temperature, top-k, top-p,
// min-p) and, when asked, its log-probabilities. Randomness is a pure function of
// (seed, output index), so a request's tokens do not depend on which other requests share the
// batch, on the planner's order, or on preemption (DESIGN.md §2 Sampler).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/types.h"

namespace blend {

// A uniform double in [0, 1) for output index `step` of a sequence seeded with `seed`.
double sampling_uniform(uint64_t seed, int64_t step);

SampledToken sample_token(std::span<const float> logits, const SamplingParams& params,
                          uint64_t seed, int64_t step);

}  // namespace blend
