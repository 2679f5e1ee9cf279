// KvManager — the one owner of the KV pages a scheduler hands out (issue 24): allocation (with
// eviction of idle prefix-cache pages), growing a sequence's block table, starting a sequence
// from its cached prefix (kv/radix_cache), and BROS's bidirectional pages (§5.2: sharing a page
// with the other class, lazy checkpoints, restores, moves; kv/bidirectional_pages). It decides
// page mechanics only: which sequences run, and which one is preempted when pages run out, is
// the scheduler's policies' business. The page copies a step needs before its forward pass are
// appended to a KvStepOps, which the engine hands to the backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/sequence.h"
#include "kv/bidirectional_pages.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"

namespace blend {

// Page operations to run before a step's forward pass, in this order.
struct KvStepOps {
  // 1. BROS lazy checkpointing: copy `count` slots from `first` of `page` into the image.
  struct SlotCopy {
    PageId page;
    int32_t first, count;
    std::shared_ptr<SlotCheckpoint> image;
  };
  std::vector<SlotCopy> checkpoints;
  // 2. Copy page `first` into `second`, then release `first` (the operation holds a reference
  //    on it): copy-on-write of partly matched cached pages, and BE pages restored or moved off
  //    a shared page. A `second` of -1 only releases `first` (its destination was dropped).
  std::vector<std::pair<PageId, PageId>> copies;
  // 3. Write a restored page's checkpointed slots back (every slot the image marks saved).
  std::vector<std::pair<PageId, std::shared_ptr<SlotCheckpoint>>> restores;
};

class KvManager {
 public:
  // `cache` may be null (prefix caching off); it must outlive the manager. `page_bytes` sizes
  // the BROS checkpoint images (bidirectional pages only).
  KvManager(PagePool& pool, RadixCache* cache, bool bidirectional, int64_t page_bytes);

  // What BROS page sharing needs to know of the step being planned, when the pool is empty:
  // the running sequences (whose pages may be shared) and which of them compute in this step
  // (an RT sequence never takes the page of a BE sequence that does).
  struct Peers {
    const std::vector<Sequence*>& running;
    std::function<bool(const Sequence&)> in_step;
  };

  // Pages for seq->num_computed + new_tokens: new pages, or with bidirectional KV the restores,
  // moves, shared pages and checkpoints that computing them needs. False when there is no room.
  bool grow(Sequence* seq, int32_t new_tokens, KvStepOps& ops, const Peers& peers);
  // Starts a sequence that holds no pages from the longest cached prefix of its tokens (a partly
  // matching last page is copied). False when another sequence is computing that prefix's next
  // page: the sequence should wait for it (nothing was retained).
  bool reuse_cached_prefix(Sequence* seq, KvStepOps& ops);
  // The sequence now computes its tokens past the first `cached_tokens` (the prefix cache
  // learns who will compute which pages, for intra-batch sharing).
  void claim(const Sequence& seq, int32_t cached_tokens);
  // Back to no KV at all. Copies and restores in `pending` (the step being planned, or null)
  // into the dropped pages are cancelled: the pages may go to another sequence in this step.
  void drop(Sequence* seq, KvStepOps* pending);
  // Undoes the copies from index `from` on (an admission that found no room after all).
  void undo_copies(KvStepOps& ops, size_t from);
  // A step computed `seq`'s tokens: offers its computed pages to the prefix cache (which may
  // swap a page for an equal one it already holds).
  void computed(Sequence& seq);
  // The sequence finished: its pages go to the prefix cache (or back to the pool).
  void release_finished(Sequence* seq);

  // BROS Alg. 1's preemptible BE blocks: the pages of the running BE sequences that an RT
  // request could take, by sharing one (no RT peer yet) or by dropping its holder (nobody else
  // holds it; a page the prefix cache also holds counts, since the drop leaves it idle there).
  int64_t pages_best_effort_could_yield(const std::vector<Sequence*>& running) const;
  // BROS: pages of a BE sequence that must be restored before it runs again.
  bool needs_restore(const Sequence& seq) const;
  int64_t pages_to_restore(const Sequence& seq) const;

  PagePool& pool() { return pool_; }
  const PagePool& pool() const { return pool_; }
  RadixCache* cache() const { return cache_; }
  const BidirectionalPages* bidirectional() const { return bidir_.get(); }
  // Pages restored after a checkpoint, and pages a BE sequence moved off because its RT peer
  // needed the slots.
  int64_t restored_pages() const { return restored_pages_; }
  int64_t moved_pages() const { return moved_pages_; }
  void check_invariants() const;

 private:
  bool allocate(int64_t count, std::vector<PageId>& out);  // evicts idle cached pages if needed
  bool prepare_best_effort(Sequence* seq, int32_t new_tokens, KvStepOps& ops);
  bool restore(Sequence* seq, KvStepOps& ops);
  bool share_pages(Sequence* seq, int64_t need, int32_t new_tokens, const Peers& peers);
  void checkpoint_overwritten(const Sequence* seq, int32_t new_tokens, KvStepOps& ops);

  PagePool& pool_;
  RadixCache* cache_;
  std::unique_ptr<BidirectionalPages> bidir_;
  int64_t restored_pages_ = 0;
  int64_t moved_pages_ = 0;
};

}  // namespace blend
