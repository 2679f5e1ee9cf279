// The GPU's SMs split in two with green contexts (CUDA 12.4+), for NanoFlow §5.1's execution-
// unit scheduling: kernels launched into a group's streams run only on that group's SMs, so the
// nano-batch pipeline's GEMM phases and attention phases overlap without competing for SMs,
// whatever kernel (cuBLAS's or ours) they launch. The driver's functions are taken through the
// runtime's entry points, so blend links no libcuda and a machine without green contexts fails
// here, at load, with the reason. Private to backend/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace blend::cuda {

class SmPartition {
 public:
  // Group 0 with at least `first_sms` SMs (the driver rounds up to its SM granularity), group 1
  // with the rest. Throws blend::Error when the driver cannot split the SMs so.
  explicit SmPartition(int first_sms);
  ~SmPartition();
  SmPartition(const SmPartition&) = delete;
  SmPartition& operator=(const SmPartition&) = delete;

  // The SM counts the driver splits this GPU at: the smallest first group it makes (every
  // count a split may be asked for is then a multiple of it). Throws as the constructor.
  static int sm_step();

  int sms(int group) const { return sms_[group]; }
  // A new non-blocking stream whose kernels run on `group`'s SMs; the partition owns it.
  cudaStream_t make_stream(int group);

 private:
  struct Driver;
  void release();  // streams, then contexts
  std::unique_ptr<Driver> driver_;
  void* contexts_[2] = {nullptr, nullptr};  // CUgreenCtx
  int sms_[2] = {0, 0};
  std::vector<cudaStream_t> streams_;
};

}  // namespace blend::cuda
