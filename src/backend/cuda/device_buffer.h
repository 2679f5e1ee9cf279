// What the cuda backend's host files share (private to backend/cuda): CUDA and cuBLAS status
// checks that throw blend::Error, and DeviceBuffer, GPU memory owned like a vector.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"

namespace blend::cuda {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("cuda backend: ") + what + ": " + cudaGetErrorString(e));
}

inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuda backend: ") + what + ": " + cublasGetStatusString(s));
}

// GPU memory that grows on demand and is freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { reserve(bytes); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), size_(o.size_) {
    o.ptr_ = nullptr;
    o.size_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` bytes; the contents are lost when it grows.
  void* reserve(size_t bytes) {
    if (bytes > size_) {
      cudaFree(ptr_);
      ptr_ = nullptr;
      size_ = 0;
      check_cuda(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256)), "cudaMalloc");
      size_ = bytes;
    }
    return ptr_;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace blend::cuda
