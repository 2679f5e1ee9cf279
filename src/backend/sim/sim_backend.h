// SimBackend — a backend that does no arithmetic (DESIGN.md §2, backend/sim): each forward pass
// advances a virtual clock by what a cost model says the step takes on the simulated hardware,
// so the same engine loop, scheduler, planner and KV code as a real run can be replayed at a
// scale no machine here could compute (400K requests on an 8B model on an A100, say).
//
// The engine hands a simulated backend only the chunks' shapes (see Backend::simulated()); the
// step's cost is a function of those shapes. KV pages are ids only: nothing is stored.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace blend {

// What one step costs, split the way the cost model reasons (DESIGN.md §3); `total` is what the
// clock advances by (the sum or the overlap of the parts, as the caller's model decides).
struct SimStepTime {
  double compute = 0, memory = 0, network = 0, total = 0;
};

using SimStepCost = std::function<SimStepTime(const ForwardBatch&)>;

struct SimBackendOptions {
  int64_t num_pages = 0;
  int64_t kv_bytes_per_page = 0;  // the simulated model's, for the engine's KV statistics
  bool record_steps = false;      // keep every step's time (for per-step plots)
};

class SimBackend : public Backend {
 public:
  SimBackend(const ModelConfig& config, SimBackendOptions options, SimStepCost cost);

  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "sim"; }
  int64_t kv_bytes_per_page() const override { return options_.kv_bytes_per_page; }
  int64_t num_pages() const override { return options_.num_pages; }
  void forward(const ForwardBatch& batch, std::span<float> logits) override;
  void copy_page(PageId, PageId) override {}
  void read_pages(std::span<const PageId>, std::byte*) const override {}
  void write_pages(std::span<const PageId>, const std::byte*) override {}
  void read_slots(PageId, int32_t, int32_t, std::byte*) const override {}
  void write_slots(PageId, int32_t, int32_t, const std::byte*) override {}
  bool simulated() const override { return true; }
  std::optional<double> virtual_seconds() const override { return clock_; }

  // Sums over the steps so far, and each step when recorded.
  const SimStepTime& totals() const { return totals_; }
  const std::vector<SimStepTime>& steps() const { return steps_; }
  // Moves the clock forward without work (idle time until the next arrival, say).
  void advance_to(double seconds) { clock_ = std::max(clock_, seconds); }

 private:
  ModelConfig config_;
  SimBackendOptions options_;
  SimStepCost cost_;
  double clock_ = 0;
  SimStepTime totals_;
  std::vector<SimStepTime> steps_;
};

}  // namespace blend
