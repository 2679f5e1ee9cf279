#include "backend/cuda/sm_partition.h"

#include <cuda.h>

#include <string>

#include "core/error.h"

namespace blend::cuda {

// The driver functions the partition uses, from the runtime's entry points (CUDA 12.4 ABI).
struct SmPartition::Driver {
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*get_dev_resource)(CUdevice, CUdevResource*, CUdevResourceType) = nullptr;
  CUresult (*split_by_count)(CUdevResource*, unsigned int*, const CUdevResource*, CUdevResource*,
                             unsigned int, unsigned int) = nullptr;
  CUresult (*generate_desc)(CUdevResourceDesc*, CUdevResource*, unsigned int) = nullptr;
  CUresult (*green_ctx_create)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned int) = nullptr;
  CUresult (*green_ctx_destroy)(CUgreenCtx) = nullptr;
  CUresult (*green_stream_create)(CUstream*, CUgreenCtx, unsigned int, int) = nullptr;
  CUresult (*stream_destroy)(CUstream) = nullptr;
  CUresult (*ctx_from_green)(CUcontext*, CUgreenCtx) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  CUresult (*event_create)(CUevent*, unsigned int) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;

  Driver() {
    load(device_get, "cuDeviceGet");
    load(get_dev_resource, "cuDeviceGetDevResource");
    load(split_by_count, "cuDevSmResourceSplitByCount");
    load(generate_desc, "cuDevResourceGenerateDesc");
    load(green_ctx_create, "cuGreenCtxCreate");
    load(green_ctx_destroy, "cuGreenCtxDestroy");
    load(green_stream_create, "cuGreenCtxStreamCreate");
    load(stream_destroy, "cuStreamDestroy");
    load(ctx_from_green, "cuCtxFromGreenCtx");
    load(ctx_push, "cuCtxPushCurrent");
    load(ctx_pop, "cuCtxPopCurrent");
    load(event_create, "cuEventCreate");
    load(event_destroy, "cuEventDestroy");
  }
  template <typename F>
  static void load(F& fn, const char* symbol) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion(symbol, &p, 12040, cudaEnableDefault, &found);
    if (e != cudaSuccess)
      throw Error(std::string("cuda backend: SM partition: cannot reach the driver's ") + symbol +
                  ": " + cudaGetErrorString(e));
    if (found != cudaDriverEntryPointSuccess || !p)
      throw Error(std::string("cuda backend: SM partition: the driver has no ") + symbol +
                  " (green contexts need CUDA 12.4 or later)");
    fn = reinterpret_cast<F>(p);
  }
};

namespace {

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    throw Error(std::string("cuda backend: SM partition: ") + what + " failed (CUresult " +
                std::to_string(static_cast<int>(r)) + ")");
}

}  // namespace

int SmPartition::sm_step() {
  const Driver driver;
  int ordinal = 0;
  if (cudaGetDevice(&ordinal) != cudaSuccess)
    throw Error("cuda backend: SM partition: no current device");
  CUdevice device = 0;
  check(driver.device_get(&device, ordinal), "cuDeviceGet");
  CUdevResource all{};
  check(driver.get_dev_resource(device, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
  CUdevResource smallest{}, rest{};
  unsigned int count = 1;
  check(driver.split_by_count(&smallest, &count, &all, &rest, 0, 1), "cuDevSmResourceSplitByCount");
  if (count != 1 || smallest.sm.smCount == 0)
    throw Error("cuda backend: SM partition: the driver makes no group of this GPU's SMs");
  return static_cast<int>(smallest.sm.smCount);
}

SmPartition::SmPartition(int first_sms) {
  if (first_sms < 1) throw Error("cuda backend: SM partition: the first group needs an SM");
  driver_ = std::make_unique<Driver>();
  try {
    int ordinal = 0;
    if (cudaGetDevice(&ordinal) != cudaSuccess)
      throw Error("cuda backend: SM partition: no current device");
    CUdevice device = 0;
    check(driver_->device_get(&device, ordinal), "cuDeviceGet");
    CUdevResource all{};
    check(driver_->get_dev_resource(device, &all, CU_DEV_RESOURCE_TYPE_SM),
          "cuDeviceGetDevResource");
    if (static_cast<int>(all.sm.smCount) <= first_sms)
      throw Error("cuda backend: SM partition: " + std::to_string(first_sms) + " SMs of the " +
                  std::to_string(all.sm.smCount) + " leave none for the second group");
    CUdevResource groups[2]{};
    unsigned int count = 1;
    check(driver_->split_by_count(&groups[0], &count, &all, &groups[1], 0,
                                  static_cast<unsigned int>(first_sms)),
          "cuDevSmResourceSplitByCount");
    if (count != 1 || groups[1].sm.smCount == 0)
      throw Error("cuda backend: SM partition: the driver could not split " +
                  std::to_string(all.sm.smCount) + " SMs at " + std::to_string(first_sms));
    for (int g = 0; g < 2; ++g) {
      CUdevResourceDesc desc{};
      check(driver_->generate_desc(&desc, &groups[g], 1), "cuDevResourceGenerateDesc");
      CUgreenCtx ctx = nullptr;
      check(driver_->green_ctx_create(&ctx, desc, device, CU_GREEN_CTX_DEFAULT_STREAM),
            "cuGreenCtxCreate");
      contexts_[g] = ctx;
      sms_[g] = static_cast<int>(groups[g].sm.smCount);
    }
  } catch (...) {
    release();
    throw;
  }
}

SmPartition::~SmPartition() {
  release();
}

void SmPartition::release() {
  if (!driver_) return;
  for (cudaStream_t s : streams_) {
    cudaStreamSynchronize(s);
    driver_->stream_destroy(reinterpret_cast<CUstream>(s));
  }
  streams_.clear();
  for (cudaEvent_t e : events_) driver_->event_destroy(reinterpret_cast<CUevent>(e));
  events_.clear();
  for (void*& ctx : contexts_)
    if (ctx) driver_->green_ctx_destroy(static_cast<CUgreenCtx>(ctx)), ctx = nullptr;
}

SmPartition::Current::Current(const SmPartition& partition, int group) : partition_(partition) {
  CUcontext ctx = nullptr;
  check(
      partition.driver_->ctx_from_green(&ctx, static_cast<CUgreenCtx>(partition.contexts_[group])),
      "cuCtxFromGreenCtx");
  check(partition.driver_->ctx_push(ctx), "cuCtxPushCurrent");
}

SmPartition::Current::~Current() {
  CUcontext popped = nullptr;
  partition_.driver_->ctx_pop(&popped);
}

cudaEvent_t SmPartition::make_event(int group, bool timing) {
  const Current current(*this, group);
  CUevent e = nullptr;
  check(driver_->event_create(&e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING),
        "cuEventCreate");
  events_.push_back(reinterpret_cast<cudaEvent_t>(e));
  return events_.back();
}

cudaStream_t SmPartition::make_stream(int group) {
  CUstream s = nullptr;
  check(driver_->green_stream_create(&s, static_cast<CUgreenCtx>(contexts_[group]),
                                     CU_STREAM_NON_BLOCKING, 0),
        "cuGreenCtxStreamCreate");
  streams_.push_back(reinterpret_cast<cudaStream_t>(s));
  return streams_.back();
}

}  // namespace blend::cuda
