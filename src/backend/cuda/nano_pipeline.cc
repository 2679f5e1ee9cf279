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
  // Phase ends. Green, the split's: an event is recorded on a stream of its own context, and
  // each group's streams are of the group's green context (any stream may wait on any event).
  const size_t layers = layers_.size(), n = layers + 1;
  cudaEvent_t* gx = green ? green_split->lanes[0].gemm_done.data() : phase_events_.data();
  cudaEvent_t* gy = green ? green_split->lanes[1].gemm_done.data() : phase_events_.data() + n;
  cudaEvent_t* ax = green ? green_split->lanes[0].attention_done.data() : nullptr;
  cudaEvent_t* ay = green ? green_split->lanes[1].attention_done.data() : nullptr;
  // Recorded on the lanes' own streams only (the primary context's).
  cudaEvent_t joined = phase_events_[2 * n], started = phase_events_[2 * n + 1];
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
  if (!green) {
    record(joined, y.stream);
    wait(lx.stream, joined);  // stream_ (lane 0) now follows all of Y's work
    return;
  }
  // Each lane's last GEMM phase (the head) follows all its work: stream_ waits for both, and
  // Y's next batch upload for this step's Y.
  wait(lx.stream, gx[layers]);
  wait(lx.stream, gy[layers]);
  wait(ly.stream, gy[layers]);
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
  Lane& lane = lanes_[0];
  struct Events {  // the whole GPU's timing events, destroyed however the profile ends
    cudaEvent_t e[3] = {nullptr, nullptr, nullptr};
    ~Events() {
      for (cudaEvent_t x : e)
        if (x) cudaEventDestroy(x);
    }
  } events;
  for (cudaEvent_t& e : events.e) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  const cudaEvent_t uploaded = events.e[2];
  // The columns: each split's two groups (the driver may round a count up; a count met twice
  // is timed once), then the whole GPU. A column's timing events are of its stream's context.
  struct Column {
    int32_t sms = 0;
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;  // GEMM columns
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  std::vector<Column> gemm_columns, attention_columns;
  for (int32_t g : grid.gemm_sms) {
    GreenSplit& split = green_split(g);
    SmPartition& partition = *split.partition;
    gemm_columns.push_back({partition.sms(0), split.lanes[0].gemm, split.lanes[0].blas,
                            partition.make_event(0, true), partition.make_event(0, true)});
    attention_columns.push_back({partition.sms(1), split.lanes[0].attention, nullptr,
                                 partition.make_event(1, true), partition.make_event(1, true)});
  }
  gemm_columns.push_back({multiprocessors_, lane.stream, lane.blas, events.e[0], events.e[1]});
  attention_columns.push_back({multiprocessors_, lane.stream, nullptr, events.e[0], events.e[1]});
  for (std::vector<Column>* columns : {&gemm_columns, &attention_columns}) {
    std::stable_sort(columns->begin(), columns->end(),
                     [](const Column& a, const Column& b) { return a.sms < b.sms; });
    columns->erase(std::unique(columns->begin(), columns->end(),
                               [](const Column& a, const Column& b) { return a.sms == b.sms; }),
                   columns->end());
  }
  for (const Column& c : gemm_columns) p.gemm.sms.push_back(c.sms);
  for (const Column& c : attention_columns) p.attention.sms.push_back(c.sms);

  // Median GPU seconds of `run` on column c's stream once it follows the batch upload on
  // lane 0.
  auto timed = [&](const Column& c, auto run) {
    check_cuda(cudaEventRecord(uploaded, lane.stream), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(c.stream, uploaded, 0), "cudaStreamWaitEvent");
    run();  // warm-up (cuBLAS picks its kernels at a shape's first call)
    std::vector<float> ms(static_cast<size_t>(reps));
    for (float& t : ms) {
      check_cuda(cudaEventRecord(c.start, c.stream), "cudaEventRecord");
      run();
      check_cuda(cudaEventRecord(c.stop, c.stream), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(c.stop), "cudaEventSynchronize");
      check_cuda(cudaEventElapsedTime(&t, c.start, c.stop), "cudaEventElapsedTime");
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
      s.stream = c.stream;
      s.blas = c.blas;
      StepOps ops{*this, s, nullptr};
      p.gemm.seconds.push_back(timed(c, [&] { llama::gemm_phase(ops, 1, last); }));
    }
  }
  for (int32_t sequences : grid.decode_sequences) {
    const ForwardBatch batch = synthetic_batch(sequences, 1, grid.decode_context, page_size);
    p.attention.work.push_back(
        sequences * cuda::nano_attention_reads({.tokens = 1, .cached = grid.decode_context},
                                               p.prefill_kv_tile));
    LaneStep s = prepare(lane, batch, 0, batch.chunks.size());
    for (const Column& c : attention_columns) {
      s.attention_stream = c.stream;
      s.scratch.multiprocessors = c.sms;
      StepOps ops{*this, s, nullptr};
      p.attention.seconds.push_back(timed(c, [&] { ops.attention(0); }));
    }
  }
  check_cuda(cudaDeviceSynchronize(), "nano-batch profile");
  p.check();
  return p;
}

}  // namespace blend::cuda

namespace blend {

cuda::NanoProfile measure_nano_profile(Backend& backend, int reps) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda_backend)
    throw Error("the nano-batch profile needs the cuda backend (this is " + backend.name() + ")");
  return cuda_backend->measure_nano_profile(reps);
}

}  // namespace blend
