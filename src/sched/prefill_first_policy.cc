#include <algorithm>

#include "sched/policy.h"

namespace blend {
namespace {

// vLLM's default scheduler before chunked prefill (vLLM <= 0.6, `_schedule_default`; the vLLM
// BROS §7.1 compares with): a prompt waiting to start takes the step, decodes wait. Prompts are
// admitted whole in arrival order while the step's token budget and the free pages allow, with
// no prediction of later growth (vLLM's `can_allocate`, less a 1% watermark of pages); when
// pages run out during decoding the newest sequence is preempted and recomputed. A prompt longer
// than the budget (vLLM refuses those) runs alone, in chunks over consecutive steps.
class PrefillFirstPolicy : public SchedulingPolicy {
 public:
  void schedule(SchedulerCore& core, StepPlan& plan, int32_t& budget, double) override {
    std::vector<Sequence*>& running = core.running();
    std::deque<Sequence*>& waiting = core.waiting();
    const PagePool& pool = core.kv().pool();
    const int64_t watermark = pool.num_pages() / 100;
    // A prompt chunked over steps continues first; a decode has exactly one token to compute.
    for (size_t i = 0; i < running.size() && budget > 0;) {
      Sequence* seq = running[i];
      if (seq->num_uncomputed() <= 1) {
        ++i;
        continue;
      }
      const int32_t n = std::min(seq->num_uncomputed(), budget);
      if (!core.grow(seq, n, plan)) break;  // the decode step below preempts to make room
      plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
      budget -= n;
      ++i;
    }
    for (size_t i = 0; budget > 0 && i < waiting.size() && !core.running_set_full();) {
      Sequence* seq = waiting[i];
      if (seq->generation_complete()) {
        ++i;
        continue;
      }
      const bool alone = plan.chunks.empty();
      if (!alone && seq->num_uncomputed() > budget) break;  // whole prompts only
      if (!alone && pool.num_available() - pool.pages_for(seq->num_uncomputed()) < watermark) break;
      int32_t n = budget;
      const SchedulerCore::Admission a = core.admit(seq, n, plan, running.empty());
      if (a == SchedulerCore::Admission::kNoRoom) break;
      if (a == SchedulerCore::Admission::kWaitsForPrefix) {
        ++i;
        continue;
      }
      plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
      budget -= n;
    }
    if (!plan.chunks.empty()) return;
    schedule_fcfs(
        core, plan, budget, [](const Sequence&) { return true; }, /*admit_waiting=*/false);
  }
};

}  // namespace

std::unique_ptr<SchedulingPolicy> make_prefill_first_policy() {
  return std::make_unique<PrefillFirstPolicy>();
}

}  // namespace blend
