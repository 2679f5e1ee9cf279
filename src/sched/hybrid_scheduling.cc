// The hybrid (BROS) policy's glue: candidates from the scheduler's queues, HybridPolicy's choice
// (sched/hybrid_policy, §4.2), then the chosen ones run like FCFS chunks; an RT request short of
// pages drops BE sequences (§5.2). The iteration model is profiled, derived, or fitted online
// from the steps the engine reports (sched/iteration_fit).
#include <algorithm>

#include "sched/policy.h"

namespace blend {
namespace {

// The adaptive batch grows up to the running set's size (a larger one could never fill) and
// starts no higher.
HybridOptions bounded_by_running_set(const SchedulerOptions& options) {
  HybridOptions h = options.hybrid;
  h.max_batch = std::min(h.max_batch, options.max_running);
  h.initial_batch = std::min(h.initial_batch, h.max_batch);
  return h;
}

class HybridScheduling : public SchedulingPolicy {
 public:
  explicit HybridScheduling(const SchedulerOptions& options)
      : hybrid_(bounded_by_running_set(options), options.iteration_cost),
        fit_iteration_cost_(options.fit_iteration_cost) {}

  void schedule(SchedulerCore& core, StepPlan& plan, int32_t& budget, double now) override {
    schedule_hybrid(core, plan, budget, now);
    // Never an empty step while there is work: out of pages, FCFS preempts to make room.
    if (plan.empty()) schedule_fcfs(core, plan, budget, [](const Sequence&) { return true; });
  }

  void observe_iteration(double seconds) override { hybrid_.observe_iteration(seconds); }
  bool fits_iteration_cost() const override { return fit_iteration_cost_; }
  void observe_step_cost(const IterationSample& sample) override {
    if (!fit_iteration_cost_) return;
    iteration_fit_.add(sample);
    // A refit costs a few small solves over the window: every kRefitSteps steps is plenty for
    // a machine whose speed drifts over seconds.
    constexpr int64_t kRefitSteps = 32;
    if (++samples_since_fit_ >= kRefitSteps && iteration_fit_.ready()) {
      samples_since_fit_ = 0;
      hybrid_.set_cost(iteration_fit_.fit());
    }
  }
  const IterationCostModel* iteration_cost() const override { return &hybrid_.cost(); }

 private:
  void schedule_hybrid(SchedulerCore& core, StepPlan& plan, int32_t& budget, double now);

  HybridPolicy hybrid_;
  bool fit_iteration_cost_;
  IterationFit iteration_fit_;
  int64_t samples_since_fit_ = 0;
};

// BROS §4.2: the hybrid policy picks who runs (RT by deadline, BE by swap cost); those picked
// then run like FCFS chunks. Running sequences not picked keep their KV and wait a step.
void HybridScheduling::schedule_hybrid(SchedulerCore& core, StepPlan& plan, int32_t& budget,
                                       double now) {
  const SchedulerOptions& options = core.options();
  KvManager& kv = core.kv();
  std::vector<Sequence*>& running = core.running();
  const std::deque<Sequence*>& waiting = core.waiting();
  std::vector<Sequence*> rt_seqs, be_seqs;
  std::vector<HybridCandidate> rt, be;
  auto add = [&](Sequence* seq) {
    if (seq->generation_complete()) return;
    HybridCandidate c;
    c.cls = seq->request_class;
    c.prefill = seq->num_uncomputed() > 1 || seq->num_generated() == 0;
    c.first_token = seq->num_generated() == 0;
    c.tokens = std::min(seq->num_uncomputed(), options.max_batch_tokens);
    c.context = seq->num_computed;
    c.pages_needed =
        std::max<int64_t>(0, kv.pool().pages_for(int64_t{seq->num_computed} + c.tokens) -
                                 static_cast<int64_t>(seq->block_table.size()));
    if (c.cls == RequestClass::kBestEffort)  // pages to restore first (swap cost)
      c.checkpointed_pages = kv.pages_to_restore(*seq);
    if (c.cls == RequestClass::kRealtime) {
      c.deadline = seq->num_generated() == 0 ? seq->arrival_time + seq->ttft_slo
                                             : seq->last_token_time + seq->tpot_slo;
      if (c.first_token) c.ttft_slo = seq->ttft_slo;
      rt.push_back(c);
      rt_seqs.push_back(seq);
    } else {
      be.push_back(c);
      be_seqs.push_back(seq);
    }
  };
  for (Sequence* seq : running) add(seq);
  // Waiting requests are looked at in arrival order, a bounded number of each class per step:
  // BROS keeps RT and BE in queues of their own, so an RT request arriving behind a large BE
  // job must be seen at once (one bound over both let a 1,024-request job hide every RT arrival
  // behind it: 55% TTFT attainment at 1 RT/s on the simulator).
  const size_t look = static_cast<size_t>(options.max_running) * 2;
  size_t rt_seen = 0, be_seen = 0;
  for (size_t i = 0; i < waiting.size() && (rt_seen < look || be_seen < look); ++i) {
    size_t& seen = waiting[i]->request_class == RequestClass::kRealtime ? rt_seen : be_seen;
    if (seen < look) {
      add(waiting[i]);
      ++seen;
    }
  }
  using Preempt = HybridOptions::PreemptBePages;
  const Preempt preempt = options.hybrid.preempt_be_pages;
  const bool count_be_pages =
      preempt == Preempt::kOn || (preempt == Preempt::kAuto && options.drops_swap_out);
  const HybridSelection sel =
      hybrid_.select(rt, be, now, kv.pool().num_available(),
                     count_be_pages ? kv.pages_best_effort_could_yield(running) : 0);
  // An RT request short of KV pages makes room by dropping BE sequences (recompute), those
  // waiting to restore checkpointed pages first (they already lost part of their KV), then
  // the newest (BROS §5.2's drop order: BE before RT).
  auto drop_best_effort = [&]() {
    Sequence* victim = nullptr;
    for (size_t v = running.size(); v-- > 0;) {
      Sequence* s = running[v];
      if (s->request_class != RequestClass::kBestEffort || plan.has(*s)) continue;
      if (victim == nullptr || (kv.needs_restore(*s) && !kv.needs_restore(*victim))) victim = s;
    }
    if (victim == nullptr) return false;
    core.preempt(victim, plan);
    return true;
  };
  auto run = [&](Sequence* seq, int32_t granted) {
    if (budget <= 0) return;
    if (std::find(plan.preempted.begin(), plan.preempted.end(), seq) != plan.preempted.end())
      return;  // dropped in this step to make room
    int32_t n = std::min({seq->num_uncomputed(), budget, granted});
    const bool realtime = seq->request_class == RequestClass::kRealtime;
    if (seq->status == SeqStatus::kWaiting) {
      // Admitted only when the predicted peak memory allows (NanoFlow §4.4, as FCFS does):
      // over-admitted work is preempted and recomputed later (without the check the simulator
      // showed hundreds of preemptions and half the BE throughput). An RT request counts only
      // the RT requests' memory: BE requests give way to it (§5.2).
      if (core.running_set_full() || (!running.empty() && !core.fits_peak_memory(*seq, realtime)))
        return;
      for (int32_t want = n;; n = want) {
        const SchedulerCore::Admission a = core.admit(seq, n, plan, running.empty());
        if (a == SchedulerCore::Admission::kAdmitted) break;
        if (a == SchedulerCore::Admission::kWaitsForPrefix || !realtime || !drop_best_effort())
          return;
      }
    } else {
      while (!core.grow(seq, n, plan))
        if (!realtime || !drop_best_effort()) return;
    }
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
  };
  for (size_t k = 0; k < sel.rt.size(); ++k) run(rt_seqs[sel.rt[k]], sel.rt_tokens[k]);
  for (size_t k = 0; k < sel.be.size(); ++k) run(be_seqs[sel.be[k]], sel.be_tokens[k]);
}

}  // namespace

std::unique_ptr<SchedulingPolicy> make_hybrid_policy(const SchedulerOptions& options) {
  return std::make_unique<HybridScheduling>(options);
}

}  // namespace blend
