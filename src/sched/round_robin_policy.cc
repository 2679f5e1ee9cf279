#include "sched/policy.h"

namespace blend {
namespace {

// BROS §7.1's round-robin baseline: one class per step, alternating; the other class when
// this one has nothing to run.
class RoundRobinPolicy : public SchedulingPolicy {
 public:
  void schedule(SchedulerCore& core, StepPlan& plan, int32_t& budget, double) override {
    const RequestClass turn =
        steps_++ % 2 == 0 ? RequestClass::kRealtime : RequestClass::kBestEffort;
    schedule_fcfs(core, plan, budget,
                  [turn](const Sequence& s) { return s.request_class == turn; });
    if (plan.empty())
      schedule_fcfs(core, plan, budget,
                    [turn](const Sequence& s) { return s.request_class != turn; });
  }

 private:
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<SchedulingPolicy> make_round_robin_policy() {
  return std::make_unique<RoundRobinPolicy>();
}

}  // namespace blend
