#include "sched/scheduler.h"

#include <algorithm>

namespace blend {

Scheduler::Scheduler(PagePool& pool, SchedulerOptions options, RadixCache* cache)
    : pool_(pool), options_(options), cache_(cache) {}

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

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int32_t budget = options_.max_batch_tokens;

  // 1. Running sequences, oldest first. When pages run out, the newest running sequence is
  //    preempted; it has not been scheduled yet in this step (or is the one asking).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
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
  for (auto it = waiting_.begin(); plan.preempted.empty() && budget > 0 && it != waiting_.end() &&
                                   running_.size() < static_cast<size_t>(options_.max_running);) {
    Sequence* seq = *it;
    if (!running_.empty() && !fits_peak_memory(*seq)) break;
    const size_t copies_before = plan.copies.size();
    if (cache_ && seq->block_table.empty() && !reuse_cached_prefix(seq, plan)) {
      ++it;
      continue;
    }
    const int32_t cached = seq->num_computed;
    int32_t n = std::min(seq->num_uncomputed(), budget);
    if (!grow(seq, n)) {
      // Alone in the engine: take what fits now, the rest in later steps.
      if (running_.empty())
        n = static_cast<int32_t>(std::min<int64_t>(
            n, (static_cast<int64_t>(seq->block_table.size()) + pool_.num_available()) *
                       pool_.page_size() -
                   seq->num_computed));
      if (!running_.empty() || n <= 0 || !grow(seq, n)) {
        for (size_t c = copies_before; c < plan.copies.size(); ++c)
          pool_.release(plan.copies[c].first);
        plan.copies.resize(copies_before);
        drop_pages(seq);
        break;
      }
    }
    it = waiting_.erase(it);
    if (seq->num_preemptions == 0) {
      seq->num_cached_prompt = cached;
      cached_prompt_tokens_ += cached;
    } else {
      resumed_cached_tokens_ += cached;
    }
    if (cache_) cache_->claim(seq->id, seq->tokens, cached / pool_.page_size(), seq->prompt_len);
    seq->status = SeqStatus::kRunning;
    running_.push_back(seq);
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
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
