// NanoFlow's nano-batch pipeline on two lanes of the cuda backend (§4.3), and the rates its
// cost model (nano_split.h) is fed, timed on this GPU at load.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"

namespace blend::cuda {

// NanoFlow §4.3's overlap with two nano-batches X (chunks [0, cut)) and Y (the rest), each on
// its own lane. Per nano-batch the layers alternate GEMM phases G(l) (llama::gemm_phase: the
// end of layer l-1, the start of layer l) and attention phases A(l). Events order the GEMM phases
// X.G(0) < Y.G(0) < X.G(1) < Y.G(1) < ..., so each has the GPU's SMs, and each attention phase
// runs beside the other nano-batch's GEMM phase. Nothing else is shared: the nano-batches hold
// different sequences, whose KV writes go to different slots (the radix cache holds only KV
// computed in earlier steps), and each lane has its own activations and cuBLAS handle.
void CudaBackendImpl::run_nano_batches(const ForwardBatch& batch, size_t cut, float* logits) {
  Lane& lx = lanes_[0];
  Lane& ly = lanes_[1];
  // Per-op timing records events on stream_ alone: a pipelined step has no per-op times.
  struct NoMarks {
    bool& on;
    bool saved;
    ~NoMarks() { on = saved; }
  } no_marks{timing_, timing_};
  timing_ = false;
  LaneStep x = prepare(lx, batch, 0, cut);
  LaneStep y = prepare(ly, batch, cut, batch.chunks.size());
  x.blas = lx.nano_blas;
  y.blas = ly.nano_blas;
  const size_t layers = layers_.size();
  cudaEvent_t* gx = phase_events_.data();               // [layers + 1]: X.G(l) done
  cudaEvent_t* gy = phase_events_.data() + layers + 1;  // [layers + 1]: Y.G(l) done
  cudaEvent_t joined = phase_events_[2 * layers + 2], started = phase_events_[2 * layers + 3];
  // Y's logits follow X's rows.
  StepOps ox{*this, x, logits}, oy{*this, y, logits + x.view.num_logit_rows * config_.vocab_size};
  auto record = [](cudaEvent_t e, cudaStream_t st) {
    check_cuda(cudaEventRecord(e, st), "cudaEventRecord");
  };
  auto wait = [](cudaStream_t st, cudaEvent_t e) {
    check_cuda(cudaStreamWaitEvent(st, e, 0), "cudaStreamWaitEvent");
  };
  record(started, lx.stream);  // Y follows what stream_ had queued before this step
  wait(ly.stream, started);
  const auto n = static_cast<int64_t>(layers);
  for (size_t l = 0; l <= layers; ++l) {
    const auto phase = static_cast<int64_t>(l);
    if (l > 0) wait(lx.stream, gy[l - 1]);
    llama::gemm_phase(ox, phase, n);
    record(gx[l], lx.stream);
    if (l < layers) ox.attention(phase);
    wait(ly.stream, gx[l]);
    llama::gemm_phase(oy, phase, n);
    record(gy[l], ly.stream);
    if (l < layers) oy.attention(phase);
  }
  record(joined, ly.stream);
  wait(lx.stream, joined);  // stream_ (lane 0) now follows all of Y's work
}

cuda::NanoCost CudaBackendImpl::measure_nano_cost() {
  // The GEMM rate per token and one weight read, from layer 0's gate/up projection timed at a
  // weight-bound and a compute-bound row count and scaled to the model by its parameters;
  // attention's rate per cached token from the weight-read rate (decode attention reads its KV
  // at about the rate a GEMM reads weights: docs/BENCHMARKS.md, "what limits decode attention").
  const Layer& l = layers_[0];
  const int64_t h = config_.hidden_size, f = config_.intermediate_size;
  const int64_t big = 2048, small = 16;
  Lane& lane = lanes_[0];
  void* in = lane.xn.reserve(big * h * elem_size(elem_));
  check_cuda(cudaMemsetAsync(in, 0, big * h * elem_size(elem_), lane.stream), "cudaMemset");
  auto* out = static_cast<float*>(lane.gu.reserve(big * 2 * f * 4));
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  auto time_gemm = [&](int64_t m) {
    gemm(lane.blas, in, m, l.gate_up, 2 * f, h, out, false);  // warm-up
    std::vector<float> ms(5);
    for (float& t : ms) {
      check_cuda(cudaEventRecord(start, lane.stream), "cudaEventRecord");
      gemm(lane.blas, in, m, l.gate_up, 2 * f, h, out, false);
      check_cuda(cudaEventRecord(stop, lane.stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      check_cuda(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1e-3;
  };
  const double small_s = time_gemm(small), big_s = time_gemm(big);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const double block_params = static_cast<double>(2 * f * h);
  const double model_params = static_cast<double>(config_.num_matmul_parameters());
  const double scale = model_params / block_params;
  const double weight_bytes_per_s = block_params * elem_size(elem_) / small_s;
  cuda::NanoCost cost;
  cost.gemm_seconds_per_token = big_s / static_cast<double>(big) * scale;
  cost.weight_seconds = small_s * scale;
  cost.kv_seconds_per_token = static_cast<double>(kv_bytes_per_token()) / weight_bytes_per_s;
  return cost;
}

}  // namespace blend::cuda
