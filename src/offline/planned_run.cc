#include "offline/planned_run.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "plan/admission_source.h"

namespace blend {

SimStepCost simulate_step_cost(const CostModel& cost, Overlap overlap) {
  return [&cost, overlap](const ForwardBatch& batch, bool device_draws) {
    StepShape shape = step_shape(batch);
    shape.device_draws = device_draws;
    const StepCost s = cost.estimate_step(shape);
    SimStepTime t;
    t.compute = s.compute_seconds;
    t.memory = s.memory_seconds;
    t.network = s.network_seconds;
    t.total = overlap == Overlap::kOverlapped ? s.overlapped() : s.sequential();
    t.prefill_tokens = shape.prefill_tokens;
    t.decode_tokens = shape.decode_tokens;
    t.decode_context_tokens = shape.decode_context_tokens;
    return t;
  };
}

std::unique_ptr<SimBackend> make_sim_backend(const ModelConfig& config, SimBackendOptions options,
                                             const CostModel& cost, Overlap overlap) {
  options.overlapped = overlap == Overlap::kOverlapped;
  return std::make_unique<SimBackend>(config, options, simulate_step_cost(cost, overlap));
}

PlannedRunStats run_planned(Engine& engine, const std::vector<OfflineRequest>& requests,
                            plan::Policy policy, const CostModel& cost, double kv_memory_bytes,
                            const std::function<void(GenerationResult&&)>& on_result,
                            const SamplingOptions& sampling, const plan::PlannerKnobs& planner,
                            SimTokenSource* sim_tokens) {
  if (requests.empty()) throw Error("no requests to run");
  for (const OfflineRequest& q : requests)
    if (q.simulated_output_tokens && !sim_tokens)
      throw Error("request " + q.request.id +
                  " has a simulated output length but no simulator runs it");
  const double t_start = engine.clock_seconds();
  const EngineStats before = engine.stats();
  const int32_t engine_step_tokens = engine.max_batch_tokens();
  PlannedFeed feed(requests, cost, engine,
                   {.policy = policy,
                    .kv_memory_bytes = kv_memory_bytes,
                    .planner = planner,
                    .max_step_tokens = engine_step_tokens,
                    .sampling = sampling});
  const plan::AdmissionSource& source = feed.source();
  // A hidden length goes to the simulator's token source, which alone knows it.
  const PlannedFeed::Submit submit = [&](int32_t r, GenerationRequest request,
                                         Engine::TokenCallback on_token, PlannedFeed::Ended ended) {
    const auto& simulated = requests[static_cast<size_t>(r)].simulated_output_tokens;
    const SeqId id = engine.submit(
        std::move(request),
        [&on_result, ended = std::move(ended)](GenerationResult&& g) {
          ended(static_cast<double>(g.tokens.size()));
          if (on_result) on_result(std::move(g));
        },
        std::move(on_token));
    if (simulated) sim_tokens->set_output_length(id, *simulated);
  };

  PlannedRunStats st;
  st.policy = plan::policy_name(policy);
  st.sampled_requests = source.sampled_requests();
  if (!source.sampling()) st.sampling_seconds = engine.clock_seconds() - t_start;
  while (!feed.exhausted() || engine.has_work()) {
    const bool was_sampling = source.sampling();
    feed.admit(submit);
    if (was_sampling && !source.sampling()) st.sampling_seconds = engine.clock_seconds() - t_start;
    engine.set_max_batch_tokens(feed.step_token_budget().value_or(engine_step_tokens));
    if (!engine.has_work()) {
      if (feed.stalled())
        throw Error("the admission stream admits nothing although the engine is idle");
    } else {
      engine.step();
    }
    feed.report_ended();
  }
  engine.set_max_batch_tokens(engine_step_tokens);
  if (const plan::Plan* plan = source.plan()) {
    st.root_density = plan->root_density;
    st.compute_seconds = plan->root.compute_seconds;
    st.memory_seconds = plan->root.memory_seconds;
  }
  st.sharing_optimal = source.sharing_optimal();
  const EngineStats after = engine.stats();
  st.requests = static_cast<int64_t>(requests.size());
  st.prompt_tokens = after.prompt_tokens - before.prompt_tokens;
  st.output_tokens = after.output_tokens - before.output_tokens;
  st.steps = after.steps - before.steps;
  st.seconds = engine.clock_seconds() - t_start;
  if (source.plan())  // (a run that was all sampling pass reports no sharing)
    st.sharing_ratio =
        st.prompt_tokens > 0
            ? static_cast<double>(after.cached_prompt_tokens - before.cached_prompt_tokens) /
                  static_cast<double>(st.prompt_tokens)
            : 0;
  return st;
}

std::vector<double> simulate_parts(const std::vector<OfflineRequest>& requests,
                                   const std::vector<std::vector<int32_t>>& parts,
                                   const ModelConfig& config, const EngineOptions& engine,
                                   double kv_memory_bytes, const CostModel& cost,
                                   plan::Policy policy, const plan::PlannerKnobs& planner) {
  const auto page_bytes =
      static_cast<int64_t>(cost.kv_bytes_per_token_per_device()) * engine.page_size;
  if (page_bytes <= 0) throw Error("simulate_parts: the model has no KV bytes per token");
  std::vector<double> seconds;
  for (const std::vector<int32_t>& part : parts) {
    std::vector<OfflineRequest> sub;
    sub.reserve(part.size());
    for (int32_t r : part) {
      OfflineRequest q = requests.at(static_cast<size_t>(r));
      // The estimate is all a re-cut knows of a hidden length: it runs as the known one.
      const auto length =
          std::max<int32_t>(1, static_cast<int32_t>(std::lround(q.output_estimate)));
      q.request.params = SamplingParams{};
      q.request.params.temperature = 0;
      q.request.params.ignore_eos = true;
      q.request.params.max_tokens = length;
      q.output_known = true;
      q.output_estimate = length;
      q.simulated_output_tokens.reset();
      q.request.model = 0;
      sub.push_back(std::move(q));
    }
    if (sub.empty()) {
      seconds.push_back(0);
      continue;
    }
    SimBackendOptions so;
    so.num_pages = static_cast<int64_t>(kv_memory_bytes) / page_bytes;
    so.kv_bytes_per_page = page_bytes;
    EngineOptions eo;
    eo.page_size = engine.page_size;
    eo.prefix_cache = engine.prefix_cache;
    eo.scheduler = engine.scheduler;
    auto backend = make_sim_backend(config, so, cost, Overlap::kSequential);
    SimBackend& sim = *backend;
    Engine replica(std::move(backend), eo);
    seconds.push_back(
        run_planned(replica, sub, policy, cost, kv_memory_bytes, {}, {}, planner, &sim.tokens())
            .seconds);
  }
  return seconds;
}

}  // namespace blend
