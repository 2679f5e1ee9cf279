// Scheduler — once per iteration decides which sequences run and how many of their tokens
// (continuous batching with chunked prefill, Orca / Sarathi / NanoFlow §4.2): running
// sequences first (decodes take one token each; a partly prefilled prompt continues), then
// waiting sequences are admitted in the policy's order while the token budget and the KV pages
// allow. Admission uses NanoFlow's peak-memory estimation (§4.4) so that admitted sequences
// are unlikely to run out of pages later; when they do anyway, the newest running sequence is
// preempted (its pages freed, recomputed later) — never dropped.
//
// Split three ways (issue 24): the engine-facing Scheduler (below) is a SchedulerCore plus one
// SchedulingPolicy per --scheduler (sched/policy.h: who runs, in which order); every page
// mechanic below is the KvManager's (kv/kv_manager.h).
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
#include <deque>
#include <memory>
#include <vector>

#include "core/sequence.h"
#include "kv/bidirectional_pages.h"
#include "kv/kv_manager.h"
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
  // NanoFlow §4.2's discrete batching: the dense batch sizes the GEMMs run fastest at (ascending;
  // empty = any size). A step whose work fills at least one of them is cut to the largest that
  // fits under max_batch_tokens and keeps every decode; the prompt tokens past it wait a step
  // (Scheduler::dense_budget).
  std::vector<int32_t> dense_batch_sizes;
  // The same with the sizes every multiple of this (a profile's GEMM row tile,
  // Hardware::dense_row_tile); 0 = only the listed sizes.
  int32_t dense_batch_tile = 0;
  int32_t max_running = 256;  // sequences in the running set at once
  // Expected output length used by peak-memory admission before any request has finished
  // (capped by each request's max_tokens); afterwards the mean of finished requests is used.
  int32_t initial_output_estimate = 256;
  // A request that ignores EOS and has no stop condition runs to max_tokens: admission counts
  // exactly that many (off: it is estimated like any other, as tests that force preemption want).
  bool exact_known_lengths = true;
  // BROS bidirectional KV pages (§5); `kv_page_bytes` sizes the checkpoint images.
  bool bidirectional_kv = false;
  int64_t kv_page_bytes = 0;
  // A preempted sequence's pages go to a host (or disk) tier when the device cache evicts them
  // and come back where that beats recomputing (kv/kv_tiers): dropping one is cheap. The engine
  // sets it from its KV tiers.
  bool drops_swap_out = false;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;
  bool samples = false;  // the chunk reaches the end of the sequence's tokens: sample next
};

// One step: the chunks to compute, the sequences preempted to make room, and the page
// operations (KvStepOps) to run before the forward pass.
struct StepPlan : KvStepOps {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> preempted;  // moved back to waiting in this step
  int32_t num_tokens = 0;
  bool empty() const { return chunks.empty(); }
  bool has(const Sequence& seq) const;  // seq has a chunk in this step
};

// SchedulerCore — what every scheduling policy (sched/policy.h) plans with: the waiting and
// running queues, admission of a waiting sequence (from its cached prefix when there is one),
// growth of a running one, recompute preemption, and NanoFlow §4.4's peak-memory estimate. Page
// mechanics are the KvManager's (kv/kv_manager.h); the core only asks it for room and records
// what a step needs in the StepPlan. The policies decide who runs and in which order; the core
// keeps the queues consistent whatever they decide.
class SchedulerCore {
 public:
  // `cache` may be null (prefix caching off); it must outlive the core.
  SchedulerCore(PagePool& pool, const SchedulerOptions& options, RadixCache* cache);

  const SchedulerOptions& options() const { return options_; }
  void set_max_batch_tokens(int32_t tokens);
  KvManager& kv() { return kv_; }
  const KvManager& kv() const { return kv_; }
  std::vector<Sequence*>& running() { return running_; }  // in admission order
  std::deque<Sequence*>& waiting() { return waiting_; }   // arrival order, preempted first
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  bool running_set_full() const {
    return running_.size() >= static_cast<size_t>(options_.max_running);
  }

  void add(Sequence* seq);  // joins the waiting queue (FCFS order of arrival)
  // Pages for seq->num_computed + new_tokens (see KvManager::grow); false when there is no room.
  bool grow(Sequence* seq, int32_t new_tokens, StepPlan& plan);
  // Admits a waiting sequence with up to n tokens in this step (from its cached prefix when
  // there is one). When admitted, `n` is what it will compute. `alone`: nothing else runs, so
  // it takes what fits now and the rest in later steps.
  enum class Admission { kAdmitted, kWaitsForPrefix, kNoRoom };
  Admission admit(Sequence* seq, int32_t& n, StepPlan& plan, bool alone);
  // Recompute preemption: drops the sequence's KV (what the prefix cache holds of it stays),
  // puts it first in the waiting queue and records it in plan.preempted.
  void preempt(Sequence* seq, StepPlan& plan);
  // NanoFlow §4.4. With `only_realtime`, the running BE sequences' memory is not counted.
  bool fits_peak_memory(const Sequence& candidate, bool only_realtime = false) const;

  // The engine's side (see Scheduler).
  void step_done(const StepPlan& plan);
  void finish(Sequence* seq);
  void abort(Sequence* seq);

  int64_t num_preemptions() const { return num_preemptions_; }
  int64_t cached_prompt_tokens() const { return cached_prompt_tokens_; }
  int64_t resumed_cached_tokens() const { return resumed_cached_tokens_; }

 private:
  int64_t expected_output(const Sequence& seq) const;

  SchedulerOptions options_;
  KvManager kv_;
  std::vector<Sequence*> running_;
  std::deque<Sequence*> waiting_;
  int64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t finished_count_ = 0;
  int64_t finished_output_tokens_ = 0;
  int64_t cached_prompt_tokens_ = 0;
  int64_t resumed_cached_tokens_ = 0;
};

class SchedulingPolicy;  // sched/policy.h

class Scheduler {
 public:
  // `cache` may be null (prefix caching off); it must outlive the scheduler.
  Scheduler(PagePool& pool, SchedulerOptions options, RadixCache* cache = nullptr);
  ~Scheduler();

  void add(Sequence* seq) { core_.add(seq); }  // joins the waiting queue (FCFS order of arrival)
  // `now` (seconds, the engine's clock) drives the hybrid policy's deadlines.
  StepPlan schedule(double now = 0);
  // The coming step's token budget: max_batch_tokens, or with dense_batch_sizes (or the
  // multiples of dense_batch_tile) the largest of them under it that the running and waiting
  // sequences' uncomputed tokens fill and that leaves room for every decode and, when prompts wait,
  // a prompt token (max_batch_tokens when none does). The work is an upper bound (a waiting
  // prompt's cached prefix, admission limits and a policy's choices may leave the step short of
  // it), so discrete batching is a best effort, never a wait for more work.
  int32_t dense_budget() const;
  // The measured duration of the step just run (the hybrid policy's moving average).
  void observe_iteration(double seconds);
  // The step just run, measured, for the online fit (only wanted with `fit_iteration_cost`).
  bool fits_iteration_cost() const;
  void observe_step_cost(const IterationSample& sample);
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
