#include "sched/scheduler.h"

#include <algorithm>

namespace blend {

Scheduler::Scheduler(PagePool& pool, SchedulerOptions options, RadixCache* cache)
    : pool_(pool),
      options_(options),
      cache_(cache),
      hybrid_(options.hybrid, options.iteration_cost) {
  if (options_.bidirectional_kv)
    bidir_ = std::make_unique<BidirectionalPages>(pool_.num_pages(), pool_.page_size(),
                                                  options_.kv_page_bytes);
}

void Scheduler::check_invariants() const {
  if (bidir_) bidir_->check_invariants();
}

void Scheduler::observe_iteration(double seconds) {
  hybrid_.observe_iteration(seconds);
}

void Scheduler::observe_step_cost(const IterationSample& sample) {
  if (!options_.fit_iteration_cost) return;
  iteration_fit_.add(sample);
  // A refit costs a few small solves over the window: every kRefitSteps steps is plenty for
  // a machine whose speed drifts over seconds.
  constexpr int64_t kRefitSteps = 32;
  if (++samples_since_fit_ >= kRefitSteps && iteration_fit_.ready()) {
    samples_since_fit_ = 0;
    hybrid_.set_cost(iteration_fit_.fit());
  }
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

bool Scheduler::grow(Sequence* seq, int32_t new_tokens, StepPlan& plan) {
  const bool best_effort = seq->request_class == RequestClass::kBestEffort;
  if (bidir_ && best_effort && !prepare_best_effort(seq, new_tokens, plan)) return false;
  const int64_t need = pool_.pages_for(seq->num_computed + new_tokens) -
                       static_cast<int64_t>(seq->block_table.size());
  if (need > 0 && !allocate(need, seq->block_table) &&
      (!bidir_ || !share_pages(seq, need, new_tokens, plan)))
    return false;
  if (bidir_ && !best_effort) checkpoint_overwritten(seq, new_tokens, plan);
  return true;
}

void Scheduler::drop_pages(Sequence* seq) {
  if (cache_) cache_->forget(seq->id);
  if (bidir_) {
    bidir_->forget(seq);
    // Copies and restores this step planned into the pages being dropped must not run: the
    // pages may be handed to another sequence in the same step.
    if (plan_) {
      auto dropped = [seq](PageId p) {
        return std::find(seq->block_table.begin(), seq->block_table.end(), p) !=
               seq->block_table.end();
      };
      for (auto& c : plan_->copies)
        if (c.second >= 0 && dropped(c.second)) c.second = -1;
      std::erase_if(plan_->restores, [&](const auto& r) { return dropped(r.first); });
    }
  }
  pool_.release_all(seq->block_table);
  seq->reversed_pages.clear();
  seq->num_computed = 0;
}

// A BE sequence about to compute `new_tokens` more: first restore the pages its RT peers
// overwrote (§5.2), then move off any shared page where its new tokens would reach its RT
// peer's slots. False when there is no free page for that now.
bool Scheduler::prepare_best_effort(Sequence* seq, int32_t new_tokens, StepPlan& plan) {
  if (bidir_->needs_restore(*seq) && !restore(seq, plan)) return false;
  const int64_t tokens = int64_t{seq->num_computed} + new_tokens;
  for (size_t j = 0; j < seq->block_table.size(); ++j) {
    const PageId page = seq->block_table[j];
    if (!bidir_->be_would_collide(page, *seq, tokens)) continue;
    std::vector<PageId> fresh;
    if (!allocate(1, fresh)) return false;
    plan.copies.emplace_back(page, fresh[0]);  // the plan takes over seq's reference on `page`
    bidir_->unshare(page, seq);
    seq->block_table[j] = fresh[0];
    ++moved_pages_;
  }
  return true;
}

bool Scheduler::restore(Sequence* seq, StepPlan& plan) {
  const std::vector<PageId> pages = bidir_->pages_to_restore(*seq);
  std::vector<PageId> fresh;
  if (!allocate(static_cast<int64_t>(pages.size()), fresh)) return false;
  for (size_t k = 0; k < pages.size(); ++k) {
    auto it = std::find(seq->block_table.begin(), seq->block_table.end(), pages[k]);
    *it = fresh[k];
    plan.copies.emplace_back(pages[k], fresh[k]);  // the plan takes over seq's reference
    plan.restores.emplace_back(fresh[k], bidir_->take_checkpoint(*seq, pages[k]));
    bidir_->unshare(pages[k], seq);
    ++restored_pages_;
  }
  return true;
}

// No free page is left for the `need` pages `seq` asks for: share pages with the other class.
// A BE sequence may take only its last page this way, and only if its tokens there fit in the
// empty end of an RT sequence's last page (FindBlock); an RT sequence takes BE pages, those
// with the most empty slots first (FindPreemptBlock), from BE sequences not running in this
// step, whose pages nobody else (the prefix cache, another sequence) holds.
bool Scheduler::share_pages(Sequence* seq, int64_t need, int32_t new_tokens, const StepPlan& plan) {
  const int64_t available = pool_.num_available();
  std::vector<BidirectionalPages::Offer> offers;
  if (seq->request_class == RequestClass::kBestEffort) {
    if (need - available != 1) return false;
    const int64_t last = static_cast<int64_t>(seq->block_table.size()) + need - 1;
    const auto slots =
        static_cast<int32_t>(int64_t{seq->num_computed} + new_tokens - last * pool_.page_size());
    offers.push_back(bidir_->find_page_for_be(running_, slots));
    if (offers.back().page < 0) return false;
  } else {
    auto in_plan = [&plan](const Sequence& s) {
      return std::any_of(plan.chunks.begin(), plan.chunks.end(),
                         [&s](const ScheduledChunk& c) { return c.seq == &s; });
    };
    for (int64_t k = available; k < need; ++k) {
      const auto offer = bidir_->find_page_for_rt(running_, [&](const Sequence& s, PageId p) {
        return pool_.refcount(p) == 1 && !in_plan(s) &&
               std::none_of(offers.begin(), offers.end(),
                            [p](const auto& o) { return o.page == p; });
      });
      if (offer.page < 0) return false;
      offers.push_back(offer);
    }
  }
  if (available > 0 && !allocate(available, seq->block_table)) return false;
  for (const auto& o : offers) {
    pool_.retain(o.page);
    seq->block_table.push_back(o.page);
    seq->reversed_pages.resize(seq->block_table.size(), 0);
    seq->reversed_pages.back() = o.reversed ? 1 : 0;
    if (seq->request_class == RequestClass::kBestEffort) {
      bidir_->share(o.page, o.holder, seq);
    } else {
      bidir_->share(o.page, seq, o.holder);
    }
  }
  return true;
}

// An RT sequence computes `new_tokens` more: the slots of BE peers it overwrites are saved to
// host memory first, only those (lazy checkpointing, §5.2).
void Scheduler::checkpoint_overwritten(const Sequence* seq, int32_t new_tokens, StepPlan& plan) {
  const int64_t ps = pool_.page_size();
  const int64_t from = seq->num_computed, to = from + new_tokens;
  for (int64_t j = from / ps; j * ps < to; ++j) {
    const PageId page = seq->block_table[static_cast<size_t>(j)];
    const Sequence* be = bidir_->be_holder(page);
    if (be == nullptr) continue;
    const auto first = static_cast<int32_t>(std::max(from, j * ps) - j * ps);
    const auto last = static_cast<int32_t>(std::min(to, (j + 1) * ps) - j * ps);
    const std::vector<int32_t> slots = bidir_->collide(page, *seq, first, last);
    if (slots.empty()) continue;
    auto image = bidir_->checkpoint_image(*be, page);
    for (size_t a = 0; a < slots.size();) {  // consecutive slots in one copy
      size_t b = a + 1;
      while (b < slots.size() && slots[b] == slots[b - 1] + 1) ++b;
      plan.checkpoints.push_back({page, slots[a], static_cast<int32_t>(b - a), image});
      a = b;
    }
  }
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
bool Scheduler::fits_peak_memory(const Sequence& candidate, bool only_realtime) const {
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
  if (!grow(seq, n, plan)) {
    // Alone in the engine: take what fits now, the rest in later steps.
    if (alone)
      n = static_cast<int32_t>(std::min<int64_t>(
          n, (static_cast<int64_t>(seq->block_table.size()) + pool_.num_available()) *
                     pool_.page_size() -
                 seq->num_computed));
    if (!alone || n <= 0 || !grow(seq, n, plan)) {
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
void Scheduler::schedule_fcfs(StepPlan& plan, int32_t& budget, Eligible eligible,
                              bool admit_waiting) {
  // 1. Running sequences, oldest first. When pages run out, the newest running sequence is
  //    preempted; it has not been scheduled yet in this step (or is the one asking).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    if (!eligible(*seq) || seq->generation_complete()) {
      ++i;
      continue;
    }
    const int32_t n = std::min(seq->num_uncomputed(), budget);
    bool scheduled = true;
    while (!grow(seq, n, plan)) {
      // The newest sequence not scheduled yet; with bidirectional KV (BROS §5.2's drop
      // order) a real-time one takes the newest best-effort one first.
      Sequence* victim = running_.back();
      if (bidir_ && seq->request_class == RequestClass::kRealtime)
        for (size_t v = running_.size(); v-- > i + 1;)
          if (running_[v]->request_class == RequestClass::kBestEffort) {
            victim = running_[v];
            break;
          }
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
  for (size_t i = 0; admit_waiting && plan.preempted.empty() && budget > 0 && i < waiting_.size() &&
                     running_.size() < static_cast<size_t>(options_.max_running);) {
    Sequence* seq = waiting_[i];
    if (!eligible(*seq) || seq->generation_complete()) {
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

// vLLM's default scheduler before chunked prefill (vLLM <= 0.6, `_schedule_default`; the vLLM
// BROS §7.1 compares with): a prompt waiting to start takes the step, decodes wait. Prompts are
// admitted whole in arrival order while the step's token budget and the free pages allow, with
// no prediction of later growth (vLLM's `can_allocate`, less a 1% watermark of pages); when
// pages run out during decoding the newest sequence is preempted and recomputed. A prompt longer
// than the budget (vLLM refuses those) runs alone, in chunks over consecutive steps.
void Scheduler::schedule_prefill_first(StepPlan& plan, int32_t& budget) {
  const int64_t watermark = pool_.num_pages() / 100;
  // A prompt chunked over steps continues first; a decode has exactly one token to compute.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    if (seq->num_uncomputed() <= 1) {
      ++i;
      continue;
    }
    const int32_t n = std::min(seq->num_uncomputed(), budget);
    if (!grow(seq, n, plan)) break;  // the decode step below preempts to make room
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
    ++i;
  }
  for (size_t i = 0; budget > 0 && i < waiting_.size() &&
                     running_.size() < static_cast<size_t>(options_.max_running);) {
    Sequence* seq = waiting_[i];
    if (seq->generation_complete()) {
      ++i;
      continue;
    }
    const bool alone = plan.chunks.empty();
    if (!alone && seq->num_uncomputed() > budget) break;  // whole prompts only
    if (!alone && pool_.num_available() - pool_.pages_for(seq->num_uncomputed()) < watermark) break;
    int32_t n = budget;
    const Admission a = admit(seq, n, plan, running_.empty());
    if (a == Admission::kNoRoom) break;
    if (a == Admission::kWaitsForPrefix) {
      ++i;
      continue;
    }
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
  }
  if (!plan.chunks.empty()) return;
  schedule_fcfs(
      plan, budget, [](const Sequence&) { return true; }, /*admit_waiting=*/false);
}

// BROS §4.2: the hybrid policy picks who runs (RT by deadline, BE by swap cost); those picked
// then run like FCFS chunks. Running sequences not picked keep their KV and wait a step.
void Scheduler::schedule_hybrid(StepPlan& plan, int32_t& budget, double now) {
  std::vector<Sequence*> rt_seqs, be_seqs;
  std::vector<HybridCandidate> rt, be;
  auto add = [&](Sequence* seq) {
    if (seq->generation_complete()) return;
    HybridCandidate c;
    c.cls = seq->request_class;
    c.prefill = seq->num_uncomputed() > 1 || seq->num_generated() == 0;
    c.first_token = seq->num_generated() == 0;
    c.tokens = std::min(seq->num_uncomputed(), options_.max_batch_tokens);
    c.context = seq->num_computed;
    c.pages_needed = std::max<int64_t>(0, pool_.pages_for(int64_t{seq->num_computed} + c.tokens) -
                                              static_cast<int64_t>(seq->block_table.size()));
    if (bidir_ && c.cls == RequestClass::kBestEffort)  // pages to restore first (swap cost)
      c.checkpointed_pages = static_cast<int64_t>(bidir_->pages_to_restore(*seq).size());
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
  for (Sequence* seq : running_) add(seq);
  // Waiting requests are looked at in arrival order, a bounded number of each class per step:
  // BROS keeps RT and BE in queues of their own, so an RT request arriving behind a large BE
  // job must be seen at once (one bound over both let a 1,024-request job hide every RT arrival
  // behind it: 55% TTFT attainment at 1 RT/s on the simulator).
  const size_t look = static_cast<size_t>(options_.max_running) * 2;
  size_t rt_seen = 0, be_seen = 0;
  for (size_t i = 0; i < waiting_.size() && (rt_seen < look || be_seen < look); ++i) {
    size_t& seen = waiting_[i]->request_class == RequestClass::kRealtime ? rt_seen : be_seen;
    if (seen < look) {
      add(waiting_[i]);
      ++seen;
    }
  }
  const HybridSelection sel = hybrid_.select(rt, be, now, pool_.num_available());
  // An RT request short of KV pages makes room by dropping BE sequences (recompute), those
  // waiting to restore checkpointed pages first (they already lost part of their KV), then
  // the newest (BROS §5.2's drop order: BE before RT).
  auto drop_best_effort = [&]() {
    Sequence* victim = nullptr;
    for (size_t v = running_.size(); v-- > 0;) {
      Sequence* s = running_[v];
      if (s->request_class != RequestClass::kBestEffort ||
          std::any_of(plan.chunks.begin(), plan.chunks.end(),
                      [s](const ScheduledChunk& c) { return c.seq == s; }))
        continue;
      if (victim == nullptr ||
          (bidir_ && bidir_->needs_restore(*s) && !bidir_->needs_restore(*victim)))
        victim = s;
    }
    if (victim == nullptr) return false;
    preempt(victim);
    plan.preempted.push_back(victim);
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
      if (running_.size() >= static_cast<size_t>(options_.max_running) ||
          (!running_.empty() && !fits_peak_memory(*seq, realtime)))
        return;
      for (int32_t want = n;; n = want) {
        const Admission a = admit(seq, n, plan, running_.empty());
        if (a == Admission::kAdmitted) break;
        if (a == Admission::kWaitsForPrefix || !realtime || !drop_best_effort()) return;
      }
    } else {
      while (!grow(seq, n, plan))
        if (!realtime || !drop_best_effort()) return;
    }
    plan.chunks.push_back({seq, n, seq->num_computed + n == seq->num_tokens()});
    budget -= n;
  };
  for (size_t k = 0; k < sel.rt.size(); ++k) run(rt_seqs[sel.rt[k]], sel.rt_tokens[k]);
  for (size_t k = 0; k < sel.be.size(); ++k) run(be_seqs[sel.be[k]], sel.be_tokens[k]);
}

StepPlan Scheduler::schedule(double now) {
  StepPlan plan;
  plan_ = &plan;
  int32_t budget = options_.max_batch_tokens;
  const int64_t step = steps_++;
  switch (options_.policy) {
    case SchedulerPolicy::kFcfs:
      schedule_fcfs(plan, budget, [](const Sequence&) { return true; });
      break;
    case SchedulerPolicy::kPrefillFirst:
      schedule_prefill_first(plan, budget);
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
  plan_ = nullptr;
  return plan;
}

void Scheduler::step_done(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    Sequence* seq = c.seq;
    seq->num_computed += c.num_tokens;
    if (!cache_) continue;
    int32_t tokens = seq->cacheable_tokens(pool_.page_size());
    // With bidirectional KV a running BE sequence keeps its partly filled last page out of the
    // cache: a page only it holds is one an RT sequence may take (share_pages).
    if (bidir_ && seq->request_class == RequestClass::kBestEffort)
      tokens -= tokens % pool_.page_size();
    cache_->insert(seq->id, seq->tokens, tokens, seq->block_table);
  }
}

void Scheduler::finish(Sequence* seq) {
  if (cache_)
    cache_->insert_finished(seq->id, seq->tokens, seq->cacheable_tokens(pool_.page_size()),
                            seq->block_table);
  if (bidir_) bidir_->forget(seq);
  pool_.release_all(seq->block_table);
  seq->reversed_pages.clear();
  seq->status = SeqStatus::kFinished;
  if (auto it = std::find(running_.begin(), running_.end(), seq); it != running_.end())
    running_.erase(it);
  // With overlapped steps a sequence preempted while its last step computed finishes waiting.
  if (auto it = std::find(waiting_.begin(), waiting_.end(), seq); it != waiting_.end())
    waiting_.erase(it);
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
