#include "offline/planned_run.h"

#include <memory>
#include <unordered_map>

#include "core/error.h"
#include "plan/admission.h"

namespace blend {

SimStepCost simulate_step_cost(const CostModel& cost, Overlap overlap) {
  return [&cost, overlap](const ForwardBatch& batch) {
    StepShape shape;
    shape.logit_rows = 0;
    for (const SeqChunk& c : batch.chunks) {
      shape.logit_rows += c.wants_logits ? 1 : 0;
      if (c.num_tokens == 1 && c.num_cached > 0) {  // a decode token
        ++shape.decode_tokens;
        shape.decode_context_tokens += c.num_cached + 1;
      } else {
        shape.prefill_tokens += c.num_tokens;
        shape.prefill_attention_pairs += int64_t{c.num_tokens} * (c.num_cached + c.num_tokens);
      }
    }
    const StepCost s = cost.estimate_step(shape);
    SimStepTime t;
    t.compute = s.compute_seconds;
    t.memory = s.memory_seconds;
    t.network = s.network_seconds;
    t.total = overlap == Overlap::kOverlapped ? s.overlapped() : s.sequential();
    return t;
  };
}

PlannedRunStats run_planned(Engine& engine, const std::vector<OfflineRequest>& requests,
                            plan::Policy policy, const CostModel& cost, double kv_memory_bytes,
                            const std::function<void(GenerationResult&&)>& on_result) {
  if (requests.empty()) throw Error("no requests to run");
  std::vector<plan::PlanRequest> plan_requests;
  plan_requests.reserve(requests.size());
  std::unordered_map<std::string, int32_t> index_of;
  for (size_t i = 0; i < requests.size(); ++i) {
    plan_requests.push_back({requests[i].id, requests[i].prompt, requests[i].output_estimate,
                             requests[i].output_known});
    if (!index_of.emplace(requests[i].id, static_cast<int32_t>(i)).second)
      throw Error("duplicate request id " + requests[i].id);
  }
  plan::PrefixTree tree(plan_requests);
  plan::PlanOptions options;
  options.policy = policy;
  const plan::Plan plan = plan::make_plan(tree, cost, options);
  std::unique_ptr<plan::AdmissionStream> stream;
  if (policy == plan::Policy::kBlend)
    stream = std::make_unique<plan::DualScanner>(plan, plan_requests, cost, kv_memory_bytes);
  else
    stream = std::make_unique<plan::OrderedStream>(plan, plan_requests, cost, kv_memory_bytes);

  PlannedRunStats st;
  st.policy = plan::policy_name(policy);
  st.sharing_optimal = plan.optimal_sharing_ratio;
  st.root_density = plan.root_density;
  st.compute_seconds = plan.root.compute_seconds;
  st.memory_seconds = plan.root.memory_seconds;
  const EngineStats before = engine.stats();
  const double t0 = engine.clock_seconds();
  std::vector<int32_t> finished;
  int64_t in_flight = 0;
  while (!stream->exhausted() || engine.has_work()) {
    while (auto r = stream->next()) {
      const OfflineRequest& q = requests[static_cast<size_t>(*r)];
      engine.submit({q.id, q.prompt, q.params, RequestClass::kBestEffort, {}, {}},
                    [&](GenerationResult&& g) {
                      finished.push_back(index_of.at(g.id));
                      if (on_result) on_result(std::move(g));
                    });
      ++in_flight;
    }
    if (!engine.has_work()) {
      if (finished.empty() && in_flight == 0 && !stream->exhausted())
        throw Error("the admission stream admits nothing although the engine is idle");
    } else {
      engine.step();
    }
    for (int32_t r : finished) {
      stream->on_finished(r);
      --in_flight;
    }
    finished.clear();
  }
  const EngineStats after = engine.stats();
  st.requests = static_cast<int64_t>(requests.size());
  st.prompt_tokens = after.prompt_tokens - before.prompt_tokens;
  st.output_tokens = after.output_tokens - before.output_tokens;
  st.steps = after.steps - before.steps;
  st.seconds = engine.clock_seconds() - t0;
  st.sharing_ratio =
      st.prompt_tokens > 0
          ? static_cast<double>(after.cached_prompt_tokens - before.cached_prompt_tokens) /
                static_cast<double>(st.prompt_tokens)
          : 0;
  return st;
}

}  // namespace blend
