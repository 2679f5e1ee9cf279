// Offline batch runs in a planner's order (BlendServe §5): the plan's admission stream decides
// which request enters the engine next and when (the dual scanner pacing compute-heavy and
// memory-heavy requests against their KV reservations; or fcfs / dfs / random), and the engine
// does the iteration-level batching (continuous batching, chunked prefill, prefix cache).
// The same driver runs a real backend or the simulator (backend/sim); `simulate_step_cost`
// turns the cost model into the simulator's step time.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/sim/sim_backend.h"
#include "cost/cost_model.h"
#include "engine/engine.h"
#include "offline/planned_feed.h"
#include "plan/planner.h"

namespace blend {

struct PlannedRunStats {
  std::string policy;
  int64_t sampled_requests = 0;  // run in the sampling pass
  double sampling_seconds = 0;   // engine-clock time of that pass (included in `seconds`)
  int64_t requests = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double seconds = 0;  // on the engine's clock (virtual for the simulator)
  int64_t steps = 0;
  double sharing_ratio = 0;    // prompt tokens served from the prefix cache / prompt tokens
  double sharing_optimal = 0;  // s_o of the request set
  double root_density = 0;
  double compute_seconds = 0;  // plan root: sum of Comp(r) before sharing (T_comp)
  double memory_seconds = 0;   // plan root: sum of Mem(r) (T_mem)
  double throughput() const {
    return seconds > 0 ? static_cast<double>(prompt_tokens + output_tokens) / seconds : 0;
  }
};

// Runs every request through `engine`, admitted in `policy`'s plan order and pace against
// `kv_memory_bytes` of KV reservations. `on_result` sees each result as it finishes. With
// `planner.pacing.enabled` (blend only; plan/admission.h: capacity pacing, ours) the dual scanner
// also sets each step's token budget, up to the engine's own; without it the scanner admits by
// the M_L / M_R reservations alone (blend@alg3 is Alg. 3 as published). Requests with a
// simulated_output_tokens need `sim_tokens`, the simulator's token source.
PlannedRunStats run_planned(Engine& engine, const std::vector<OfflineRequest>& requests,
                            plan::Policy policy, const CostModel& cost, double kv_memory_bytes,
                            const std::function<void(GenerationResult&&)>& on_result = {},
                            const SamplingOptions& sampling = {},
                            const plan::PlannerKnobs& planner = {},
                            SimTokenSource* sim_tokens = nullptr);

enum class Overlap { kSequential, kOverlapped };

// Each part's seconds when it runs alone on a simulated replica that `cost` prices, with the
// real engine's page size, step budget and scheduler (`engine`) and `kv_memory_bytes` of KV, its
// steps one after another (as blend's engines run them), admitted in `policy`'s plan: what a
// data-parallel re-cut of `mpirun blend batch --dp-recut` balances (plan::cut_data_parallel).
// `parts` index `requests`; every request runs its output estimate as its known length.
std::vector<double> simulate_parts(const std::vector<OfflineRequest>& requests,
                                   const std::vector<std::vector<int32_t>>& parts,
                                   const ModelConfig& config, const EngineOptions& engine,
                                   double kv_memory_bytes, const CostModel& cost,
                                   plan::Policy policy, const plan::PlannerKnobs& planner = {});

// The simulator's step time from the cost model: compute, memory and network seconds of the
// step's shape, summed (sequential engines) or overlapped (NanoFlow).
SimStepCost simulate_step_cost(const CostModel& cost, Overlap overlap);

// A simulator backend whose steps cost simulate_step_cost(cost, overlap) and that reports the same
// overlap to the planner (SimBackendOptions::overlapped): the two set apart could disagree.
std::unique_ptr<SimBackend> make_sim_backend(const ModelConfig& config, SimBackendOptions options,
                                             const CostModel& cost, Overlap overlap);

}  // namespace blend
