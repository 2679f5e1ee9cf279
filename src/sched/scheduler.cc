#include "sched/scheduler.h"

#include <algorithm>

namespace blend {

Scheduler::Scheduler(PagePool& pool, SchedulerOptions options, RadixCache* cache)
    : pool_(pool),
      options_(options),
      cache_(cache),
      hybrid_(options.hybrid, options.iteration_cost) {}

void Scheduler::observe_iteration(double seconds) {
  hybrid_.observe_iteration(seconds);
}

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::kWaiting;
  seq->arrival = next_arrival_++;
  waiting_.push_back(seq);
}

bool Scheduler::allocate(int64_t count, std::vector<PageId>& out) {
  if (cache_ && pool_.num_free() < count) cache_->evict(count - pool_.num_free());
  return pool_.allocate(count, out);
}

bool Scheduler::grow(Sequence* seq, int32_t new_tokens) {
  const int64_t need = pool_.pages_for(seq->num_computed + new_tokens) -
                       static_cast<int64_t>(seq->block_table.size());
  return need <= 0 || allocate(need, seq->block_table);
}

void Scheduler::drop_pages(Sequence* seq) {
  if (cache_) cache_->forget(seq->id);
  pool_.release_all(seq->block_table);
  seq->num_computed = 0;
}

bool Scheduler::reuse_cached_prefix(Sequence* seq, StepPlan& plan) {
  // At least the last token is computed: its logits give the next token.
  PrefixMatch m = cache_->match(
      seq->tokens, seq->num_tokens() - 1, seq->id,
      [this](int64_t count, std::vector<PageId>& out) { return allocate(count, out); });
  if (m.claimed_by_other) return false;  // nothing was retained
  seq->block_table = std::move(m.pages);
  seq->num_computed = static_cast<int32_t>(seq->block_table.size()) * pool_.page_size();
  if (m.partial_page >= 0) {
    if (allocate(1, seq->block_table)) {
      plan.copies.emplace_back(m.partial_page, seq->block_table.back());
      seq->num_computed += m.partial_tokens;
    } else {
      pool_.release(m.partial_page);
    }
  }
  return true;
}

void Scheduler::preempt(Sequence* seq) {
  // Recompute preemption (vLLM V1, SGLang): drop the KV, keep the tokens; when the sequence
  // runs again its prompt and generated tokens are prefilled anew, minus what the prefix cache
  // still holds of them.
  drop_pages(seq);
  seq->status = SeqStatus::kWaiting;
  ++seq->num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
}

int64_t Scheduler::expected_output(const Sequence& seq) const {
  const int64_t guess = finished_count_ > 0 ? finished_output_tokens_ / finished_count_
                                            : options_.initial_output_estimate;
  const int64_t at_least = seq.num_generated() + 1;
  return std::min<int64_t>(seq.params.max_tokens, std::max(guess, at_least));
}

// NanoFlow §4.4: predict each running sequence's completion from the expected output length and
// admit the candidate only if the highest future page usage still fits. Usage peaks when some
// sequence finishes, so it is enough to evaluate it at each predicted completion step.
bool Scheduler::fits_peak_memory(const Sequence& candidate) const {
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
  for (const Sequence* s : running_) add(*s);
  add(candidate);
  std::sort(futures.begin(), futures.end(),
            [](const Future& a, const Future& b) { return a.remaining < b.remaining; });
  // At step t = futures[k].remaining, sequences k..n-1 are alive, each holding tokens + t tokens
  // (upper bound in pages: one partly filled page per sequence).
  int64_t suffix_tokens = 0;
  for (size_t k = futures.size(); k-- > 0;) {
    suffix_tokens += futures[k].tokens;
    const int64_t alive = static_cast<int64_t>(futures.size() - k);
    const int64_t tokens = suffix_tokens + alive * futures[k].remaining;
    if (tokens / pool_.page_size() + alive > pool_.num_pages()) return false;
  }
  return true;
}

Scheduler::Admission Scheduler::admit(Sequence* seq, int32_t& n, StepPlan& plan, bool alone) {
  const size_t copies_before = plan.copies.size();
  if (cache_ && seq->block_table.empty() && !reuse_cached_prefix(seq, plan))
    return Admission::kWaitsForPrefix;
  const int32_t cached = seq->num_computed;
  n = std::min(seq->num_uncomputed(), n);
  if (!grow(seq, n)) {
    // Alone in the engine: take what fits now, the rest in later steps.
    if (alone)
      n = static_cast<int32_t>(std::min<int64_t>(
          n, (static_cast<int64_t>(seq->block_table.size()) + pool_.num_available()) *
                     pool_.page_size() -
                 seq->num_computed));
    if (!alone || n <= 0 || !grow(seq, n)) {
      for (size_t c = copies_before; c < plan.copies.size(); ++c)
        pool_.release(plan.copies[c].first);
      plan.copies.resize(copies_before);
      drop_pages(seq);
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
  if (cache_) cache_->claim(seq->id, seq->tokens, cached / pool_.page_size(), seq->prompt_len);
  seq->status = SeqStatus::kRunning;
  running_.push_back(seq);
  return Admission::kAdmitted;
}

template <typename Eligible>
void Scheduler::schedule_fcfs(StepPlan& plan, int32_t& budget, Eligible eligible) {
  // 1. Running sequences, oldest first. When pages run out, the newest running sequence is
  //    preempted; it has not been scheduled yet in this step (or is the one asking).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    if (!eligible(*seq)) {
      ++i;
      continue;
    }
    const int32_t n = std::min(seq->num_uncomputed(), budget);
    bool scheduled = true;
    while (!grow(seq, n)) {
      Sequence* victim = running_.back();
      preempt(victim);
      plan.preempted.push_back(victim);
      if (victim == seq) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) continue;  // seq was removed; running_[i] is the next one
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
    ++i;
  }

  // 2. Admit waiting sequences while the budget, the running-set limit and the predicted peak
  //    memory allow. Nothing new is admitted in a step that had to preempt.
  //    A sequence waiting for another's prefix pages is passed over, keeping its place.
  for (size_t i = 0; plan.preempted.empty() && budget > 0 && i < waiting_.size() &&
                     running_.size() < static_cast<size_t>(options_.max_running);) {
    Sequence* seq = waiting_[i];
    if (!eligible(*seq)) {
      ++i;
      continue;
    }
    if (!running_.empty() && !fits_peak_memory(*seq)) break;
    int32_t n = budget;
    const bool alone = running_.empty();
    const Admission a = admit(seq, n, plan, alone);
    if (a == Admission::kNoRoom) break;
    if (a == Admission::kWaitsForPrefix) {  // another sequence is computing its prefix
      ++i;
      continue;
    }
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
  }
}

// BROS §4.2: the hybrid policy picks who runs (RT by deadline, BE by swap cost); those picked
// then run like FCFS chunks. Running sequences not picked keep their KV and wait a step.
void Scheduler::schedule_hybrid(StepPlan& plan, int32_t& budget, double now) {
  std::vector<Sequence*> rt_seqs, be_seqs;
  std::vector<HybridCandidate> rt, be;
  auto add = [&](Sequence* seq) {
    HybridCandidate c;
    c.cls = seq->request_class;
    c.prefill = seq->num_uncomputed() > 1 || seq->num_generated() == 0;
    c.tokens = std::min(seq->num_uncomputed(), options_.max_batch_tokens);
    c.context = seq->num_computed;
    c.pages_needed = std::max<int64_t>(0, pool_.pages_for(int64_t{seq->num_computed} + c.tokens) -
                                              static_cast<int64_t>(seq->block_table.size()));
    if (c.cls == RequestClass::kRealtime) {
      c.deadline = seq->num_generated() == 0 ? seq->arrival_time + seq->ttft_slo
                                             : seq->last_token_time + seq->tpot_slo;
      rt.push_back(c);
      rt_seqs.push_back(seq);
    } else {
      be.push_back(c);
      be_seqs.push_back(seq);
    }
  };
  for (Sequence* seq : running_) add(seq);
  // Waiting requests are looked at in arrival order, a bounded number per step.
  const size_t look = std::min(waiting_.size(), static_cast<size_t>(options_.max_running) * 2);
  for (size_t i = 0; i < look; ++i) add(waiting_[i]);
  const HybridSelection sel = hybrid_.select(rt, be, now, pool_.num_available());
  auto run = [&](Sequence* seq) {
    if (budget <= 0) return;
    int32_t n = std::min(seq->num_uncomputed(), budget);
    if (seq->status == SeqStatus::kWaiting) {
      if (running_.size() >= static_cast<size_t>(options_.max_running) ||
          admit(seq, n, plan, running_.empty()) != Admission::kAdmitted)
        return;
    } else if (!grow(seq, n)) {
      return;
    }
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
  };
  for (size_t i : sel.rt) run(rt_seqs[i]);
  for (size_t i : sel.be) run(be_seqs[i]);
}

StepPlan Scheduler::schedule(double now) {
  StepPlan plan;
  int32_t budget = options_.max_batch_tokens;
  const int64_t step = steps_++;
  switch (options_.policy) {
    case SchedulerPolicy::kFcfs:
      schedule_fcfs(plan, budget, [](const Sequence&) { return true; });
      break;
    case SchedulerPolicy::kRoundRobin: {
      // One class per step, alternating; the other class when this one has nothing to run.
      const RequestClass turn = step % 2 == 0 ? RequestClass::kRealtime : RequestClass::kBestEffort;
      schedule_fcfs(plan, budget, [turn](const Sequence& s) { return s.request_class == turn; });
      if (plan.empty())
        schedule_fcfs(plan, budget, [turn](const Sequence& s) { return s.request_class != turn; });
      break;
    }
    case SchedulerPolicy::kHybrid:
      schedule_hybrid(plan, budget, now);
      // Never an empty step while there is work: out of pages, FCFS preempts to make room.
      if (plan.empty()) schedule_fcfs(plan, budget, [](const Sequence&) { return true; });
      break;
  }
  plan.num_tokens = options_.max_batch_tokens - budget;
  return plan;
}

void Scheduler::step_done(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence* seq = c.seq;
    seq->num_computed += c.num_tokens;
    if (cache_) cache_->insert(seq->id, seq->tokens, seq->num_computed, seq->block_table);
  }
}

void Scheduler::finish(Sequence* seq) {
  if (cache_) cache_->insert_finished(seq->id, seq->tokens, seq->num_computed, seq->block_table);
  pool_.release_all(seq->block_table);
  seq->status = SeqStatus::kFinished;
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end())
    running_.erase(it);
  ++finished_count_;
  finished_output_tokens_ += seq->num_generated();
}

void Scheduler::abort(Sequence* seq) {
  drop_pages(seq);  // what it computed stays in the prefix cache
  seq->status = SeqStatus::kFinished;
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end())
    running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end())
    waiting_.erase(it);
}

}  // namespace blend
