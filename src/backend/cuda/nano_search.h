// NanoFlow §5.5's automatic parameter search for the two-lane nano-batch pipeline
// (nano_split.h): where to cut a step, and how many SMs the GEMM phases and the attention
// phases each get (§5.1's execution-unit scheduling), from offline profiles of each phase's
// time against its SM count. Pure host code, tested without a GPU.
//
// The pipeline's dependencies per layer l (nano_pipeline.cc, NanoFlow Fig. 5/6):
//   X.G(l) -> X.A(l) -> X.G(l+1) on lane X, the same on lane Y;
//   X.G(l) -> Y.G(l) -> X.G(l+1): the GEMM phases take turns (one GEMM phase at a time);
//   X.A(l) -> Y.A(l) -> X.A(l+1): the model lets the attentions take turns too (the pipeline
//   does not order them, but both read at the memory's bandwidth, so side by side each would
//   take about twice as long).
// So X.A(l) runs beside Y.G(l) and Y.A(l) beside X.G(l+1). With the GEMMs limited to g SMs and
// the attention to a SMs, g + a <= the GPU's SMs, overlapped kernels never oversubscribe the
// SMs, and each phase takes its profiled time at its SM count (NanoFlow's premise; whether our
// kernels keep it is what a GPU run of `blend profile --backend cuda` has to show). A step's
// time is the critical path of that graph through every layer.
//
// The search (§5.5): from an even split of the SMs, move `step` SMs to the phase kind with the
// most time on the critical path, taking them from the other, while the critical path
// shortens (and the other way when that way does not: a saturated memory-bound kernel gains
// nothing from more SMs, yet the GEMMs on the path gain from its spare ones); do this for
// every cut of the step and keep the shortest. A cut is taken only when it beats the step run
// whole on every SM.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/cuda/nano_split.h"

namespace blend::cuda {

// One phase kind's seconds per layer, measured at a grid of work sizes and SM counts: GEMM
// phases by tokens, attention phases by KV tokens read (nano_attention_reads).
struct PhaseProfile {
  std::vector<double> work;     // ascending, > 0
  std::vector<int32_t> sms;     // ascending, >= 1
  std::vector<double> seconds;  // [work][sms], row-major; finite, >= 0

  // Throws blend::Error naming `what` unless the grid is well formed.
  void check(const char* what) const;
  // Linear between measured points in both directions; SM counts outside the grid take the
  // nearest measured count; work past the last point extends the last two points' line, and
  // work below the first takes the first point's time (a phase's floor); with a single work
  // size, time grows in proportion past it.
  double seconds_at(double work, int32_t sm_count) const;
};

struct NanoProfile {
  int32_t total_sms = 0;  // the GPU's multiprocessors
  int32_t layers = 0;
  double prefill_kv_tile = 64;  // as NanoCost::prefill_kv_tile
  // The GEMM phases' SM counts a split can give are the multiples of sm_step (green contexts
  // split at the GPU's SM alignment, sm_partition.h); the attention gets the rest.
  int32_t sm_step = 1;
  PhaseProfile gemm, attention;

  void check() const;
};

// The critical path of the pipeline above through `layers` layers, for phases of the given
// per-layer seconds (GEMM phases: layers + 1 of them per lane; attentions: layers). Also the
// path's GEMM and attention seconds, which the search reads to choose whom to give SMs.
struct CriticalPath {
  double seconds = 0;
  double gemm_seconds = 0;
  double attention_seconds = 0;
};
CriticalPath nano_critical_path(double gx, double ax, double gy, double ay, int32_t layers);

struct NanoPlan {
  int32_t cut = 0;            // chunks [0, cut) are X; 0 = run the step whole
  int32_t gemm_sms = 0;       // the GEMM phases' SM limit (0 when not cut)
  int32_t attention_sms = 0;  // the attention phases' SM limit (0 when not cut)
  double seconds = 0;         // the plan's predicted step time
  double sequential_s = 0;    // the step run whole on every SM
  int32_t moves = 0;          // SM moves the greedy search accepted for the chosen cut
};

// The greedy SM split for one cut: X and Y's tokens and attention reads. The GEMM phases'
// SM counts it tries are the multiples of `step` that leave the attention an SM, from the one
// nearest half the SMs.
NanoPlan search_sm_split(const NanoProfile& profile, double x_tokens, double x_reads,
                         double y_tokens, double y_reads, int32_t step);

// §5.5 over the cuts of `chunks`: the shortest plan, cut only where it takes at most
// `min_ratio` of the whole step. `step`: SMs moved at a time (>= 1). The cuts tried are every
// one between a decode and a longer chunk and `max_even_cuts` more spread evenly over the
// chunks: a step runs its search on the host before every launch (about 1.6 us a cut for
// a 32-layer model; bench/gpu/nano_search_bench), and neighbouring cuts among alike chunks give
// nearly equal plans.
NanoPlan autosearch(std::span<const ChunkWork> chunks, const NanoProfile& profile, int32_t step = 4,
                    double min_ratio = 0.95, int32_t max_even_cuts = 64);

// How the backend runs one step (CudaBackendImpl::compute_logits): whole (cut 0), or as two
// nano-batches cut at `cut`, with the GEMM phases on a green split of `green_gemm_sms` SMs
// (0: no green split, every kernel may use every SM).
struct NanoStepPlan {
  int32_t cut = 0;
  int32_t green_gemm_sms = 0;
};
// With a measured profile, autosearch's plan at the profile's SM step; without, the cost
// model's cut (choose_nano_split) and the fixed split `fixed_green_sms` (0: none). `always`
// cuts wherever the step has two chunks (BLEND_CUDA_NANO_BATCHES=always, for tests).
NanoStepPlan plan_nano_step(std::span<const ChunkWork> chunks, const NanoProfile* profile,
                            const NanoCost& cost, int32_t fixed_green_sms, bool always);

// The profile's file form (what `blend profile --backend cuda --nano FILE` writes and
// BLEND_CUDA_NANO_PROFILE reads): {"total_sms", "layers", "prefill_kv_tile", "sm_step",
// "gemm": {"work", "sms", "seconds"}, "attention": {...}}. from_json checks it (blend::Error).
nlohmann::json nano_profile_to_json(const NanoProfile& profile);
NanoProfile nano_profile_from_json(const nlohmann::json& j);
// The profile in file `path`, refused (blend::Error naming the file) unless it is one of a GPU
// with `total_sms` SMs and a model of `layers` layers: a profile of another GPU or model would
// plan steps from times that are not this one's.
NanoProfile load_nano_profile(const std::string& path, int32_t total_sms, int32_t layers);

// What `blend profile --backend cuda --nano` times (the backend: CudaBackend::
// measure_nano_profile): one layer's GEMM phase of each `gemm_tokens` (one prompt chunk) and
// one layer's attention of `decode_sequences` decodes at `decode_context` cached tokens each,
// on the GEMM group of a green split at each of `gemm_sms` and on the attention group (the
// rest), and both on the whole GPU. A NanoGrid as made holds every size; nano_profile_grid
// keeps the decode sizes the KV cache holds.
struct NanoGrid {
  std::vector<int32_t> gemm_sms;
  std::vector<int32_t> gemm_tokens = {16, 64, 256, 512, 1024, 2048, 4096};
  std::vector<int32_t> decode_sequences = {4, 16, 64, 256, 1024};
  int32_t decode_context = 1024;
  // KV pages the timed batches use at once (each sequence its own, as in a real step: shared
  // pages would be read from L2), at `page_size` tokens a page.
  int64_t pages_needed(int32_t page_size) const;
};
// The grid for a GPU of `total_sms` SMs split at multiples of `sm_step`, whose KV cache holds
// `kv_tokens` tokens: every split the search may choose, every GEMM size, and the decode sizes
// the cache holds (at least two; else blend::Error saying how many tokens it needs).
NanoGrid nano_profile_grid(int32_t total_sms, int32_t sm_step, int64_t kv_tokens,
                           int32_t page_size);

}  // namespace blend::cuda
