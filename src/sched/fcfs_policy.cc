#include <algorithm>

#include "sched/policy.h"

namespace blend {

void schedule_fcfs(SchedulerCore& core, StepPlan& plan, int32_t& budget,
                   const std::function<bool(const Sequence&)>& eligible, bool admit_waiting) {
  std::vector<Sequence*>& running = core.running();
  std::deque<Sequence*>& waiting = core.waiting();
  const bool bidirectional = core.kv().bidirectional() != nullptr;
  // 1. Running sequences, oldest first. When pages run out, the newest running sequence is
  //    preempted; it has not been scheduled yet in this step (or is the one asking).
  for (size_t i = 0; i < running.size() && budget > 0;) {
    Sequence* seq = running[i];
    if (!eligible(*seq) || seq->generation_complete()) {
      ++i;
      continue;
    }
    const int32_t n = std::min(seq->num_uncomputed(), budget);
    bool scheduled = true;
    while (!core.grow(seq, n, plan)) {
      // The newest sequence not scheduled yet; with bidirectional KV (BROS §5.2's drop
      // order) a real-time one takes the newest best-effort one first.
      Sequence* victim = running.back();
      if (bidirectional && seq->request_class == RequestClass::kRealtime)
        for (size_t v = running.size(); v-- > i + 1;)
          if (running[v]->request_class == RequestClass::kBestEffort) {
            victim = running[v];
            break;
          }
      core.preempt(victim, plan);
      if (victim == seq) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) continue;  // seq was removed; running[i] is the next one
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
    ++i;
  }

  // 2. Admit waiting sequences while the budget, the running-set limit and the predicted peak
  //    memory allow. Nothing new is admitted in a step that had to preempt.
  //    A sequence waiting for another's prefix pages is passed over, keeping its place.
  for (size_t i = 0; admit_waiting && plan.preempted.empty() && budget > 0 && i < waiting.size() &&
                     !core.running_set_full();) {
    Sequence* seq = waiting[i];
    if (!eligible(*seq) || seq->generation_complete()) {
      ++i;
      continue;
    }
    if (!running.empty() && !core.fits_peak_memory(*seq)) break;
    int32_t n = budget;
    const bool alone = running.empty();
    const SchedulerCore::Admission a = core.admit(seq, n, plan, alone);
    if (a == SchedulerCore::Admission::kNoRoom) break;
    if (a == SchedulerCore::Admission::kWaitsForPrefix) {  // another is computing its prefix
      ++i;
      continue;
    }
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
  }
}

namespace {

class FcfsPolicy : public SchedulingPolicy {
 public:
  void schedule(SchedulerCore& core, StepPlan& plan, int32_t& budget, double) override {
    schedule_fcfs(core, plan, budget, [](const Sequence&) { return true; });
  }
};

}  // namespace

std::unique_ptr<SchedulingPolicy> make_fcfs_policy() {
  return std::make_unique<FcfsPolicy>();
}

}  // namespace blend
