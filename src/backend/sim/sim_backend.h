// SimBackend — a backend that does no arithmetic (DESIGN.md §2, backend/sim): each forward pass
// advances a virtual clock by what a cost model says the step takes on the simulated hardware,
// so the same engine loop, scheduler, planner and KV code as a real run can be replayed at a
// scale no machine here could compute (400K requests on an 8B model on an A100, say).
//
// The step's cost is a function of the batch's shapes; KV pages are ids only: nothing is stored.
// What the simulated model "samples" comes from SimTokenSource: a filler token every step, and
// EOS once a sequence reaches the output length its workload hides from the planner and the
// scheduler (BlendServe §5.1: an unknown length stays unknown until it happens).
#pragma once

#include <functional>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace blend {

// What one step costs, split the way the cost model reasons (DESIGN.md §3); `total` is what the
// clock advances by (the sum or the overlap of the parts, as the caller's model decides).
// `transfer`: KV moved beside the step (BROS checkpoints, restores and swaps over the host link,
// page copies in device memory), which overlaps the step (BROS §4.1: the step lasts the longer
// of the two, so `total` is at least `transfer`).
struct SimStepTime {
  double compute = 0, memory = 0, network = 0, total = 0, transfer = 0;
  // The step's shape, for the step trace: prompt tokens computed, decoding sequences and the
  // KV they read (the cost function fills them; a step's time alone cannot say why it took it).
  int64_t prefill_tokens = 0, decode_tokens = 0, decode_context_tokens = 0;
};

// The step's cost; `device_draws`: every sampled row is a device draw (all_device_draws), which a
// device-sampling backend draws without the host (false for a forward() that wants logits).
using SimStepCost = std::function<SimStepTime(const ForwardBatch&, bool device_draws)>;

struct SimBackendOptions {
  int64_t num_pages = 0;
  int64_t kv_bytes_per_page = 0;  // the simulated model's, for the engine's KV statistics
  bool record_steps = false;      // keep every step's time (for per-step plots)
  // Whether the step costs price a step's parts overlapped (Backend::overlaps_compute_and_memory;
  // offline/planned_run.h's make_sim_backend sets it with the costs).
  bool overlapped = false;
  // What moving KV costs (0: free). A page read or written between host and device (a slot
  // range of one page counts as the page, the unit `blend profile` fits the swap line in), and a
  // page copied within device memory.
  double swap_seconds_per_page = 0;
  double copy_seconds_per_page = 0;
  // Real steps of one shape do not all take the same time. Each step's time is multiplied by
  // exp(sigma z - sigma^2 / 2), z standard normal (a mean-preserving lognormal factor), drawn
  // from `noise_seed`; 0 = the cost model's time exactly.
  double step_noise = 0;
  uint64_t noise_seed = 1;
};

// The simulated model's tokens. Sequences without a hidden length get the filler token until
// max_tokens ends them; one with a hidden length d gets EOS as its d-th output token.
class SimTokenSource {
 public:
  // Token the simulator "samples" (out of any real vocabulary: nothing reads it).
  static constexpr TokenId kFiller = -1;
  explicit SimTokenSource(TokenId eos) : eos_(eos) {}
  void set_output_length(SeqId seq, int32_t tokens) { hidden_[seq] = tokens; }
  // Output index `step` of `seq`; forgets the sequence once it has had its EOS.
  TokenId next(SeqId seq, int64_t step);

 private:
  TokenId eos_;
  std::unordered_map<SeqId, int32_t> hidden_;
};

class SimBackend : public Backend {
 public:
  SimBackend(const ModelConfig& config, SimBackendOptions options, SimStepCost cost);

  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "sim"; }
  bool overlaps_compute_and_memory() const override { return options_.overlapped; }
  // Nothing is computed: the simulated model's dtype, the one its step costs price.
  DType compute_dtype() const override { return config_.dtype; }
  int64_t kv_bytes_per_page() const override { return options_.kv_bytes_per_page; }
  int64_t num_pages() const override { return options_.num_pages; }
  void allocate_kv(int64_t num_pages) override;
  void forward(const ForwardBatch& batch, std::span<float> logits) override;
  void launch(StepInput step) override;
  std::vector<SampledToken> wait() override;
  // Nothing is stored; each move is charged to the next step (SimBackendOptions).
  void copy_page(PageId, PageId) override { ++pending_copies_; }
  int64_t kv_page_buffer_bytes() const override { return 0; }
  void read_pages(std::span<const PageId> pages, std::byte*) const override {
    pending_swaps_ += static_cast<int64_t>(pages.size());
  }
  void write_pages(std::span<const PageId> pages, const std::byte*) override {
    pending_swaps_ += static_cast<int64_t>(pages.size());
  }
  void read_slots(PageId, int32_t, int32_t, std::byte*) const override { ++pending_swaps_; }
  void write_slots(PageId, int32_t, int32_t, const std::byte*) override { ++pending_swaps_; }
  double clock_seconds() const override { return clock_; }
  SimTokenSource& tokens() { return tokens_; }

  // Sums over the steps so far, and each step when recorded.
  const SimStepTime& totals() const { return totals_; }
  const std::vector<SimStepTime>& steps() const { return steps_; }
  // Moves the clock forward without work (idle time until the next arrival, say).
  void advance_to(double seconds) { clock_ = std::max(clock_, seconds); }

 private:
  void step(const ForwardBatch& batch, bool device_draws);

  ModelConfig config_;
  SimBackendOptions options_;
  SimStepCost cost_;
  double clock_ = 0;
  std::mt19937_64 noise_rng_;
  mutable int64_t pending_swaps_ = 0;  // pages moved over the host link since the last step
  int64_t pending_copies_ = 0;         // pages copied in device memory since the last step
  SimTokenSource tokens_;
  std::vector<SampledToken> sampled_;
  SimStepTime totals_;
  std::vector<SimStepTime> steps_;
};

}  // namespace blend
