// The sampler's plain temperature draw, written once for the host and the GPU: a row's token at
// temperature T with no top-k / top-p / min-p, penalties, bias, mask or logprobs (a row with cuts
// is drawn the same way over the tokens cut_select.h keeps, the others weighing 0). sample_token
// (sampler.cc) computes its weights with draw_weight in vector loops; the cuda backend's draw
// kernel (backend/cuda/draw.cu) computes the same sums and walk with these functions, so a row
// drawn on the GPU gets the token the host would have drawn from the same logits (tests/sampling
// check the pieces against sample_token; tests/cuda the tokens), whatever else is in the batch.
//
// The draw: weights w_i = exp((l_i - max) / T) by a Cody-Waite reduction and a degree-6
// polynomial (a -inf logit weighs exactly 0); each 256-token block's sum as eight float lanes
// (lane j takes tokens j, j + 8, ...; a block's tail goes to lane 0) added in lane order; the
// total as a double sum of the block sums in order; u = sampling_uniform(seed, step) x total;
// the token where the running sum in token order first passes u (a block skipped whole by its
// sum), never a token of weight 0.
//
// The multiply-adds are fused by name (fmaf), not left to the compiler: it fused them in a
// release build and not in the sanitizer build, so the weights differed between builds. Named,
// they round alike in every build, on every ISA and on the GPU; a CPU without FMA (older than
// x86-64-v3) computes them with the library's fmaf, slowly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BLEND_HOST_DEVICE __host__ __device__
#else
#define BLEND_HOST_DEVICE
#endif

namespace blend {

inline constexpr int kDrawBlock = 256;  // tokens a block sum covers
inline constexpr int kDrawLanes = 8;    // float lanes a block sum adds in

// exp(x) for x <= 0 (flushed to exp(-87) below -87), rounded as the host sampler rounds it.
BLEND_HOST_DEVICE inline float draw_exp(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = fmaf(x, 1.44269504088896341f, shifter) - shifter;
  const float r = fmaf(-n, 1.428606765330187045e-06f, fmaf(-n, 0.693145751953125f, x));
  float p = 1.0f / 720.0f;
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Token i's weight in a row whose largest logit is `max`, at 1 / temperature = inv_t; a -inf
// logit weighs exactly 0, as on the host.
BLEND_HOST_DEVICE inline float draw_weight(float logit, float max, float inv_t) {
  return logit < -3.402823466e38f ? 0.0f : draw_exp((logit - max) * inv_t);
}

// Token i's plain-draw weight, as a functor: the draw below also runs over other weights (the
// cut draw of cut_select.h weighs the tokens a cut drops 0).
struct PlainWeight {
  const float* row;
  float max, inv_t;
  BLEND_HOST_DEVICE float operator()(int64_t i) const { return draw_weight(row[i], max, inv_t); }
};

// Lane `lane` of block `block`'s sum over a row of `vocab` tokens weighing weight(i): the weights
// of tokens first + lane, first + lane + 8, ... in order, and on lane 0 the block's tail past
// its last whole group of eight.
template <class Weight>
BLEND_HOST_DEVICE inline float draw_lane_sum(const Weight& weight, int64_t vocab, int64_t block,
                                             int lane) {
  const int64_t first = block * kDrawBlock;
  const int64_t end = vocab < first + kDrawBlock ? vocab : first + kDrawBlock;
  const int64_t whole = first + (end - first) / kDrawLanes * kDrawLanes;
  float sum = 0.0f;
  for (int64_t i = first + lane; i < whole; i += kDrawLanes) sum += weight(i);
  if (lane == 0)
    for (int64_t i = whole; i < end; ++i) sum += weight(i);
  return sum;
}
BLEND_HOST_DEVICE inline float draw_lane_sum(const float* row, int64_t vocab, int64_t block,
                                             int lane, float max, float inv_t) {
  return draw_lane_sum(PlainWeight{row, max, inv_t}, vocab, block, lane);
}

// A block's sum from its eight lane sums.
BLEND_HOST_DEVICE inline float draw_block_sum(const float* lanes) {
  float sum = 0.0f;
  for (int j = 0; j < kDrawLanes; ++j) sum += lanes[j];
  return sum;
}

// The row's total from its block sums, added in order in double (the host's blocked_total).
BLEND_HOST_DEVICE inline double draw_total(const float* sums, int64_t num_blocks) {
  double total = 0;
  for (int64_t b = 0; b < num_blocks; ++b) total += sums[b];
  return total;
}

// The token a draw at u01 (sampling_uniform of the row's seed and output index) picks, from the
// row's `num_blocks` block sums: blocks are skipped whole by their sums and the block the draw
// falls in is walked; the running sum rounds differently from the lane sums, so a draw past a
// block's end takes its last token of weight, and one past the total (rounding) the row's last.
template <class Weight>
BLEND_HOST_DEVICE inline int64_t draw_pick(const Weight& weight, int64_t vocab, const float* sums,
                                           int64_t num_blocks, double u01) {
  const double u = u01 * draw_total(sums, num_blocks);
  double acc = 0;
  for (int64_t b = 0; b < num_blocks; ++b) {
    if (u >= acc + sums[b]) {
      acc += sums[b];
      continue;
    }
    const int64_t first = b * kDrawBlock;
    const int64_t end = vocab < first + kDrawBlock ? vocab : first + kDrawBlock;
    double run = acc;
    for (int64_t i = first; i < end; ++i) {
      const float w = weight(i);
      run += w;
      if (u < run && w > 0.0f) return i;
    }
    for (int64_t i = end; i-- > first;)
      if (weight(i) > 0.0f) return i;
  }
  for (int64_t i = vocab; i-- > 0;)
    if (weight(i) > 0.0f) return i;
  return vocab;  // no token of weight: not reached for a row with a finite maximum
}
BLEND_HOST_DEVICE inline int64_t draw_pick(const float* row, int64_t vocab, const float* sums,
                                           int64_t num_blocks, float max, float inv_t, double u01) {
  return draw_pick(PlainWeight{row, max, inv_t}, vocab, sums, num_blocks, u01);
}

}  // namespace blend
