// Profiling a backend (`blend profile`): times forward passes of prefill-only and decode-only
// steps of several sizes on the machine at hand (or reads the steps of a real engine run, a
// step timings file) and fits
//  - the cost model's hardware (DESIGN.md §3): t = GEMM FLOPs / compute + prefill attention
//    FLOPs / attention compute + bytes / bandwidth + overhead, the four coefficients by least
//    squares, none negative (a CPU runs GEMMs and attention one after the other, so the terms
//    add up);
//  - the GEMMs' row tile (NanoFlow §4.2's discrete batching), from a scan of step sizes around
//    multiples of every candidate tile;
//  - BROS's iteration model (§4.1): prefill t = a + b x tokens; decode t = a + b x sequences +
//    c x context tokens;
// and reports, per measured step, the estimate against the measurement (the cost model's
// validation table, as NanoFlow/BlendServe Table 1).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "cost/cost_model.h"
#include "engine/engine.h"
#include "sched/hybrid_policy.h"

namespace blend {

struct ProfilePoint {
  std::string kind;  // "prefill", "decode" or "dense" (the scan of step sizes)
  int64_t sequences = 0, tokens = 0, context = 0;  // context: KV tokens read (decode)
  StepShape shape;                                 // what the cost model prices
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
  std::vector<int64_t> prefill_tokens = {64, 128, 256, 512, 1024};                  // one prompt
  std::vector<std::pair<int64_t, int64_t>> prefill_batches = {{4, 256}, {4, 512}};  // (n, tokens)
  std::vector<int64_t> decode_sequences = {8, 32, 64, 128};
  std::vector<int64_t> decode_contexts = {64, 256, 1024};
  // NanoFlow §4.2's fast sizes: steps of anchor + c and anchor + c + 1 tokens for every
  // candidate tile c (and c = 0), in prompts of 128 tokens, so that a GEMM tile of c rows shows
  // as a jump between the two. The anchors are multiples of every candidate.
  std::vector<int64_t> dense_scan_anchors = {512};
  std::vector<int64_t> row_tile_candidates = {8, 16, 32, 64, 128, 256, 512};
  int64_t max_kv_tokens = 64 * 1024;  // decode points above this are skipped
  int reps = 3;                       // median of
  int64_t page_size = 16;             // the backend's
  std::function<double()> clock;      // seconds; default the steady clock (tests inject one)
};

// One step of a real engine run and the wall time from its start to the next step's start, so
// the host's work between steps (admission, results) is charged to the steps, as the
// simulator's clock, which advances only by steps, must charge it.
struct MeasuredStep {
  StepShape shape;
  double seconds = 0;
};

// Records an engine's steps through Engine::add_step_observer.
// The engine keeps a pointer to the recorder: it must not step once the recorder is gone.
class StepRecorder {
 public:
  explicit StepRecorder(Engine& engine);
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;
  // The steps so far; the last one ends at `end_seconds` on the engine's clock.
  std::vector<MeasuredStep> steps(double end_seconds) const;

 private:
  std::vector<std::pair<StepShape, double>> started_;
};

// A step timings file: one JSON object per step and line, the StepShape's fields
// (prefill_tokens, decode_tokens, decode_context_tokens, prefill_attention_pairs, logit_rows,
// device_draws, named "plain_draws" in the file) and "seconds". read_step_timings throws
// blend::Error naming the file and line of a bad one.
void write_step_timings(const std::string& path, const std::vector<MeasuredStep>& steps);
std::vector<MeasuredStep> read_step_timings(const std::string& path);

struct HardwareFit {
  Hardware hardware;
  // Relative errors of the fitted estimate over the steps, and of their total
  // (sum estimated / sum measured - 1).
  double mean_abs_error = 0, max_abs_error = 0, total_error = 0;
};

// Fits compute, prefill attention efficiency, bandwidth and step overhead (least squares on
// seconds, every coefficient >= 0) so that the cost model's sequential step time matches the
// steps: in the sum form (GEMMs, attention, weight and KV reads one after another), and in the
// GPU's roofline form (Hardware::gemm_roofline: GEMMs at max(compute, weight read), KV at its
// own rate, a cost per decode sequence), keeping the roofline where the Bayesian information
// criterion prefers it to the sum.
// The GEMMs' rows are charged in whole tiles of `dense_row_tile` past one (fit_row_tile's).
// Sampling is not fitted: `per_logit_row_seconds` (measured apart) is charged per logit row
// and taken out of each step's time first, except in steps whose rows are all plain greedy
// when `device_argmax` (the backend took their argmax on the device). With the overhead kept,
// a linear fit's residuals sum to zero, so the steps' total time, which is what a simulated
// throughput rests on, is exact in the sum form and close in the roofline's.
HardwareFit fit_hardware(const ModelShape& shape, const std::vector<MeasuredStep>& steps,
                         double per_logit_row_seconds, bool device_argmax = false,
                         int64_t dense_row_tile = 1);

// NanoFlow §4.2: the GEMMs' row tile (Hardware::dense_row_tile) that best explains the times of
// steps of one kind at the given sizes (tokens, seconds): t = a + b x the rows charged, by least
// squares for each candidate and for none (1), kept where the information criterion prefers it
// to none with the tile counted as a parameter. 1 with fewer than 4 sizes.
int64_t fit_row_tile(const std::vector<std::pair<int64_t, double>>& sizes,
                     std::span<const int64_t> candidates);

// `backend` needs max_kv_tokens of KV pages; `shape` is the same model's shape.
BackendProfile profile_backend(Backend& backend, const ModelShape& shape,
                               const ProfileOptions& options);

}  // namespace blend
