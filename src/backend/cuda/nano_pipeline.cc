// NanoFlow's nano-batch pipeline on two lanes of the cuda backend (§4.3), and the rates its
// cost model (nano_split.h) is fed, timed on this GPU at load.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
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
// With BLEND_CUDA_NANO_SM_SPLIT=green (NanoFlow §5.1), a lane's GEMM phases and its attentions
// run on two streams of two SM groups (sm_partition.h), ordered by events: X.A(l) after X.G(l),
// X.G(l+1) after X.A(l), and the same for Y; the GEMM phases still take turns. Then an
// attention and the other lane's GEMMs never share an SM.
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
  // With green contexts each lane's GEMM phases and attentions go to its two SM groups'
  // streams; without, everything to the lane's stream, GEMMs under cuBLAS's SM target.
  const bool green = sm_partition_ != nullptr;
  for (auto [s, lane] : {std::pair{&x, &lx}, std::pair{&y, &ly}}) {
    s->blas = green ? lane->green_blas : lane->nano_blas;
    if (green) {
      s->stream = lane->gemm_stream;
      s->attention_stream = lane->attention_stream;
    }
  }
  const size_t layers = layers_.size(), n = layers + 1;
  cudaEvent_t* gx = phase_events_.data();          // X.G(l) done
  cudaEvent_t* gy = phase_events_.data() + n;      // Y.G(l) done
  cudaEvent_t* ax = phase_events_.data() + 2 * n;  // X.A(l) done (green only)
  cudaEvent_t* ay = phase_events_.data() + 3 * n;  // Y.A(l) done (green only)
  cudaEvent_t joined = phase_events_[4 * n], started = phase_events_[4 * n + 1];
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
  if (green) {  // the group streams follow their lane's stream (its batch upload included)
    record(joined, ly.stream);  // reused: a wait takes the event as recorded at the call
    for (cudaStream_t st : {x.stream, x.attention_stream}) wait(st, started);
    for (cudaStream_t st : {y.stream, y.attention_stream}) wait(st, joined);
  }
  const auto last = static_cast<int64_t>(layers);
  // One lane's phase l: its GEMM phase once `turn` (the other lane's GEMM phase before it) and,
  // green, its own attention l-1 are done; then its attention l.
  auto lane_phase = [&](StepOps& ops, const LaneStep& s, cudaEvent_t* g, cudaEvent_t* a,
                        cudaEvent_t turn, size_t l) {
    if (turn) wait(s.stream, turn);
    if (green && l > 0) wait(s.stream, a[l - 1]);
    llama::gemm_phase(ops, static_cast<int64_t>(l), last);
    record(g[l], s.stream);
    if (l == layers) return;
    if (green) wait(s.attention_stream, g[l]);
    ops.attention(static_cast<int64_t>(l));
    if (green) record(a[l], s.attention_stream);
  };
  for (size_t l = 0; l <= layers; ++l) {
    lane_phase(ox, x, gx, ax, l > 0 ? gy[l - 1] : nullptr, l);
    lane_phase(oy, y, gy, ay, gx[l], l);
  }
  record(joined, y.stream);
  wait(lx.stream, joined);  // stream_ (lane 0) now follows all of Y's work
  if (green) {
    wait(lx.stream, gx[layers]);  // ... and X's, which ran on its groups' streams
    wait(ly.stream, joined);      // Y's next batch upload waits for this step's Y
  }
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
