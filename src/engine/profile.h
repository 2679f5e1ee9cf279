// Profiling a backend (`blend profile`): times forward passes of prefill-only and decode-only
// steps of several sizes on the machine at hand and fits
//  - the cost model's hardware (DESIGN.md §3): t = GEMM FLOPs / compute + prefill attention
//    FLOPs / attention compute + bytes / bandwidth + overhead, the four coefficients by least
//    squares, none negative (a CPU runs GEMMs and attention one after the other, so the terms
//    add up);
//  - BROS's iteration model (§4.1): prefill t = a + b x tokens; decode t = a + b x sequences +
//    c x context tokens;
// and reports, per measured step, the estimate against the measurement (the cost model's
// validation table, as NanoFlow/BlendServe Table 1).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cost/cost_model.h"
#include "sched/hybrid_policy.h"

namespace blend {

struct ProfilePoint {
  std::string kind;                                // "prefill" or "decode"
  int64_t sequences = 0, tokens = 0, context = 0;  // context: KV tokens read (decode)
  double measured_seconds = 0;
  double estimated_seconds = 0;  // by the fitted cost model
};

struct BackendProfile {
  Hardware hardware;             // fitted: compute, attention efficiency, bandwidth, step overhead
  IterationCostModel iteration;  // fitted BROS linear models
  std::vector<ProfilePoint> points;              // with the fitted estimate beside each measurement
  double mean_abs_error = 0, max_abs_error = 0;  // relative, over the points
};

struct ProfileOptions {
  std::vector<int64_t> prefill_tokens = {64, 128, 256, 512, 1024};
  std::vector<int64_t> decode_sequences = {8, 32, 64, 128};
  std::vector<int64_t> decode_contexts = {64, 256, 1024};
  int64_t max_kv_tokens = 64 * 1024;  // decode points above this are skipped
  int reps = 3;                       // median of
  int64_t page_size = 16;             // the backend's
  std::function<double()> clock;      // seconds; default the steady clock (tests inject one)
};

// `backend` needs max_kv_tokens of KV pages; `shape` is the same model's shape.
BackendProfile profile_backend(Backend& backend, const ModelShape& shape,
                               const ProfileOptions& options);

}  // namespace blend
