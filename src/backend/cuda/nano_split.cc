#include "backend/cuda/nano_split.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace blend::cuda {

double nano_gemm_seconds(const NanoCost& cost, double tokens) {
  return std::max(tokens * cost.gemm_seconds_per_token, cost.weight_seconds);
}

double nano_attention_reads(const ChunkWork& chunk, double prefill_kv_tile) {
  const double keys = static_cast<double>(chunk.cached) + chunk.tokens;
  return (chunk.tokens <= 1 ? 1.0 : std::ceil(chunk.tokens / prefill_kv_tile)) * keys;
}

double nano_attention_seconds(const NanoCost& cost, const ChunkWork& chunk) {
  return nano_attention_reads(chunk, cost.prefill_kv_tile) * cost.kv_seconds_per_token;
}

double nano_pipeline_seconds(const NanoCost& cost, double gx, double ax, double gy, double ay) {
  // X.A(l) runs beside Y.G(l), Y.A(l) beside X.G(l+1) (nano_split.h); the two attentions share
  // the memory, so together they take at least their sum.
  const double period = std::max({gx + gy, gx + ax, gy + ay, ax + ay});
  const double overlapped = std::min(ax, gy) + std::min(ay, gx);
  return period + cost.interference * overlapped;
}

NanoSplit choose_nano_split(std::span<const ChunkWork> chunks, const NanoCost& cost,
                            double min_ratio, bool always) {
  const size_t n = chunks.size();
  std::vector<double> tokens(n + 1, 0), attention(n + 1, 0);  // prefix sums
  for (size_t i = 0; i < n; ++i) {
    tokens[i + 1] = tokens[i] + chunks[i].tokens;
    attention[i + 1] = attention[i] + nano_attention_seconds(cost, chunks[i]);
  }
  NanoSplit best;
  best.sequential_s = nano_gemm_seconds(cost, tokens[n]) + attention[n];
  best.pipelined_s = best.sequential_s;
  double best_cut_s = 0;
  int32_t best_cut = 0;
  for (size_t c = 1; c < n; ++c) {
    const double s = nano_pipeline_seconds(cost, nano_gemm_seconds(cost, tokens[c]), attention[c],
                                           nano_gemm_seconds(cost, tokens[n] - tokens[c]),
                                           attention[n] - attention[c]);
    if (best_cut == 0 || s < best_cut_s) {
      best_cut_s = s;
      best_cut = static_cast<int32_t>(c);
    }
  }
  if (best_cut > 0 && (always || best_cut_s <= min_ratio * best.sequential_s)) {
    best.cut = best_cut;
    best.pipelined_s = best_cut_s;
  }
  return best;
}

}  // namespace blend::cuda
