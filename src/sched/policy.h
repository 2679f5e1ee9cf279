// SchedulingPolicy — who runs in the next step, and how many tokens each computes. A policy
// fills a StepPlan from the SchedulerCore's queues with the core's tools (admit, grow, preempt,
// the peak-memory estimate); it never touches KV pages itself. One file per policy:
//   scheduler.cc             fcfs: arrival order, decodes and prefill chunks in every step
//                            (Sarathi); its pass, schedule_fcfs, is the others' fallback
//   prefill_first_policy.cc  vLLM's scheduler before chunked prefill (BROS §7.1's baseline)
//   round_robin_policy.cc    RT and BE requests take turns, a step each (BROS §7.1 RR)
//   hybrid_scheduling.cc     BROS priority packing (§4.2, sched/hybrid_policy's selection)
// The offline planner (BlendServe) is not a policy here: it orders admissions (plan/
// admission_source adds requests to the engine in plan order) and paces the token budget.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "sched/hybrid_policy.h"
#include "sched/iteration_fit.h"
#include "sched/scheduler.h"

namespace blend {

class SchedulingPolicy {
 public:
  virtual ~SchedulingPolicy() = default;
  // Adds chunks (and the preemptions that make room for them) to `plan`, spending `budget`
  // tokens at most. `now` is the engine's clock in seconds (deadlines).
  virtual void schedule(SchedulerCore& core, StepPlan& plan, int32_t& budget, double now) = 0;

  // Feedback from the engine, for policies that model step times (the hybrid one).
  virtual void observe_iteration(double /*seconds*/) {}
  virtual bool fits_iteration_cost() const { return false; }
  virtual void observe_step_cost(const IterationSample& /*sample*/) {}
  // The iteration model in use; null for policies without one.
  virtual const IterationCostModel* iteration_cost() const { return nullptr; }
};

std::unique_ptr<SchedulingPolicy> make_fcfs_policy();
std::unique_ptr<SchedulingPolicy> make_prefill_first_policy();
std::unique_ptr<SchedulingPolicy> make_round_robin_policy();
std::unique_ptr<SchedulingPolicy> make_hybrid_policy(const SchedulerOptions& options);
// The policy `options.policy` names.
std::unique_ptr<SchedulingPolicy> make_scheduling_policy(const SchedulerOptions& options);

// The FCFS pass over the sequences `eligible` accepts: running sequences first (oldest first;
// when pages run out the newest running sequence is preempted), then waiting ones admitted in
// order while the budget, the running-set limit and the predicted peak memory allow. With
// `admit_waiting` false only the running sequences are scheduled. The other policies fall back
// on it.
void schedule_fcfs(SchedulerCore& core, StepPlan& plan, int32_t& budget,
                   const std::function<bool(const Sequence&)>& eligible, bool admit_waiting = true);

}  // namespace blend
