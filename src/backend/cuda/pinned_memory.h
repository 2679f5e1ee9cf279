// PinnedHostMemory — page-locked host memory for the KV host tier (Backend::host_memory, the
// issue's "host tier in pinned memory"): copies between it and the device are DMA at the link's
// speed, where pageable memory goes through the driver's staging buffers at a fraction of it.
//
// Promises:
//  - allocate() returns page-locked memory (cudaMallocHost); where the driver refuses (no GPU,
//    or too much locked already) it returns ordinary heap memory instead, which the copies
//    read and write at the pageable speed: the tier still works, never fails on it;
//  - pinning is slow (the driver locks the pages one by one), and the tier allocates and frees
//    entries of a few sizes over and over, so freed blocks are kept by size for reuse, up to
//    `cache_bytes` in all; the rest go back at once;
//  - thread-safe; the destructor frees the kept blocks. Every block handed out must come back
//    before it runs (the engine drops its tiers before its backend).
#pragma once

#include <cstddef>
#include <map>
#include <memory_resource>
#include <mutex>
#include <unordered_set>

namespace blend::cuda {

class PinnedHostMemory final : public std::pmr::memory_resource {
 public:
  explicit PinnedHostMemory(size_t cache_bytes = size_t{1} << 30) : cache_cap_(cache_bytes) {}
  ~PinnedHostMemory() override;
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;

  // Blocks pinned so far, blocks reused from the cache, and blocks given from the heap because
  // pinning failed (for tests and the run's report).
  size_t pinned_blocks() const;
  size_t reused_blocks() const;
  size_t pageable_blocks() const;

 private:
  void* do_allocate(size_t bytes, size_t alignment) override;
  void do_deallocate(void* p, size_t bytes, size_t alignment) override;
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }

  mutable std::mutex mu_;
  std::multimap<size_t, void*> cache_;  // freed blocks by size
  size_t cache_cap_, cached_bytes_ = 0;
  std::unordered_set<void*> pageable_;  // heap blocks handed out, not pinned
  size_t pinned_ = 0, reused_ = 0, pageable_blocks_ = 0;
};

}  // namespace blend::cuda
