// Scheduler — once per iteration decides which sequences run and how many of their tokens
// (continuous batching with chunked prefill, Orca / Sarathi / NanoFlow §4.2): running
// sequences first (decodes take one token each; a partly prefilled prompt continues), then
// waiting sequences are admitted in the policy's order while the token budget and the KV pages
// allow. Admission uses NanoFlow's peak-memory estimation (§4.4) so that admitted sequences
// are unlikely to run out of pages later; when they do anyway, the newest running sequence is
// preempted (its pages freed, recomputed later) — never dropped.
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

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "core/sequence.h"
#include "kv/bidirectional_pages.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"
#include "sched/hybrid_policy.h"
#include "sched/iteration_fit.h"

namespace blend {

enum class SchedulerPolicy {
  kFcfs,  // one queue in arrival order, decodes and prefill chunks in every step (Sarathi)
  // One queue in arrival order; whole prompts in steps of their own, decodes only when no
  // prompt is admitted; admission by free pages only (vLLM's scheduler before chunked prefill,
  // BROS §7.1's vLLM baseline).
  kPrefillFirst,
  kRoundRobin,  // real-time and best-effort requests take turns, a step each (BROS §7.1 RR)
  kHybrid,      // BROS priority packing (sched/hybrid_policy)
};

struct SchedulerOptions {
  SchedulerPolicy policy = SchedulerPolicy::kFcfs;
  HybridOptions hybrid;
  IterationCostModel iteration_cost;  // for kHybrid
  // kHybrid without a profiled `iteration_cost` (a server started without `--profile`): fit it
  // from the steps the engine reports (observe_step_cost), refitted every few steps.
  bool fit_iteration_cost = false;
  int32_t max_batch_tokens = 1024;  // token budget of one step (prefill chunks + decodes)
  int32_t max_running = 256;        // sequences in the running set at once
  // Expected output length used by peak-memory admission before any request has finished
  // (capped by each request's max_tokens); afterwards the mean of finished requests is used.
  int32_t initial_output_estimate = 256;
  // A request that ignores EOS and has no stop condition runs to max_tokens: admission counts
  // exactly that many (off: it is estimated like any other, as tests that force preemption want).
  bool exact_known_lengths = true;
  // BROS bidirectional KV pages (§5); `kv_page_bytes` sizes the checkpoint images.
  bool bidirectional_kv = false;
  int64_t kv_page_bytes = 0;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;
  bool samples = false;  // the chunk reaches the end of the sequence's tokens: sample next
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> preempted;  // moved back to waiting in this step
  // Run before the forward pass, in this order:
  // 1. BROS lazy checkpointing: copy `count` slots from `first` of `page` into the image.
  struct SlotCopy {
    PageId page;
    int32_t first, count;
    std::shared_ptr<SlotCheckpoint> image;
  };
  std::vector<SlotCopy> checkpoints;
  // 2. Copy page `first` into `second`, then release `first` (the plan holds a reference on
  //    it): copy-on-write of partly matched cached pages, and BE pages restored or moved off a
  //    shared page. A `second` of -1 only releases `first` (its destination was dropped).
  std::vector<std::pair<PageId, PageId>> copies;
  // 3. Write a restored page's checkpointed slots back (every slot the image marks saved).
  std::vector<std::pair<PageId, std::shared_ptr<SlotCheckpoint>>> restores;
  int32_t num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  // `cache` may be null (prefix caching off); it must outlive the scheduler.
  Scheduler(PagePool& pool, SchedulerOptions options, RadixCache* cache = nullptr);

  void add(Sequence* seq);  // joins the waiting queue (FCFS order of arrival)
  // `now` (seconds, the engine's clock) drives the hybrid policy's deadlines.
  StepPlan schedule(double now = 0);
  // The measured duration of the step just run (the hybrid policy's moving average).
  void observe_iteration(double seconds);
  // The step just run, measured, for the online fit (only wanted with `fit_iteration_cost`).
  bool fits_iteration_cost() const { return options_.fit_iteration_cost; }
  void observe_step_cost(const IterationSample& sample);
  // The hybrid policy's iteration model (profiled, derived from a cost model, or fitted).
  const IterationCostModel& iteration_cost() const { return hybrid_.cost(); }
  // The backend computed the plan: advances each chunk's num_computed and offers the computed
  // pages to the prefix cache.
  void step_done(const StepPlan& plan);
  // The engine appended a sampled token to seq->tokens (nothing to do) or finished it
  // (running, or waiting when preempted while its last step computed):
  void finish(Sequence* seq);
  // Drops a sequence wherever it is (waiting or running) and frees its pages at once; it does
  // not count as finished (a cancelled request says nothing about output lengths).
  void abort(Sequence* seq);

  // The token budget of the coming steps (an offline planner may pace it, BlendServe A.2).
  int32_t max_batch_tokens() const { return options_.max_batch_tokens; }
  void set_max_batch_tokens(int32_t tokens) { options_.max_batch_tokens = std::max(1, tokens); }

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Prompt tokens served from the prefix cache at first admission (the sharing ratio's
  // numerator), and tokens a resumed sequence found in the cache instead of recomputing them.
  int64_t cached_prompt_tokens() const { return cached_prompt_tokens_; }
  int64_t resumed_cached_tokens() const { return resumed_cached_tokens_; }
  // Bidirectional KV (null when off) and what it did: pages restored after a checkpoint, and
  // pages a BE sequence moved off because its RT peer needed the slots.
  const BidirectionalPages* bidirectional() const { return bidir_.get(); }
  int64_t restored_pages() const { return restored_pages_; }
  int64_t moved_pages() const { return moved_pages_; }
  void check_invariants() const;

 private:
  // Pages for num_computed + new_tokens (and, with bidirectional KV, the restores, moves and
  // checkpoints that computing them needs).
  bool grow(Sequence* seq, int32_t new_tokens, StepPlan& plan);
  bool allocate(int64_t count, std::vector<PageId>& out);  // evicts idle cached pages if needed
  // Starts a waiting sequence from the cached prefix; false when it must wait for a claimer.
  bool reuse_cached_prefix(Sequence* seq, StepPlan& plan);
  void drop_pages(Sequence* seq);  // back to no KV at all
  // Bidirectional KV (BROS §5.2).
  bool prepare_best_effort(Sequence* seq, int32_t new_tokens, StepPlan& plan);
  bool restore(Sequence* seq, StepPlan& plan);
  bool share_pages(Sequence* seq, int64_t need, int32_t new_tokens, const StepPlan& plan);
  void checkpoint_overwritten(const Sequence* seq, int32_t new_tokens, StepPlan& plan);
  void preempt(Sequence* seq);
  int64_t expected_output(const Sequence& seq) const;
  // With `only_realtime`, the running BE sequences' memory is not counted.
  bool fits_peak_memory(const Sequence& candidate, bool only_realtime = false) const;
  // FCFS over the sequences `eligible` accepts (all of them for kFcfs, one class for RR).
  // With `admit_waiting` false only the running sequences are scheduled.
  template <typename Eligible>
  void schedule_fcfs(StepPlan& plan, int32_t& budget, Eligible eligible, bool admit_waiting = true);
  void schedule_hybrid(StepPlan& plan, int32_t& budget, double now);
  void schedule_prefill_first(StepPlan& plan, int32_t& budget);
  // Admits a waiting sequence with up to n tokens in this step (from its cached prefix when
  // there is one). When admitted, `n` is what it will compute.
  enum class Admission { kAdmitted, kWaitsForPrefix, kNoRoom };
  Admission admit(Sequence* seq, int32_t& n, StepPlan& plan, bool alone);

  PagePool& pool_;
  SchedulerOptions options_;
  RadixCache* cache_;
  std::vector<Sequence*> running_;  // in admission order
  std::deque<Sequence*> waiting_;
  int64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t finished_count_ = 0;
  int64_t finished_output_tokens_ = 0;
  int64_t cached_prompt_tokens_ = 0;
  int64_t resumed_cached_tokens_ = 0;
  HybridPolicy hybrid_;
  IterationFit iteration_fit_;
  int64_t samples_since_fit_ = 0;
  int64_t steps_ = 0;
  std::unique_ptr<BidirectionalPages> bidir_;
  StepPlan* plan_ = nullptr;  // the plan being built, while schedule() runs
  int64_t restored_pages_ = 0;
  int64_t moved_pages_ = 0;
};

}  // namespace blend
