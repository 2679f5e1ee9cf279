// BidirectionalPages — BROS's bidirectional KV block layout (§5 of
// ../shared/papers/002_5d606a3ee84a458d.txt). A page may hold two sequences at once, a
// real-time (RT) one and a best-effort (BE) one, growing towards each other from opposite ends:
// the page's first holder fills it from slot 0 as usual, the one who joins it fills it from the
// last slot backwards (Sequence::reversed_pages, read by attention through kv_slot). The
// scheduler uses this table, when no free page is left, to:
//   - give a BE sequence whose next tokens fit in the empty slots of a running RT sequence's
//     last page that page (FindBlock: the page with the most empty slots);
//   - give an RT sequence a page of a BE sequence, the one with the most empty slots
//     (FindPreemptBlock);
//   - checkpoint lazily (§5.2): when an RT sequence is about to overwrite slots of its BE peer,
//     only those slots are copied to host memory and the page enters the preemption table
//     (page, RT id, BE id). The BE sequence may not run again until each such page is restored:
//     copied to a fresh page, its checkpointed slots written back;
//   - move a BE sequence off a shared page, by copying it, when the BE's next tokens would
//     overwrite its RT peer's (an RT sequence is never disturbed by a BE one).
// It records who shares which page and holds the checkpoint images; it never touches the page
// pool or a backend. kv/kv_manager turns its answers into KvStepOps operations that the engine
// carries out before the forward pass (synchronously on the cpu backend; a GPU backend would
// overlap them with the step as §5.3 does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/sequence.h"

namespace blend {

// A page-sized host image of checkpointed slots (laid out as Backend::read_pages writes one
// page) and which of its slots are valid.
struct SlotCheckpoint {
  std::vector<std::byte> image;
  std::vector<uint8_t> saved;  // per slot
};

class BidirectionalPages {
 public:
  BidirectionalPages(int64_t num_pages, int32_t page_size, int64_t page_bytes);

  int32_t page_size() const { return page_size_; }

  // Slots of `page` the sequence uses (from whichever end it fills). Counts every token the
  // sequence holds, computed or not, so the answer bounds what it writes in this step.
  int32_t slots_used(const Sequence& seq, PageId page) const;

  // A page to share: its current holder, and the direction the newcomer fills it in
  // (the opposite of the holder's).
  struct Offer {
    PageId page = -1;
    Sequence* holder = nullptr;
    bool reversed = false;
  };
  // FindBlock: the last page of a running RT sequence that has no BE peer and at least `slots`
  // empty slots, the one with the most.
  Offer find_page_for_be(const std::vector<Sequence*>& running, int32_t slots) const;
  // FindPreemptBlock: a page of a running BE sequence with no RT peer that `may_take(seq,
  // page)` accepts, the one with the most empty slots.
  template <typename MayTake>
  Offer find_page_for_rt(const std::vector<Sequence*>& running, MayTake may_take) const {
    Offer best;
    int32_t best_empty = -1;
    for (Sequence* s : running) {
      if (s->request_class != RequestClass::kBestEffort) continue;
      for (size_t j = 0; j < s->block_table.size(); ++j) {
        const PageId p = s->block_table[j];
        if (rt_[static_cast<size_t>(p)] != nullptr || !may_take(*s, p)) continue;
        const int32_t empty = page_size_ - slots_used(*s, p);
        if (empty > best_empty) best = {p, s, !s->page_reversed(j)}, best_empty = empty;
      }
    }
    return best;
  }

  // Records that `rt` and `be` now both hold `page`.
  void share(PageId page, Sequence* rt, Sequence* be);
  // `seq` no longer holds `page` (moved off it) / any page (finished, preempted, dropped). Its
  // peer stays recorded: the page is then the peer's alone, and may be shared again.
  void unshare(PageId page, const Sequence* seq);
  void forget(const Sequence* seq);

  Sequence* rt_holder(PageId page) const { return rt_[static_cast<size_t>(page)]; }
  Sequence* be_holder(PageId page) const { return be_[static_cast<size_t>(page)]; }

  // Whether the BE holder's next tokens, up to `tokens` in all, would reach the slots of its
  // RT peer on `page` (then the BE must move off the page first).
  bool be_would_collide(PageId page, const Sequence& be, int64_t tokens) const;

  // The RT holder `rt` will write its positions [first, last) (counted within the page) of
  // `page`. Returns the slots of its BE peer that this overwrites and that hold computed K/V
  // not saved yet: the caller copies them into checkpoint_image(be, page) now. When any of the
  // BE's slots is reached, the page enters the preemption table.
  std::vector<int32_t> collide(PageId page, const Sequence& rt, int32_t first, int32_t last);

  // The preemption table (§5.2): the pages a BE sequence must restore before it runs again.
  bool needs_restore(const Sequence& be) const;
  std::vector<PageId> pages_to_restore(const Sequence& be) const;
  // Shared so that a step's pending slot copies stay valid if the entry is dropped meanwhile.
  std::shared_ptr<SlotCheckpoint> checkpoint_image(const Sequence& be, PageId page);
  // Hands over the page's checkpoint to be restored and drops the entry.
  std::shared_ptr<SlotCheckpoint> take_checkpoint(const Sequence& be, PageId page);

  struct Entry {
    PageId page;
    SeqId rt, be;
  };
  std::vector<Entry> preemption_table() const;

  int64_t shared_pages() const { return shared_count_; }  // pages given a second holder
  int64_t checkpointed_slots() const { return checkpointed_slots_; }

  // Aborts when a recorded holder does not hold the page in its block table.
  void check_invariants() const;

 private:
  // The physical slots [lo, hi) that positions [first, last) of `seq` within `page` occupy.
  std::pair<int32_t, int32_t> physical(const Sequence& seq, PageId page, int64_t first,
                                       int64_t last) const;

  int32_t page_size_;
  int64_t page_bytes_;
  // Per page, once it has been shared: its RT and BE holders (null when none).
  std::vector<Sequence*> rt_, be_;
  // Slots [lo, hi) an RT holder that left a page shared with a BE one had used: the prefix
  // cache may still hold that page for those tokens, so its BE holder must not overwrite them.
  std::vector<std::pair<int32_t, int32_t>> reserved_;
  struct Preempted {
    SeqId rt;
    std::shared_ptr<SlotCheckpoint> saved;
  };
  std::map<std::pair<SeqId, PageId>, Preempted> table_;  // (BE id, page) -> checkpoint
  int64_t shared_count_ = 0;
  int64_t checkpointed_slots_ = 0;
};

}  // namespace blend
