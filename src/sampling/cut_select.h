// The sampler's top-k and top-p cuts as one canonical selection, written once for the host and
// the GPU: which tokens a cut keeps depends only on the row, never on a sort's or a sum's order,
// so the host sampler (sampler.cc) and the cuda backend's draw kernel (backend/cuda/draw.cu)
// keep the same tokens and then draw the same one from them.
//
// Tokens rank by logit, highest first, ties to the lower id (the order greedy decoding and the
// top logprobs use). A cut keeps the shortest most-likely prefix of the ranked candidates, each
// kept token having less than `budget` of some weight ranked before it:
// - top-k: weight 1 per token, budget k;
// - top-p: each token's draw weight (plain_draw.h) in fixed point (fixed_mass: integer sums are
//   exact in any order), budget top_p x the candidates' total (top_p_budget).
// Because the ranking is a strict total order, the kept prefix ends at one (key, id): RankCut.
//
// Finding it without sorting: a radix select over the logits' ordered bits, most significant
// digit first (three passes of 11, 11 and 10 bits). Each pass histograms the candidates that
// match the digits chosen so far, by count and by weight, and descends into the lowest bin that
// still starts below the budget (radix_choose). Tokens tied on the last key are kept in id
// order while the weight before them stays below the budget.
#pragma once

#include <cstdint>
#include <cstring>

#include "sampling/plain_draw.h"

namespace blend {

// A logit's rank key: larger logit, larger key; -0 and +0 equal (they compare equal as floats,
// and the sampler ranks equal logits by id). No NaN reaches it (the sampler sanitises first).
BLEND_HOST_DEVICE inline uint32_t rank_key(float logit) {
  if (logit == 0.0f) logit = 0.0f;  // -0 -> +0
  uint32_t u;
  std::memcpy(&u, &logit, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// A draw weight (in [0, 1]) in fixed point: 2^40 per unit, truncated. A 2^23-token row sums to
// below 2^63. Weights under 2^-40 count as 0 toward top-p's mass, and nothing else.
inline constexpr int kMassBits = 40;
BLEND_HOST_DEVICE inline uint64_t fixed_mass(float weight) {
  return static_cast<uint64_t>(weight * static_cast<float>(uint64_t{1} << kMassBits));
}

// top-p's budget over candidates of total fixed mass `total`: at least 1, so the top token is
// always kept.
BLEND_HOST_DEVICE inline uint64_t top_p_budget(float top_p, uint64_t total) {
  const auto budget =
      static_cast<uint64_t>(static_cast<double>(top_p) * static_cast<double>(total));
  return budget < 1 ? 1 : budget;
}

// Where a cut ends: it keeps the tokens ranked at or before (key, last_id). The default keeps
// every token.
struct RankCut {
  uint32_t key = 0;
  int64_t last_id = INT64_MAX;
};
BLEND_HOST_DEVICE inline bool rank_kept(const RankCut& cut, uint32_t key, int64_t id) {
  return key > cut.key || (key == cut.key && id <= cut.last_id);
}

// The radix passes: pass p reads bits [radix_shift(p), radix_shift(p) + radix_bits(p)).
inline constexpr int kRadixPasses = 3;
inline constexpr int kRadixBins = 2048;  // the widest pass's bins
BLEND_HOST_DEVICE inline int radix_shift(int pass) {
  return pass == 0 ? 21 : pass == 1 ? 10 : 0;
}
BLEND_HOST_DEVICE inline int radix_bits(int pass) {
  return pass == 2 ? 10 : 11;
}
BLEND_HOST_DEVICE inline int radix_digit(uint32_t key, int pass) {
  return static_cast<int>((key >> radix_shift(pass)) & ((1u << radix_bits(pass)) - 1));
}
// Whether `key` has the digits chosen before pass `pass` (`prefix` holds them in place).
BLEND_HOST_DEVICE inline bool radix_matches(uint32_t key, uint32_t prefix, int pass) {
  const int shift = radix_shift(pass) + radix_bits(pass);
  return shift >= 32 || (key >> shift) == (prefix >> shift);
}

// One pass's choice: the lowest non-empty bin whose tokens start with less than `budget` of
// weight ranked before them, the bins scanned from the top. `*above` holds the weight ranked
// before every bin of the pass (below the budget); it returns the chosen bin and leaves `*above`
// at the weight ranked before that bin.
template <class Weight>  // uint64_t, or the GPU's unsigned long long (atomicAdd's type)
BLEND_HOST_DEVICE inline int radix_choose(const uint32_t* count, const Weight* weight, int bins,
                                          uint64_t budget, uint64_t* above) {
  uint64_t run = *above;
  int chosen = -1;
  uint64_t chosen_above = run;
  for (int b = bins - 1; b >= 0; --b) {
    if (count[b] == 0) continue;
    if (run >= budget) break;
    chosen = b;
    chosen_above = run;
    run += weight[b];
  }
  *above = chosen_above;
  return chosen;
}

}  // namespace blend
