#include "sched/scheduler.h"

#include <algorithm>

#include "sched/policy.h"

namespace blend {

bool StepPlan::has(const Sequence& seq) const {
  return std::any_of(chunks.begin(), chunks.end(),
                     [&seq](const ScheduledChunk& c) { return c.seq == &seq; });
}

SchedulerCore::SchedulerCore(PagePool& pool, const SchedulerOptions& options, RadixCache* cache)
    : options_(options), kv_(pool, cache, options.bidirectional_kv, options.kv_page_bytes) {}

void SchedulerCore::set_max_batch_tokens(int32_t tokens) {
  options_.max_batch_tokens = std::max(1, tokens);
}

void SchedulerCore::add(Sequence* seq) {
  seq->status = SeqStatus::kWaiting;
  seq->arrival = next_arrival_++;
  waiting_.push_back(seq);
}

bool SchedulerCore::grow(Sequence* seq, int32_t new_tokens, StepPlan& plan) {
  const KvManager::Peers peers{running_, [&plan](const Sequence& s) { return plan.has(s); }};
  return kv_.grow(seq, new_tokens, plan, peers);
}

void SchedulerCore::preempt(Sequence* seq, StepPlan& plan) {
  // Recompute preemption (vLLM V1, SGLang): drop the KV, keep the tokens; when the sequence
  // runs again its prompt and generated tokens are prefilled anew, minus what the prefix cache
  // still holds of them.
  kv_.drop(seq, &plan);
  seq->status = SeqStatus::kWaiting;
  ++seq->num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
  plan.preempted.push_back(seq);
}

int64_t SchedulerCore::expected_output(const Sequence& seq) const {
  const SamplingParams& params = seq.params;
  if (options_.exact_known_lengths && params.ignore_eos && params.stop.empty() &&
      params.stop_token_ids.empty())
    return params.max_tokens;
  const int64_t guess = finished_count_ > 0 ? finished_output_tokens_ / finished_count_
                                            : options_.initial_output_estimate;
  const int64_t at_least = seq.num_generated() + 1;
  return std::min<int64_t>(seq.params.max_tokens, std::max(guess, at_least));
}

// NanoFlow §4.4: predict each running sequence's completion from the expected output length and
// admit the candidate only if the highest future page usage still fits. Usage peaks when some
// sequence finishes, so it is enough to evaluate it at each predicted completion step.
bool SchedulerCore::fits_peak_memory(const Sequence& candidate, bool only_realtime) const {
  struct Future {
    int64_t remaining;  // steps until predicted completion
    int64_t tokens;     // tokens now
  };
  std::vector<Future> futures;
  futures.reserve(running_.size() + 1);
  auto add = [&](const Sequence& s) {
    futures.push_back(
        {std::max<int64_t>(0, expected_output(s) - s.num_generated()), s.num_tokens()});
  };
  for (const Sequence* s : running_)
    if (!only_realtime || s->request_class == RequestClass::kRealtime) add(*s);
  add(candidate);
  std::sort(futures.begin(), futures.end(),
            [](const Future& a, const Future& b) { return a.remaining < b.remaining; });
  // At step t = futures[k].remaining, sequences k..n-1 are alive, each holding tokens + t tokens
  // (upper bound in pages: one partly filled page per sequence).
  const PagePool& pool = kv_.pool();
  int64_t suffix_tokens = 0;
  for (size_t k = futures.size(); k-- > 0;) {
    suffix_tokens += futures[k].tokens;
    const int64_t alive = static_cast<int64_t>(futures.size() - k);
    const int64_t tokens = suffix_tokens + alive * futures[k].remaining;
    if (tokens / pool.page_size() + alive > pool.num_pages()) return false;
  }
  return true;
}

SchedulerCore::Admission SchedulerCore::admit(Sequence* seq, int32_t& n, StepPlan& plan,
                                              bool alone) {
  const size_t copies_before = plan.copies.size();
  // A request scoring its prompt (prompt_logprobs) needs every prompt row computed: it takes
  // no cached prefix (vLLM skips reading the cache for them too); what it computes is cached.
  if (kv_.cache() && seq->block_table.empty() && !seq->params.prompt_logprobs &&
      !kv_.reuse_cached_prefix(seq, plan))
    return Admission::kWaitsForPrefix;
  const int32_t cached = seq->num_computed;
  n = std::min(seq->num_uncomputed(), n);
  if (!grow(seq, n, plan)) {
    // Alone in the engine: take what fits now, the rest in later steps.
    const PagePool& pool = kv_.pool();
    if (alone)
      n = static_cast<int32_t>(std::min<int64_t>(
          n, (static_cast<int64_t>(seq->block_table.size()) + pool.num_available()) *
                     pool.page_size() -
                 seq->num_computed));
    if (!alone || n <= 0 || !grow(seq, n, plan)) {
      kv_.undo_copies(plan, copies_before);
      kv_.drop(seq, &plan);
      return Admission::kNoRoom;
    }
  }
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  if (seq->num_preemptions == 0) {
    seq->num_cached_prompt = cached;
    cached_prompt_tokens_ += cached;
  } else {
    resumed_cached_tokens_ += cached;
  }
  kv_.claim(*seq, cached);
  seq->status = SeqStatus::kRunning;
  running_.push_back(seq);
  return Admission::kAdmitted;
}

void SchedulerCore::step_done(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    c.seq->num_computed += c.num_tokens;
    kv_.computed(*c.seq);
  }
}

void SchedulerCore::finish(Sequence* seq) {
  kv_.release_finished(seq);
  seq->status = SeqStatus::kFinished;
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end())
    running_.erase(it);
  // With overlapped steps a sequence preempted while its last step computed finishes waiting.
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end())
    waiting_.erase(it);
  ++finished_count_;
  finished_output_tokens_ += seq->num_generated();
}

void SchedulerCore::abort(Sequence* seq) {
  kv_.drop(seq, nullptr);  // what it computed stays in the prefix cache
  seq->status = SeqStatus::kFinished;
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end())
    running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end())
    waiting_.erase(it);
}

// The FCFS pass (sched/policy.h): what --scheduler fcfs runs, and what the other policies fall
// back on.
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

Scheduler::~Scheduler() = default;

void Scheduler::observe_iteration(double seconds) {
  policy_->observe_iteration(seconds);
}
bool Scheduler::fits_iteration_cost() const {
  return policy_->fits_iteration_cost();
}
void Scheduler::observe_step_cost(const IterationSample& sample) {
  policy_->observe_step_cost(sample);
}

const IterationCostModel& Scheduler::iteration_cost() const {
  const IterationCostModel* cost = policy_->iteration_cost();
  return cost ? *cost : core_.options().iteration_cost;
}

int32_t Scheduler::dense_budget() const {
  const SchedulerOptions& o = core_.options();
  if (o.dense_batch_sizes.empty() && o.dense_batch_tile <= 0) return o.max_batch_tokens;
  int64_t work = 0, decodes = 0;
  for (const Sequence* s : core_.running()) {
    if (s->generation_complete()) continue;
    work += s->num_uncomputed();
    decodes += s->num_uncomputed() == 1 ? 1 : 0;
  }
  for (const Sequence* s : core_.waiting())
    if (!s->generation_complete()) work += s->num_uncomputed();
  work = std::min<int64_t>(work, o.max_batch_tokens);
  // A size must leave room for a prompt token when prompts wait: one the decodes alone fill
  // would hold the prompts back for as long as those decodes run.
  auto allowed = [&](int64_t size) { return size <= work && (size > decodes || size == work); };
  int64_t budget = 0;
  for (int32_t size : o.dense_batch_sizes)
    if (allowed(size)) budget = std::max<int64_t>(budget, size);
  // The largest multiple of the tile under the work; a smaller one leaves less room still.
  if (const int64_t tile = o.dense_batch_tile; tile > 0 && allowed(work / tile * tile))
    budget = std::max(budget, work / tile * tile);
  return budget > 0 ? static_cast<int32_t>(budget) : o.max_batch_tokens;
}

StepPlan Scheduler::schedule(double now) {
  StepPlan plan;
  const int32_t budget_start = dense_budget();
  int32_t budget = budget_start;
  policy_->schedule(core_, plan, budget, now);
  plan.num_tokens = budget_start - budget;
  return plan;
}

}  // namespace blend
