// PagePool — the KV cache's pages as ids (DESIGN.md §2 kv/). The backend owns the storage; the
// pool decides which page belongs to whom. Pages are reference counted so that later layers
// (radix prefix cache, copy-on-write, BROS bidirectional pages) can share them: a page returns
// to the free list only when its last holder releases it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/types.h"

namespace blend {

class PagePool {
 public:
  PagePool(int64_t num_pages, int32_t page_size);

  int32_t page_size() const { return page_size_; }
  int64_t num_pages() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_pages() - num_free(); }
  int64_t peak_used() const { return peak_used_; }

  // Appends `count` fresh pages (refcount 1) to `out`; all or nothing.
  bool allocate(int64_t count, std::vector<PageId>& out);
  void retain(PageId page);
  void release(PageId page);
  void release_all(std::vector<PageId>& pages);  // releases and clears
  int32_t refcount(PageId page) const { return refcount_[static_cast<size_t>(page)]; }

  // Pages the prefix cache holds (it keeps one reference on each). A cached page whose only
  // holder is the cache is idle: the cache can evict it at once, so admission counts it as
  // free. The count is kept on every retain/release, O(1).
  void set_cached(PageId page, bool cached);
  bool is_cached(PageId page) const { return cached_[static_cast<size_t>(page)] != 0; }
  int64_t num_cached_idle() const { return num_cached_idle_; }
  // Free pages plus idle cached ones: what an allocation can get after evicting.
  int64_t num_available() const { return num_free() + num_cached_idle_; }

  // Pages needed to hold `tokens` tokens.
  int64_t pages_for(int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }

  // Aborts if the free list and the reference counts disagree (a leak or a double free).
  void check_invariants() const;

 private:
  int32_t page_size_;
  std::vector<int32_t> refcount_;
  std::vector<uint8_t> cached_;
  int64_t num_cached_idle_ = 0;
  std::vector<PageId> free_;  // LIFO: recently freed pages are reused first (warm in cache)
  int64_t peak_used_ = 0;
};

}  // namespace blend
