// NanoFlow's nano-batch pipeline on two lanes of the cuda backend (§4.3), and the rates its
// cost model (nano_split.h) is fed, timed on this GPU at load.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/error.h"
#include "core/forward_batch.h"

namespace blend::cuda {
namespace {

// Per-op timing off for a scope: its events record on stream_ alone, and a pipelined step or a
// profiled phase runs on other streams.
class NoOpTiming {
 public:
  explicit NoOpTiming(bool& on) : on_(on), saved_(on) { on = false; }
  ~NoOpTiming() { on_ = saved_; }
  NoOpTiming(const NoOpTiming&) = delete;
  NoOpTiming& operator=(const NoOpTiming&) = delete;

 private:
  bool& on_;
  bool saved_;
};

}  // namespace

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
void CudaBackendImpl::run_nano_batches(const ForwardBatch& batch, size_t cut, float* logits,
                                       GreenSplit* green_split) {
  Lane& lx = lanes_[0];
  Lane& ly = lanes_[1];
  const NoOpTiming no_op_timing(timing_);  // a pipelined step has no per-op times
  LaneStep x = prepare(lx, batch, 0, cut);
  LaneStep y = prepare(ly, batch, cut, batch.chunks.size());
  // With green contexts each lane's GEMM phases and attentions go to its two SM groups'
  // streams, and the decode kernel sizes its splits by its group's SMs; without, everything to
  // the lane's stream, GEMMs under cuBLAS's SM target.
  const bool green = green_split != nullptr;
  for (int i = 0; i < 2; ++i) {
    LaneStep& s = i == 0 ? x : y;
    if (!green) {
      s.blas = s.lane->nano_blas;
      continue;
    }
    s.blas = green_split->lanes[i].blas;
    s.stream = green_split->lanes[i].gemm;
    s.attention_stream = green_split->lanes[i].attention;
    s.scratch.multiprocessors = green_split->partition->sms(1);
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

NanoProfile CudaBackendImpl::measure_nano_profile(int reps) {
  if (reps < 1) throw Error("nano-batch profile: reps must be at least 1");
  if (layers_.size() < 2)
    throw Error("nano-batch profile: a layer's GEMM phase needs a model of two layers or more");
  const int32_t page_size = kv_.page_size;
  const cuda::NanoGrid grid = cuda::nano_profile_grid(multiprocessors_, SmPartition::sm_step(),
                                                      num_pages_ * page_size, page_size);
  cuda::NanoProfile p;
  p.total_sms = multiprocessors_;
  p.layers = static_cast<int32_t>(layers_.size());
  p.prefill_kv_tile = nano_cost_.prefill_kv_tile;
  p.sm_step = grid.gemm_sms.front();
  // The columns: each split's two groups (the driver may round a count up; a count met twice
  // is timed once), then the whole GPU.
  struct Column {
    GreenSplit* split = nullptr;  // null: the whole GPU on lane 0's own stream
    int32_t sms = 0;
  };
  std::vector<Column> gemm_columns, attention_columns;
  for (int32_t g : grid.gemm_sms) {
    GreenSplit& split = green_split(g);
    gemm_columns.push_back({&split, split.partition->sms(0)});
    attention_columns.push_back({&split, split.partition->sms(1)});
  }
  gemm_columns.push_back({nullptr, multiprocessors_});
  attention_columns.push_back({nullptr, multiprocessors_});
  for (std::vector<Column>* columns : {&gemm_columns, &attention_columns}) {
    std::stable_sort(columns->begin(), columns->end(),
                     [](const Column& a, const Column& b) { return a.sms < b.sms; });
    columns->erase(std::unique(columns->begin(), columns->end(),
                               [](const Column& a, const Column& b) { return a.sms == b.sms; }),
                   columns->end());
  }
  for (const Column& c : gemm_columns) p.gemm.sms.push_back(c.sms);
  for (const Column& c : attention_columns) p.attention.sms.push_back(c.sms);

  Lane& lane = lanes_[0];
  struct Events {  // destroyed however the profile ends
    cudaEvent_t e[3] = {nullptr, nullptr, nullptr};
    ~Events() {
      for (cudaEvent_t x : e)
        if (x) cudaEventDestroy(x);
    }
  } events;
  for (cudaEvent_t& e : events.e) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  const cudaEvent_t start = events.e[0], stop = events.e[1], uploaded = events.e[2];
  // Median GPU seconds of `run` on `stream` once it follows the batch upload on lane 0.
  auto timed = [&](cudaStream_t stream, auto run) {
    check_cuda(cudaEventRecord(uploaded, lane.stream), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream, uploaded, 0), "cudaStreamWaitEvent");
    run();  // warm-up (cuBLAS picks its kernels at a shape's first call)
    std::vector<float> ms(static_cast<size_t>(reps));
    for (float& t : ms) {
      check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
      run();
      check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      check_cuda(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1e-3;
  };
  const NoOpTiming no_op_timing(timing_);
  // Layer 1's GEMM phase (the end of layer 0 and the start of layer 1) and layer 0's
  // attention: one layer's worth of each (llama::gemm_phase).
  const int64_t last = static_cast<int64_t>(layers_.size());
  for (int32_t tokens : grid.gemm_tokens) {
    p.gemm.work.push_back(tokens);
    ForwardBatch batch = synthetic_batch(1, tokens, 0, page_size);
    batch.chunks[0].wants_logits = false;
    LaneStep s = prepare(lane, batch, 0, 1);
    for (const Column& c : gemm_columns) {
      s.stream = c.split ? c.split->lanes[0].gemm : lane.stream;
      s.blas = c.split ? c.split->lanes[0].blas : lane.blas;
      StepOps ops{*this, s, nullptr};
      p.gemm.seconds.push_back(timed(s.stream, [&] { llama::gemm_phase(ops, 1, last); }));
    }
  }
  for (int32_t sequences : grid.decode_sequences) {
    const ForwardBatch batch = synthetic_batch(sequences, 1, grid.decode_context, page_size);
    p.attention.work.push_back(
        sequences * cuda::nano_attention_reads({.tokens = 1, .cached = grid.decode_context},
                                               p.prefill_kv_tile));
    LaneStep s = prepare(lane, batch, 0, batch.chunks.size());
    for (const Column& c : attention_columns) {
      s.attention_stream = c.split ? c.split->lanes[0].attention : lane.stream;
      s.scratch.multiprocessors = c.sms;
      StepOps ops{*this, s, nullptr};
      p.attention.seconds.push_back(timed(s.attention_stream, [&] { ops.attention(0); }));
    }
  }
  check_cuda(cudaDeviceSynchronize(), "nano-batch profile");
  p.check();
  return p;
}

}  // namespace blend::cuda
