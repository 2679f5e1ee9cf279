#include "offline/planned_run.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <unordered_map>

#include "core/error.h"
#include "plan/admission.h"

namespace blend {

SimStepCost simulate_step_cost(const CostModel& cost, Overlap overlap) {
  return [&cost, overlap](const ForwardBatch& batch) {
    const StepCost s = cost.estimate_step(step_shape(batch));
    SimStepTime t;
    t.compute = s.compute_seconds;
    t.memory = s.memory_seconds;
    t.network = s.network_seconds;
    t.total = overlap == Overlap::kOverlapped ? s.overlapped() : s.sequential();
    return t;
  };
}

namespace {

// Picks round(p x n) of the n requests with unknown output lengths (at least one when p > 0),
// reproducibly from `seed`.
std::vector<char> choose_samples(const std::vector<OfflineRequest>& requests,
                                 const SamplingOptions& sampling) {
  std::vector<char> chosen(requests.size(), 0);
  if (sampling.fraction <= 0) return chosen;
  std::vector<size_t> unknown;
  for (size_t i = 0; i < requests.size(); ++i)
    if (!requests[i].output_known) unknown.push_back(i);
  if (unknown.empty()) return chosen;
  const auto want = std::clamp<size_t>(
      static_cast<size_t>(std::llround(sampling.fraction * static_cast<double>(unknown.size()))), 1,
      unknown.size());
  std::mt19937_64 rng(sampling.seed);
  std::shuffle(unknown.begin(), unknown.end(), rng);
  for (size_t k = 0; k < want; ++k) chosen[unknown[k]] = 1;
  return chosen;
}

// Offline requests are best-effort work.
GenerationRequest generation_request(const OfflineRequest& q) {
  GenerationRequest r;
  r.id = q.id;
  r.prompt = q.prompt;
  r.params = q.params;
  r.request_class = RequestClass::kBestEffort;
  return r;
}

// Submits `q`; a hidden length goes to the simulator's token source, which alone knows it.
template <typename OnDone, typename OnToken>
void submit(Engine& engine, const OfflineRequest& q, SimTokenSource* sim_tokens, OnDone on_done,
            OnToken on_token) {
  if (q.simulated_output_tokens && !sim_tokens)
    throw Error("request " + q.id + " has a simulated output length but no simulator runs it");
  const SeqId id = engine.submit(generation_request(q), std::move(on_done), std::move(on_token));
  if (q.simulated_output_tokens) sim_tokens->set_output_length(id, *q.simulated_output_tokens);
}

}  // namespace

PlannedRunStats run_planned(Engine& engine, const std::vector<OfflineRequest>& all_requests,
                            plan::Policy policy, const CostModel& cost, double kv_memory_bytes,
                            const std::function<void(GenerationResult&&)>& on_result,
                            const SamplingOptions& sampling, bool capacity_pacing,
                            SimTokenSource* sim_tokens) {
  if (all_requests.empty()) throw Error("no requests to run");
  const double t_start = engine.clock_seconds();
  const EngineStats at_start = engine.stats();
  std::vector<plan::PlanRequest> plan_requests;
  plan_requests.reserve(all_requests.size());
  std::unordered_map<std::string, int32_t> index_of;
  for (size_t i = 0; i < all_requests.size(); ++i) {
    plan_requests.push_back({all_requests[i].id, all_requests[i].prompt,
                             all_requests[i].output_estimate, all_requests[i].output_known});
    if (!index_of.emplace(all_requests[i].id, static_cast<int32_t>(i)).second)
      throw Error("duplicate request id " + all_requests[i].id);
  }

  // §5.1 sampling pass: run the sampled requests to completion first, then estimate the others'
  // output lengths over the prefix tree of all requests.
  const std::vector<char> sampled = choose_samples(all_requests, sampling);
  std::vector<OfflineRequest> requests;  // what the plan covers: everything not sampled
  int64_t num_sampled = 0;
  std::optional<double> sharing_optimal;  // s_o of all requests, sampled ones included
  if (std::find(sampled.begin(), sampled.end(), 1) != sampled.end()) {
    std::vector<std::optional<double>> lengths(all_requests.size());
    for (size_t i = 0; i < all_requests.size(); ++i) {
      if (!sampled[i]) continue;
      const OfflineRequest& q = all_requests[i];
      ++num_sampled;
      submit(
          engine, q, sim_tokens,
          [&, i](GenerationResult&& g) {
            lengths[i] = static_cast<double>(g.tokens.size());
            if (on_result) on_result(std::move(g));
          },
          Engine::TokenCallback{});
    }
    engine.run_until_done();
    double fallback = 0;
    for (size_t i = 0; i < all_requests.size(); ++i) fallback += lengths[i].value_or(0);
    fallback /= static_cast<double>(num_sampled);
    const plan::PrefixTree all_tree(plan_requests);
    sharing_optimal = all_tree.optimal_sharing_ratio();
    const std::vector<plan::OutputEstimate> estimate =
        plan::estimate_output_lengths(all_tree, lengths, fallback);
    std::vector<plan::PlanRequest> rest;
    for (size_t i = 0; i < all_requests.size(); ++i) {
      if (sampled[i]) continue;
      OfflineRequest q = all_requests[i];
      double spread = 0;
      if (!q.output_known) {
        q.output_estimate = std::min<double>(estimate[i].tokens, q.params.max_tokens);
        spread = estimate[i].spread;
      }
      rest.push_back({q.id, q.prompt, q.output_estimate, q.output_known, spread});
      requests.push_back(std::move(q));
    }
    plan_requests = std::move(rest);
    index_of.clear();
    for (size_t i = 0; i < requests.size(); ++i)
      index_of.emplace(requests[i].id, static_cast<int32_t>(i));
  } else {
    requests = all_requests;
  }
  const double sampling_seconds = engine.clock_seconds() - t_start;

  PlannedRunStats st;
  st.sampled_requests = num_sampled;
  st.sampling_seconds = sampling_seconds;
  if (requests.empty()) {  // everything was sampled
    const EngineStats after = engine.stats();
    st.policy = plan::policy_name(policy);
    st.requests = static_cast<int64_t>(all_requests.size());
    st.prompt_tokens = after.prompt_tokens - at_start.prompt_tokens;
    st.output_tokens = after.output_tokens - at_start.output_tokens;
    st.steps = after.steps - at_start.steps;
    st.seconds = engine.clock_seconds() - t_start;
    st.sharing_optimal = sharing_optimal.value_or(0);
    return st;
  }
  plan::PrefixTree tree(plan_requests);
  plan::PlanOptions options;
  options.policy = policy;
  const plan::Plan plan = plan::make_plan(tree, cost, options);
  std::unique_ptr<plan::AdmissionStream> stream;
  const int32_t engine_step_tokens = engine.max_batch_tokens();
  if (policy == plan::Policy::kBlend)
    stream = std::make_unique<plan::DualScanner>(
        plan, plan_requests, cost, kv_memory_bytes, 128,
        plan::PacingOptions{.enabled = capacity_pacing, .max_step_tokens = engine_step_tokens});
  else
    stream = std::make_unique<plan::OrderedStream>(plan, plan_requests, cost, kv_memory_bytes);

  st.policy = plan::policy_name(policy);
  st.sharing_optimal = sharing_optimal.value_or(plan.optimal_sharing_ratio);
  st.root_density = plan.root_density;
  st.compute_seconds = plan.root.compute_seconds;
  st.memory_seconds = plan.root.memory_seconds;
  const EngineStats before = at_start;
  const double t0 = t_start;
  std::vector<int32_t> finished;
  std::vector<double> generated(requests.size(), 0);  // tokens each request has produced
  int64_t in_flight = 0;
  for (int64_t step = 0; !stream->exhausted() || engine.has_work(); ++step) {
    stream->on_step(step);
    engine.set_max_batch_tokens(stream->step_token_budget().value_or(engine_step_tokens));
    while (auto r = stream->next()) {
      const OfflineRequest& q = requests[static_cast<size_t>(*r)];
      submit(
          engine, q, sim_tokens,
          [&](GenerationResult&& g) {
            finished.push_back(index_of.at(g.id));
            if (on_result) on_result(std::move(g));
          },
          [&stream, &generated, r = *r](const SampledToken&, std::string_view) {
            stream->on_progress(r, ++generated[static_cast<size_t>(r)]);
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
  engine.set_max_batch_tokens(engine_step_tokens);
  const EngineStats after = engine.stats();
  st.requests = static_cast<int64_t>(all_requests.size());
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
