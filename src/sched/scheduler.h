// Scheduler — once per iteration decides which sequences run and how many of their tokens
// (continuous batching with chunked prefill, Orca / Sarathi / NanoFlow §4.2): running
// sequences first (decodes take one token each; a partly prefilled prompt continues), then
// waiting sequences are admitted in the policy's order while the token budget and the KV pages
// allow. Admission uses NanoFlow's peak-memory estimation (§4.4) so that admitted sequences
// are unlikely to run out of pages later; when they do anyway, the newest running sequence is
// preempted (its pages freed, recomputed later) — never dropped.
//
// Split three ways (issue 24): this engine-facing object; the SchedulerCore (sched/
// scheduler_core.h: queues, admission, preemption, peak memory) with the KvManager (kv/
// kv_manager.h: every page mechanic below); and one SchedulingPolicy per --policy
// (sched/policy.h).
//
// With a RadixCache (prefix caching on), a sequence starts from the longest cached prefix of its
// tokens: the shared pages join its block table, a partly matching last page is copied
// (StepPlan::copies), and only the rest is prefilled. A waiting sequence whose next page another
// running sequence is computing waits for it (intra-batch sharing, BlendServe A.2) while the
// sequences behind it may be admitted. Computed pages enter the cache after every step, so a
// preempted sequence usually finds most of its own KV there when it resumes.
//
// With the bidirectional KV layout (BROS §5, kv/bidirectional_pages), a sequence that finds no
// free page may share one with a sequence of the other class: a BE sequence takes the empty
// end of an RT sequence's last page, an RT sequence takes a BE sequence's page. When an RT
// sequence is about to overwrite its BE peer's slots, those slots are checkpointed to host
// memory (StepPlan::checkpoints) and the BE sequence restores the page before it runs again
// (StepPlan::restores); a BE sequence about to overwrite its RT peer moves to a page of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/sequence.h"
#include "kv/bidirectional_pages.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"
#include "sched/hybrid_policy.h"
#include "sched/iteration_fit.h"
#include "sched/policy.h"
#include "sched/scheduler_core.h"

namespace blend {

class Scheduler {
 public:
  // `cache` may be null (prefix caching off); it must outlive the scheduler.
  Scheduler(PagePool& pool, SchedulerOptions options, RadixCache* cache = nullptr);

  void add(Sequence* seq) { core_.add(seq); }  // joins the waiting queue (FCFS order of arrival)
  // `now` (seconds, the engine's clock) drives the hybrid policy's deadlines.
  StepPlan schedule(double now = 0);
  // The measured duration of the step just run (the hybrid policy's moving average).
  void observe_iteration(double seconds) { policy_->observe_iteration(seconds); }
  // The step just run, measured, for the online fit (only wanted with `fit_iteration_cost`).
  bool fits_iteration_cost() const { return policy_->fits_iteration_cost(); }
  void observe_step_cost(const IterationSample& sample) { policy_->observe_step_cost(sample); }
  // The hybrid policy's iteration model (profiled, derived from a cost model, or fitted); the
  // configured one for other policies.
  const IterationCostModel& iteration_cost() const;
  // The backend computed the plan: advances each chunk's num_computed and offers the computed
  // pages to the prefix cache.
  void step_done(const StepPlan& plan) { core_.step_done(plan); }
  // The engine appended a sampled token to seq->tokens (nothing to do) or finished it
  // (running, or waiting when preempted while its last step computed):
  void finish(Sequence* seq) { core_.finish(seq); }
  // Drops a sequence wherever it is (waiting or running) and frees its pages at once; it does
  // not count as finished (a cancelled request says nothing about output lengths).
  void abort(Sequence* seq) { core_.abort(seq); }

  // The token budget of the coming steps (an offline planner may pace it, BlendServe A.2).
  int32_t max_batch_tokens() const { return core_.options().max_batch_tokens; }
  void set_max_batch_tokens(int32_t tokens) { core_.set_max_batch_tokens(tokens); }

  bool has_work() const { return !core_.running().empty() || !core_.waiting().empty(); }
  size_t num_running() const { return core_.running().size(); }
  size_t num_waiting() const { return core_.waiting().size(); }
  int64_t num_preemptions() const { return core_.num_preemptions(); }
  // Prompt tokens served from the prefix cache at first admission (the sharing ratio's
  // numerator), and tokens a resumed sequence found in the cache instead of recomputing them.
  int64_t cached_prompt_tokens() const { return core_.cached_prompt_tokens(); }
  int64_t resumed_cached_tokens() const { return core_.resumed_cached_tokens(); }
  // Bidirectional KV (null when off) and what it did: pages restored after a checkpoint, and
  // pages a BE sequence moved off because its RT peer needed the slots.
  const BidirectionalPages* bidirectional() const { return core_.kv().bidirectional(); }
  int64_t restored_pages() const { return core_.kv().restored_pages(); }
  int64_t moved_pages() const { return core_.kv().moved_pages(); }
  void check_invariants() const { core_.kv().check_invariants(); }

 private:
  SchedulerCore core_;
  std::unique_ptr<SchedulingPolicy> policy_;
};

}  // namespace blend
