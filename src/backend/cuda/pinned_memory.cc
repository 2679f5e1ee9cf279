#include "backend/cuda/pinned_memory.h"

#include <cuda_runtime_api.h>

#include <new>

namespace blend::cuda {

PinnedHostMemory::~PinnedHostMemory() {
  for (auto& [bytes, p] : cache_) cudaFreeHost(p);
}

size_t PinnedHostMemory::pinned_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_;
}

size_t PinnedHostMemory::reused_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

size_t PinnedHostMemory::pageable_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pageable_blocks_;
}

void* PinnedHostMemory::do_allocate(size_t bytes, size_t alignment) {
  if (bytes == 0) bytes = 1;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = cache_.find(bytes); it != cache_.end()) {
    void* p = it->second;
    cache_.erase(it);
    cached_bytes_ -= bytes;
    ++reused_;
    return p;
  }
  // cudaMallocHost's blocks are page-aligned: any alignment an allocator asks for up to a page.
  void* p = nullptr;
  if (alignment <= 4096 && cudaMallocHost(&p, bytes) == cudaSuccess && p) {
    ++pinned_;
    return p;
  }
  cudaGetLastError();  // clear a refusal: the block comes from the heap instead
  p = ::operator new (bytes, std::align_val_t{alignment});
  pageable_.insert(p);
  ++pageable_blocks_;
  return p;
}

void PinnedHostMemory::do_deallocate(void* p, size_t bytes, size_t alignment) {
  if (bytes == 0) bytes = 1;
  std::lock_guard<std::mutex> lock(mu_);
  if (pageable_.erase(p)) {
    ::operator delete (p, std::align_val_t{alignment});
    return;
  }
  if (cached_bytes_ + bytes <= cache_cap_) {
    cache_.emplace(bytes, p);
    cached_bytes_ += bytes;
    return;
  }
  cudaFreeHost(p);
}

}  // namespace blend::cuda
