#include "kv/bidirectional_pages.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace blend {

namespace {

// The block-table index of `page` in `seq`, or -1.
int64_t index_of(const Sequence& seq, PageId page) {
  const auto& t = seq.block_table;
  for (size_t j = t.size(); j-- > 0;)
    if (t[j] == page) return static_cast<int64_t>(j);
  return -1;
}

}  // namespace

BidirectionalPages::BidirectionalPages(int64_t num_pages, int32_t page_size, int64_t page_bytes)
    : page_size_(page_size),
      page_bytes_(page_bytes),
      rt_(static_cast<size_t>(num_pages), nullptr),
      be_(static_cast<size_t>(num_pages), nullptr),
      reserved_(static_cast<size_t>(num_pages), {0, 0}) {}

int32_t BidirectionalPages::slots_used(const Sequence& seq, PageId page) const {
  const int64_t j = index_of(seq, page);
  if (j < 0) return 0;
  return static_cast<int32_t>(
      std::clamp<int64_t>(int64_t{seq.num_tokens()} - j * page_size_, 0, page_size_));
}

std::pair<int32_t, int32_t> BidirectionalPages::physical(const Sequence& seq, PageId page,
                                                         int64_t first, int64_t last) const {
  const int64_t j = index_of(seq, page);
  if (j < 0 || first >= last) return {0, 0};
  if (!seq.page_reversed(static_cast<size_t>(j)))
    return {static_cast<int32_t>(first), static_cast<int32_t>(last)};
  return {static_cast<int32_t>(page_size_ - last), static_cast<int32_t>(page_size_ - first)};
}

BidirectionalPages::Offer BidirectionalPages::find_page_for_be(
    const std::vector<Sequence*>& running, int32_t slots) const {
  Offer best;
  int32_t best_empty = -1;
  for (Sequence* s : running) {
    if (s->request_class != RequestClass::kRealtime || s->block_table.empty()) continue;
    const PageId p = s->block_table.back();
    if (be_[static_cast<size_t>(p)] != nullptr) continue;
    const int32_t empty = page_size_ - slots_used(*s, p);
    if (empty >= slots && empty > best_empty)
      best = {p, s, !s->page_reversed(s->block_table.size() - 1)}, best_empty = empty;
  }
  return best;
}

void BidirectionalPages::share(PageId page, Sequence* rt, Sequence* be) {
  rt_[static_cast<size_t>(page)] = rt;
  be_[static_cast<size_t>(page)] = be;
  reserved_[static_cast<size_t>(page)] = {0, 0};
  ++shared_count_;
}

void BidirectionalPages::unshare(PageId page, const Sequence* seq) {
  auto& r = rt_[static_cast<size_t>(page)];
  auto& b = be_[static_cast<size_t>(page)];
  auto& reserved = reserved_[static_cast<size_t>(page)];
  if (r == seq) {
    if (b != nullptr) reserved = physical(*r, page, 0, slots_used(*r, page));
    r = nullptr;
  }
  if (b == seq) {
    b = nullptr;
    reserved = {0, 0};
  }
}

void BidirectionalPages::forget(const Sequence* seq) {
  for (PageId p : seq->block_table) unshare(p, seq);
  // A BE sequence dropped or finished needs no restore any more. An RT sequence's entries
  // stay: its BE peer still has to restore what it overwrote.
  for (auto it = table_.lower_bound({seq->id, 0});
       it != table_.end() && it->first.first == seq->id;)
    it = table_.erase(it);
}

bool BidirectionalPages::be_would_collide(PageId page, const Sequence& be, int64_t tokens) const {
  const Sequence* rt = rt_[static_cast<size_t>(page)];
  const auto [r_lo, r_hi] =
      rt ? physical(*rt, page, 0, slots_used(*rt, page)) : reserved_[static_cast<size_t>(page)];
  if (r_lo >= r_hi) return false;
  const int64_t j = index_of(be, page);
  const auto [b_lo, b_hi] =
      physical(be, page, 0, std::clamp<int64_t>(tokens - j * page_size_, 0, page_size_));
  return std::max(r_lo, b_lo) < std::min(r_hi, b_hi);
}

std::vector<int32_t> BidirectionalPages::collide(PageId page, const Sequence& rt, int32_t first,
                                                 int32_t last) {
  Sequence* be = be_[static_cast<size_t>(page)];
  if (be == nullptr) return {};
  const auto [lo, hi] = physical(rt, page, first, last);
  const auto [be_lo, be_hi] = physical(*be, page, 0, slots_used(*be, page));
  if (std::max(lo, be_lo) >= std::min(hi, be_hi)) return {};  // none of the BE's slots reached
  const int64_t j = index_of(*be, page);
  const int64_t computed =
      std::clamp<int64_t>(int64_t{be->num_computed} - j * page_size_, 0, page_size_);
  const auto [c_lo, c_hi] = physical(*be, page, 0, computed);
  Preempted& p = table_[{be->id, page}];
  if (!p.saved) {
    p.rt = rt.id;
    p.saved = std::make_shared<SlotCheckpoint>();
    p.saved->saved.assign(static_cast<size_t>(page_size_), 0);
    p.saved->image.resize(static_cast<size_t>(page_bytes_));
  }
  std::vector<int32_t> to_save;
  for (int32_t s = std::max(lo, c_lo); s < std::min(hi, c_hi); ++s) {
    if (p.saved->saved[static_cast<size_t>(s)]) continue;
    p.saved->saved[static_cast<size_t>(s)] = 1;
    to_save.push_back(s);
  }
  checkpointed_slots_ += static_cast<int64_t>(to_save.size());
  return to_save;
}

bool BidirectionalPages::needs_restore(const Sequence& be) const {
  auto it = table_.lower_bound({be.id, 0});
  return it != table_.end() && it->first.first == be.id;
}

std::vector<PageId> BidirectionalPages::pages_to_restore(const Sequence& be) const {
  std::vector<PageId> pages;
  for (auto it = table_.lower_bound({be.id, 0}); it != table_.end() && it->first.first == be.id;
       ++it)
    pages.push_back(it->first.second);
  return pages;
}

std::shared_ptr<SlotCheckpoint> BidirectionalPages::checkpoint_image(const Sequence& be,
                                                                     PageId page) {
  return table_.at({be.id, page}).saved;
}

std::shared_ptr<SlotCheckpoint> BidirectionalPages::take_checkpoint(const Sequence& be,
                                                                    PageId page) {
  auto it = table_.find({be.id, page});
  std::shared_ptr<SlotCheckpoint> c = std::move(it->second.saved);
  table_.erase(it);
  return c;
}

std::vector<BidirectionalPages::Entry> BidirectionalPages::preemption_table() const {
  std::vector<Entry> out;
  for (const auto& [key, p] : table_) out.push_back({key.second, p.rt, key.first});
  return out;
}

void BidirectionalPages::check_invariants() const {
  auto fail = [](const char* what, size_t page) {
    std::fprintf(stderr, "BidirectionalPages: %s (page %zu)\n", what, page);
    std::abort();
  };
  for (size_t p = 0; p < rt_.size(); ++p) {
    const auto page = static_cast<PageId>(p);
    if (rt_[p] && index_of(*rt_[p], page) < 0) fail("RT holder does not hold the page", p);
    if (be_[p] && index_of(*be_[p], page) < 0) fail("BE holder does not hold the page", p);
    if (rt_[p] && rt_[p]->request_class != RequestClass::kRealtime)
      fail("RT holder is not real-time", p);
    if (be_[p] && be_[p]->request_class != RequestClass::kBestEffort)
      fail("BE holder is not best-effort", p);
    if (rt_[p] && be_[p]) {
      const int64_t jr = index_of(*rt_[p], page), jb = index_of(*be_[p], page);
      if (rt_[p]->page_reversed(static_cast<size_t>(jr)) ==
          be_[p]->page_reversed(static_cast<size_t>(jb)))
        fail("the two holders fill the page from the same end", p);
    }
  }
}

}  // namespace blend
