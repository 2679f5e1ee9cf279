// The cuda backend's class (private to backend/cuda; cuda_backend.h is the public face): the
// model's weights and KV pages in GPU memory, one step's layers on lane 0's stream, and the
// two-lane nano-batch pipeline (nano_pipeline.cc). cuda_backend.cc holds construction, the
// whole-step forward pass and the KV page copies.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/knobs.h"
#include "backend/cuda/nano_search.h"
#include "backend/cuda/nano_split.h"
#include "backend/cuda/pinned_memory.h"
#include "backend/cuda/sm_partition.h"
#include "backend/layer_op_seconds.h"
#include "backend/llama_forward.h"
#include "model/weights.h"

namespace blend::cuda {

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(const ModelConfig& config, const TensorStore& store,
                  const BackendOptions& options);
  ~CudaBackendImpl() override;

  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "cuda"; }
  bool overlaps_compute_and_memory() const override { return nano_mode_ != cuda::NanoMode::kOff; }
  DType compute_dtype() const override { return elem_ == Elem::kBF16 ? DType::kBF16 : DType::kF32; }
  int64_t kv_bytes_per_page() const override {
    return kv_.page_elems() * static_cast<int64_t>(elem_size(elem_));
  }
  int64_t num_pages() const override { return num_pages_; }
  int64_t kv_bytes_per_token() const override { return kv_bytes_per_page() / kv_.page_size; }
  int64_t kv_memory_budget() const override { return kv_budget_; }
  void allocate_kv(int64_t num_pages) override;
  void forward(const ForwardBatch& batch, std::span<float> logits) override;
  bool forward_argmax(const ForwardBatch& batch, std::span<TokenId> tokens) override;
  bool forward_draw(const ForwardBatch& batch, std::span<const DeviceDraw> draws,
                    std::span<SampledToken> out) override;
  bool samples_on_device(std::span<const SampleRow> rows) const override;
  void set_op_timing(bool on) override { timing_ = on; }
  const CudaOpTimes& op_times() const override { return times_; }
  void reset_op_times() override { times_ = {}; }
  OpStatistics op_statistics() const override {  // CudaOpTimes holds milliseconds
    return {.seconds = layer_op_seconds(times_, 1e-3), .steps = times_.steps};
  }
  const CudaGraphStats& graph_stats() const override { return graph_stats_; }
  cuda::NanoProfile measure_nano_profile(int reps) override;
  void copy_page(PageId src, PageId dst) override;
  void read_pages(std::span<const PageId> pages, std::byte* out) const override;
  void write_pages(std::span<const PageId> pages, const std::byte* in) override;
  std::pmr::memory_resource* host_memory() override { return &host_memory_; }
  void read_slots(PageId page, int32_t first, int32_t count, std::byte* image) const override {
    copy_slots(page, first, count, image, /*to_host=*/true);
  }
  void write_slots(PageId page, int32_t first, int32_t count, const std::byte* image) override {
    // The host image is only read (cudaMemcpy2DAsync takes const sources).
    copy_slots(page, first, count, const_cast<std::byte*>(image), /*to_host=*/false);
  }

 private:
  // The constructor's work: the weights, lanes, knobs and KV cache (release() undoes it).
  void load(const TensorStore& store, const BackendOptions& options);
  // Streams, cuBLAS handles, events and green splits, once the lanes are idle; idempotent.
  void release();
  // forward_argmax (no draws) and forward_draw (one per row, the vocabulary fitting draw_rows):
  // the step's tokens and logprobs drawn where the logits are; false where the host must decide.
  bool draw_on_device(const ForwardBatch& batch, std::span<const DeviceDraw> draws,
                      std::span<SampledToken> out);
  // Whether draw_rows takes these draws: the vocabulary fits, and cuts and logprobs only with
  // BLEND_CUDA_DRAW=all.
  bool draws_fit(std::span<const DeviceDraw> draws) const;
  struct Layer {
    DeviceBuffer attn_norm, mlp_norm, qkv_bias;  // f32
    DeviceBuffer qkv, o, gate_up, down;          // elem_, rows of the fused outputs
  };

  // One lane of the nano-batch pipeline (NanoFlow §4.3, nano_split.h): a stream, its cuBLAS
  // handle and the activations of the rows it computes. Lane 0 (stream_) also runs whole steps.
  struct Lane {
    cudaStream_t stream = nullptr;
    cublasHandle_t blas = nullptr;
    // The GEMMs of a pipelined step: on at most nano_gemm_sms_ SMs (cublasSetSmCountTarget),
    // leaving the rest to the other lane's attention (NanoFlow §4.3's execution-unit split).
    cublasHandle_t nano_blas = nullptr;
    DeviceBuffer meta, x, xn, qkv, attn, gu, act, decode_scratch;
  };
  // The GPU's SMs split with green contexts (NanoFlow §5.1, sm_partition.h): a pipelined step's
  // GEMM phases on group 0, its attentions on group 1. Per lane a stream in each group, a cuBLAS
  // handle of group 0's context on the GEMM one, and the events its phases' ends record (layers
  // + 1 of each, made in the context of the stream that records them).
  struct GreenSplit {
    std::unique_ptr<SmPartition> partition;
    struct LaneStreams {
      cudaStream_t gemm = nullptr, attention = nullptr;
      cublasHandle_t blas = nullptr;
      std::vector<cudaEvent_t> gemm_done, attention_done;
    };
    LaneStreams lanes[2];
    GreenSplit() = default;
    GreenSplit(const GreenSplit&) = delete;
    GreenSplit& operator=(const GreenSplit&) = delete;
    ~GreenSplit();  // the handles, then the partition (its streams and contexts)
  };
  // The split whose GEMM group has at least `gemm_sms` SMs, made at its first use (a few
  // milliseconds) and kept: BLEND_CUDA_NANO_GEMM_SMS's one, or each that autosearch chose.
  GreenSplit& green_split(int gemm_sms);

  // Chunks [first, end) of a step on one lane: the batch uploaded, the buffers reserved.
  struct LaneStep {
    Lane* lane = nullptr;
    // lane->blas; in a pipelined step lane->nano_blas, or with green contexts the split's.
    cublasHandle_t blas = nullptr;
    // Where the step's kernels go: the lane's stream, or in a green pipelined step the GEMM
    // phases (everything but attention) and the attention on their SM groups' streams.
    cudaStream_t stream = nullptr, attention_stream = nullptr;
    cuda::BatchView view;
    cuda::DecodeScratch scratch;
    int64_t m = 0;
    float* x = nullptr;
    void* xn = nullptr;
    float* qkv = nullptr;
    void* attn = nullptr;
    float* gu = nullptr;
    void* act = nullptr;
  };

  // Runs the layers and the lm_head of the sampling rows, leaving their logits in logits_ (rows
  // in chunk order) once stream_ gets there; returns the row count. Does not wait for the GPU.
  int64_t compute_logits(const ForwardBatch& batch, size_t host_logits_size);
  // `for_graph`: the layout of a step a CUDA graph will replay (graph_key): the block tables'
  // capacity and the longest context rounded up, so steps of one count share a graph.
  LaneStep prepare(Lane& lane, const ForwardBatch& batch, size_t first, size_t end,
                   bool for_graph = false);
  // BLEND_CUDA_GRAPHS: runs the layers and the head of `s` (a whole step on lane 0) as the
  // graph captured for its key, capturing it first when new; false (nothing queued) when
  // graphs are off or the capture was refused: then the caller runs the layers itself.
  bool run_graph(const LaneStep& s, float* logits);
  // Every argument the step's kernels and GEMMs take that varies between steps: equal keys
  // launch the same kernels with the same arguments (the batch's contents are re-uploaded).
  static std::string graph_key(const LaneStep& s, const float* logits);
  // The operations backend/llama_forward.h sequences, on one lane's rows; head() writes the
  // lane's sampling rows' logits to `logits`. Defined in cuda_backend.cc.
  struct StepOps {
    CudaBackendImpl& b;
    const LaneStep& s;
    float* logits;
    void embed();
    void norm(int64_t layer, llama::Norm which);
    void project(int64_t layer, llama::Projection which);
    void qk_norm(int64_t layer);
    void rope_write_kv(int64_t layer);
    void attention(int64_t layer);
    void swiglu();
    void head();
  };
  // Columns of the fused QKV projection.
  int64_t qkv_width() const { return config_.q_dim() + 2 * config_.kv_dim(); }
  // The two lanes' pipeline over chunks [0, cut) and [cut, n) (nano_split.h), joined on stream_;
  // with `green`, each lane's GEMM phases and attentions on that split's SM groups.
  void run_nano_batches(const ForwardBatch& batch, size_t cut, float* logits, GreenSplit* green);
  // The cost model's rates on this GPU (nano_split.h), timed on layer 0's gate/up GEMM.
  cuda::NanoCost measure_nano_cost();
  // y[m][n] (f32, or y_elem) = x[m][k] (elem_) * w[n][k]^T, added to y when `accumulate`.
  void gemm(cublasHandle_t blas, const void* x, int64_t m, const DeviceBuffer& w, int64_t n,
            int64_t k, void* y, bool accumulate, Elem y_elem = Elem::kF32);
  // Slots [first, first + count) of `page` between the GPU and a host page image.
  void copy_slots(PageId page, int32_t first, int32_t count, std::byte* host, bool to_host) const;
  // Layer `layer` of page p: layer_elems() contiguous elements (kernels.h, KvView).
  std::byte* page_ptr(PageId p, int32_t layer = 0) const {
    return kv_cache_.get<std::byte>() +
           static_cast<size_t>(p * kv_.page_stride + layer * kv_.layer_stride) * elem_size(elem_);
  }
  size_t layer_bytes() const { return static_cast<size_t>(kv_.layer_elems()) * elem_size(elem_); }
  size_t layer_pitch() const { return static_cast<size_t>(kv_.layer_stride) * elem_size(elem_); }
  void check_page(PageId p, const char* what) const {
    if (p < 0 || p >= num_pages_)
      throw Error(std::string("cuda backend: ") + what + ": page " + std::to_string(p) +
                  " outside the " + std::to_string(num_pages_) + " KV pages");
  }

  ModelConfig config_;
  Elem elem_ = Elem::kBF16;
  Elem embed_elem_ = Elem::kBF16;
  Lane lanes_[2];
  cudaStream_t stream_ = nullptr;  // lanes_[0].stream
  // Page I/O with the host (read/write_pages, the slot copies) runs on a stream of its own, from
  // and to page-locked tier memory. The engine issues it between steps (Backend::synchronize),
  // and each call waits for its copies, so no ordering with the compute stream is needed; a
  // stream of its own is what lets a later engine overlap offload with a step.
  cudaStream_t copy_stream_ = nullptr;
  cuda::PinnedHostMemory host_memory_;
  std::vector<Layer> layers_;
  // BLEND_CUDA_NANO_BATCHES: off, auto (split where the cost model predicts a gain) or always.
  cuda::NanoMode nano_mode_ = cuda::NanoMode::kOff;
  cuda::NanoCost nano_cost_;
  int nano_gemm_sms_ = 0;    // BLEND_CUDA_NANO_GEMM_SMS; 0: every SM
  bool nano_green_ = false;  // BLEND_CUDA_NANO_SM_SPLIT=green (or a profile's plans)
  // BLEND_CUDA_NANO_PROFILE: each step's cut and split from autosearch on it (nano_search.h).
  std::optional<cuda::NanoProfile> nano_profile_;
  // Nano-batch phase ends (no timing) without green contexts: per lane its GEMM phases' ends,
  // layers + 1 of them (nano_pipeline.cc), then two for the step's start and end.
  static constexpr size_t kPhaseEventKinds = 2;
  std::vector<cudaEvent_t> phase_events_;
  // Green splits by the GEMM SMs asked for (green_split).
  std::map<int, std::unique_ptr<GreenSplit>> green_splits_;
  DeviceBuffer embed_, final_norm_, lm_head_, inv_freq_;
  cuda::KvView kv_;
  cuda::AttentionKernel attention_kernel_ = cuda::AttentionKernel::kDefault;
  cuda::PrefillKernel prefill_kernel_ = cuda::PrefillKernel::kMma;
  Elem gate_up_elem_ = Elem::kF32;  // BLEND_CUDA_GATE_UP (bf16 only on bf16 checkpoints)
  cuda::KvLayout kv_layout_ = cuda::KvLayout::kPageMajor;
  cuda::DecodeSplits decode_splits_ = cuda::DecodeSplits::kFill;
  int32_t min_decode_splits_ = 1;
  bool decode_heads_fastest_ = false;
  int32_t prefill_tile_tokens_ = 0;  // 0: no tensor-core prefill tiles
  DeviceBuffer kv_cache_;
  int64_t num_pages_ = 0;
  PageId scratch_page_ = 0;  // with graphs: page num_pages_, outside the pool (allocate_kv)
  int64_t kv_budget_ = 0;
  // Op timing: events recorded after each operation of a step, read once the step is done.
  void mark(double CudaOpTimes::*slot);
  void collect_op_times();
  bool timing_ = false;
  CudaOpTimes times_;
  std::vector<cudaEvent_t> events_;
  std::vector<double CudaOpTimes::*> event_slots_;
  size_t events_used_ = 0;
  // BLEND_CUDA_GRAPHS=decode: the graphs by key (at most kMaxGraphs, all dropped when full),
  // and cuBLAS's workspace on lane 0 set by us, so a capture allocates nothing.
  bool graphs_ = false;
  bool draw_cuts_ = false;  // BLEND_CUDA_DRAW=all
  static constexpr size_t kMaxGraphs = 64;
  std::map<std::string, cudaGraphExec_t> graph_cache_;
  CudaGraphStats graph_stats_;
  DeviceBuffer graph_workspace_;
  // Per-step buffers, grown to the largest batch seen (the lanes hold the activations).
  DeviceBuffer logits_, draw_scratch_;
  int32_t multiprocessors_ = 1;
};

}  // namespace blend::cuda
