#include "kv/page_pool.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace blend {

PagePool::PagePool(int64_t num_pages, int32_t page_size) : page_size_(page_size) {
  if (page_size <= 0) throw Error("page size must be positive");
  if (num_pages <= 0) throw Error("the KV cache must hold at least one page");
  refcount_.assign(static_cast<size_t>(num_pages), 0);
  cached_.assign(static_cast<size_t>(num_pages), 0);
  free_.reserve(static_cast<size_t>(num_pages));
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<PageId>(p));
}

bool PagePool::allocate(int64_t count, std::vector<PageId>& out) {
  if (count > num_free()) return false;
  for (int64_t i = 0; i < count; ++i) {
    const PageId p = free_.back();
    free_.pop_back();
    refcount_[static_cast<size_t>(p)] = 1;
    out.push_back(p);
  }
  if (num_used() > peak_used_) peak_used_ = num_used();
  return true;
}

void PagePool::retain(PageId page) {
  int32_t& rc = refcount_[static_cast<size_t>(page)];
  if (rc <= 0) {
    std::fprintf(stderr, "PagePool: retain of free page %d\n", page);
    std::abort();
  }
  if (rc == 1 && cached_[static_cast<size_t>(page)]) --num_cached_idle_;
  ++rc;
}

void PagePool::release(PageId page) {
  int32_t& rc = refcount_[static_cast<size_t>(page)];
  if (rc <= 0) {
    std::fprintf(stderr, "PagePool: double free of page %d\n", page);
    std::abort();
  }
  --rc;
  if (rc == 0) {
    if (cached_[static_cast<size_t>(page)]) {
      std::fprintf(stderr, "PagePool: cached page %d lost its last reference\n", page);
      std::abort();
    }
    free_.push_back(page);
  } else if (rc == 1 && cached_[static_cast<size_t>(page)]) {
    ++num_cached_idle_;
  }
}

void PagePool::set_cached(PageId page, bool cached) {
  const auto i = static_cast<size_t>(page);
  if (refcount_[i] <= 0) {
    std::fprintf(stderr, "PagePool: set_cached on free page %d\n", page);
    std::abort();
  }
  if ((cached_[i] != 0) == cached) return;
  cached_[i] = cached ? 1 : 0;
  if (refcount_[i] == 1) num_cached_idle_ += cached ? 1 : -1;
}

void PagePool::release_all(std::vector<PageId>& pages) {
  for (PageId p : pages) release(p);
  pages.clear();
}

void PagePool::check_invariants() const {
  std::vector<char> is_free(refcount_.size(), 0);
  for (PageId p : free_) {
    if (is_free[static_cast<size_t>(p)] || refcount_[static_cast<size_t>(p)] != 0) {
      std::fprintf(stderr, "PagePool: page %d on the free list twice or still referenced\n", p);
      std::abort();
    }
    is_free[static_cast<size_t>(p)] = 1;
  }
  int64_t idle = 0;
  for (size_t p = 0; p < refcount_.size(); ++p) {
    if (!is_free[p] && refcount_[p] <= 0) {
      std::fprintf(stderr, "PagePool: page %zu leaked (not free, refcount %d)\n", p, refcount_[p]);
      std::abort();
    }
    if (cached_[p] && refcount_[p] == 1) ++idle;
  }
  if (idle != num_cached_idle_) {
    std::fprintf(stderr, "PagePool: %lld idle cached pages counted, %lld found\n",
                 static_cast<long long>(num_cached_idle_), static_cast<long long>(idle));
    std::abort();
  }
}

}  // namespace blend
