#include "kv/kv_manager.h"

#include <algorithm>

namespace blend {

KvManager::KvManager(PagePool& pool, RadixCache* cache, bool bidirectional, int64_t page_bytes)
    : pool_(pool), cache_(cache) {
  if (bidirectional)
    bidir_ = std::make_unique<BidirectionalPages>(pool_.num_pages(), pool_.page_size(), page_bytes);
}

void KvManager::check_invariants() const {
  if (bidir_) bidir_->check_invariants();
}

bool KvManager::allocate(int64_t count, std::vector<PageId>& out) {
  if (cache_ && pool_.num_free() < count) cache_->evict(count - pool_.num_free());
  return pool_.allocate(count, out);
}

bool KvManager::grow(Sequence* seq, int32_t new_tokens, KvStepOps& ops, const Peers& peers) {
  const bool best_effort = seq->request_class == RequestClass::kBestEffort;
  if (bidir_ && best_effort && !prepare_best_effort(seq, new_tokens, ops)) return false;
  const int64_t need = pool_.pages_for(seq->num_computed + new_tokens) -
                       static_cast<int64_t>(seq->block_table.size());
  if (need > 0 && !allocate(need, seq->block_table) &&
      (!bidir_ || !share_pages(seq, need, new_tokens, peers)))
    return false;
  if (bidir_ && !best_effort) checkpoint_overwritten(seq, new_tokens, ops);
  return true;
}

void KvManager::drop(Sequence* seq, KvStepOps* pending) {
  if (cache_) cache_->forget(seq->id);
  if (bidir_) {
    bidir_->forget(seq);
    if (pending) {
      auto dropped = [seq](PageId p) {
        return std::find(seq->block_table.begin(), seq->block_table.end(), p) !=
               seq->block_table.end();
      };
      for (auto& c : pending->copies)
        if (c.second >= 0 && dropped(c.second)) c.second = -1;
      std::erase_if(pending->restores, [&](const auto& r) { return dropped(r.first); });
    }
  }
  pool_.release_all(seq->block_table);
  seq->reversed_pages.clear();
  seq->num_computed = 0;
}

void KvManager::undo_copies(KvStepOps& ops, size_t from) {
  for (size_t c = from; c < ops.copies.size(); ++c) pool_.release(ops.copies[c].first);
  ops.copies.resize(from);
}

// A BE sequence about to compute `new_tokens` more: first restore the pages its RT peers
// overwrote (§5.2), then move off any shared page where its new tokens would reach its RT
// peer's slots. False when there is no free page for that now.
bool KvManager::prepare_best_effort(Sequence* seq, int32_t new_tokens, KvStepOps& ops) {
  if (bidir_->needs_restore(*seq) && !restore(seq, ops)) return false;
  const int64_t tokens = int64_t{seq->num_computed} + new_tokens;
  for (size_t j = 0; j < seq->block_table.size(); ++j) {
    const PageId page = seq->block_table[j];
    if (!bidir_->be_would_collide(page, *seq, tokens)) continue;
    std::vector<PageId> fresh;
    if (!allocate(1, fresh)) return false;
    ops.copies.emplace_back(page, fresh[0]);  // the copy takes over seq's reference on `page`
    bidir_->unshare(page, seq);
    seq->block_table[j] = fresh[0];
    ++moved_pages_;
  }
  return true;
}

bool KvManager::restore(Sequence* seq, KvStepOps& ops) {
  const std::vector<PageId> pages = bidir_->pages_to_restore(*seq);
  std::vector<PageId> fresh;
  if (!allocate(static_cast<int64_t>(pages.size()), fresh)) return false;
  for (size_t k = 0; k < pages.size(); ++k) {
    auto it = std::find(seq->block_table.begin(), seq->block_table.end(), pages[k]);
    *it = fresh[k];
    ops.copies.emplace_back(pages[k], fresh[k]);  // the copy takes over seq's reference
    ops.restores.emplace_back(fresh[k], bidir_->take_checkpoint(*seq, pages[k]));
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
bool KvManager::share_pages(Sequence* seq, int64_t need, int32_t new_tokens, const Peers& peers) {
  const int64_t available = pool_.num_available();
  std::vector<BidirectionalPages::Offer> offers;
  if (seq->request_class == RequestClass::kBestEffort) {
    if (need - available != 1) return false;
    const int64_t last = static_cast<int64_t>(seq->block_table.size()) + need - 1;
    const auto slots =
        static_cast<int32_t>(int64_t{seq->num_computed} + new_tokens - last * pool_.page_size());
    offers.push_back(bidir_->find_page_for_be(peers.running, slots));
    if (offers.back().page < 0) return false;
  } else {
    for (int64_t k = available; k < need; ++k) {
      const auto offer = bidir_->find_page_for_rt(peers.running, [&](const Sequence& s, PageId p) {
        return pool_.refcount(p) == 1 && !peers.in_step(s) &&
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
void KvManager::checkpoint_overwritten(const Sequence* seq, int32_t new_tokens, KvStepOps& ops) {
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
      ops.checkpoints.push_back({page, slots[a], static_cast<int32_t>(b - a), image});
      a = b;
    }
  }
}

bool KvManager::reuse_cached_prefix(Sequence* seq, KvStepOps& ops) {
  // At least the last token is computed: its logits give the next token.
  PrefixMatch m = cache_->match(
      seq->tokens, seq->num_tokens() - 1, seq->id,
      [this](int64_t count, std::vector<PageId>& out) { return allocate(count, out); }, seq->model);
  if (m.claimed_by_other) return false;  // nothing was retained
  seq->block_table = std::move(m.pages);
  seq->num_computed = static_cast<int32_t>(seq->block_table.size()) * pool_.page_size();
  if (m.partial_page >= 0) {
    if (allocate(1, seq->block_table)) {
      ops.copies.emplace_back(m.partial_page, seq->block_table.back());
      seq->num_computed += m.partial_tokens;
    } else {
      pool_.release(m.partial_page);
    }
  }
  return true;
}

void KvManager::claim(const Sequence& seq, int32_t cached_tokens) {
  if (cache_)
    cache_->claim(seq.id, seq.tokens, cached_tokens / pool_.page_size(), seq.prompt_len, seq.model);
}

void KvManager::computed(Sequence& seq) {
  if (!cache_) return;
  int32_t tokens = seq.cacheable_tokens(pool_.page_size());
  // With bidirectional KV a running BE sequence keeps its partly filled last page out of the
  // cache: a page only it holds is one an RT sequence may take (share_pages).
  if (bidir_ && seq.request_class == RequestClass::kBestEffort)
    tokens -= tokens % pool_.page_size();
  cache_->insert(seq.id, seq.tokens, tokens, seq.block_table, seq.model);
}

void KvManager::release_finished(Sequence* seq) {
  if (cache_)
    cache_->insert_finished(seq->id, seq->tokens, seq->cacheable_tokens(pool_.page_size()),
                            seq->block_table, seq->model);
  if (bidir_) bidir_->forget(seq);
  pool_.release_all(seq->block_table);
  seq->reversed_pages.clear();
}

int64_t KvManager::pages_best_effort_could_yield(const std::vector<Sequence*>& running) const {
  int64_t pages = 0;
  for (const Sequence* s : running) {
    if (s->request_class != RequestClass::kBestEffort) continue;
    for (PageId p : s->block_table) {
      if (bidir_ && bidir_->rt_holder(p) != nullptr) continue;
      if (pool_.refcount(p) - (pool_.is_cached(p) ? 1 : 0) == 1) ++pages;
    }
  }
  return pages;
}

bool KvManager::needs_restore(const Sequence& seq) const {
  return bidir_ && bidir_->needs_restore(seq);
}

int64_t KvManager::pages_to_restore(const Sequence& seq) const {
  return bidir_ ? static_cast<int64_t>(bidir_->pages_to_restore(seq).size()) : 0;
}

}  // namespace blend
