#include "sched/scheduler.h"

namespace blend {

std::unique_ptr<SchedulingPolicy> make_scheduling_policy(const SchedulerOptions& options) {
  switch (options.policy) {
    case SchedulerPolicy::kFcfs:
      return make_fcfs_policy();
    case SchedulerPolicy::kPrefillFirst:
      return make_prefill_first_policy();
    case SchedulerPolicy::kRoundRobin:
      return make_round_robin_policy();
    case SchedulerPolicy::kHybrid:
      return make_hybrid_policy(options);
  }
  return make_fcfs_policy();
}

Scheduler::Scheduler(PagePool& pool, SchedulerOptions options, RadixCache* cache)
    : core_(pool, options, cache), policy_(make_scheduling_policy(options)) {}

const IterationCostModel& Scheduler::iteration_cost() const {
  const IterationCostModel* cost = policy_->iteration_cost();
  return cost ? *cost : core_.options().iteration_cost;
}

StepPlan Scheduler::schedule(double now) {
  StepPlan plan;
  const int32_t budget_start = core_.options().max_batch_tokens;
  int32_t budget = budget_start;
  policy_->schedule(core_, plan, budget, now);
  plan.num_tokens = budget_start - budget;
  return plan;
}

}  // namespace blend
