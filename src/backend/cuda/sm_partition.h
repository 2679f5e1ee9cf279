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
  // A new event of `group`'s context, the partition's to destroy: an event is recorded on a
  // stream of its own context (cuEventRecord), so what a group's streams record is made here.
  // Any stream may wait on it. Without `timing`, cudaEventDisableTiming.
  cudaEvent_t make_event(int group, bool timing);

  // `group`'s context current on this thread for the scope (pushed, then popped), so that what
  // is made meanwhile (a cuBLAS handle for the group's streams) belongs to it.
  class Current {
   public:
    Current(const SmPartition& partition, int group);
    ~Current();
    Current(const Current&) = delete;
    Current& operator=(const Current&) = delete;

   private:
    const SmPartition& partition_;
  };

 private:
  struct Driver;
  void release();  // events and streams, then contexts
  std::unique_ptr<Driver> driver_;
  void* contexts_[2] = {nullptr, nullptr};  // CUgreenCtx
  int sms_[2] = {0, 0};
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace blend::cuda
