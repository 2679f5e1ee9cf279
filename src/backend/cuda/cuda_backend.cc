#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <vector>

#include "backend/cuda/batch_layout.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/knobs.h"
#include "core/error.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend::cuda {
namespace {

// Copies `parts` (tensors of one row length) one after another into one device matrix of
// `elem` elements, converting on the host where the checkpoint's dtype differs.
DeviceBuffer upload_rows(const std::vector<const TensorView*>& parts, Elem elem) {
  size_t total = 0;
  for (const TensorView* p : parts) total += static_cast<size_t>(p->numel()) * elem_size(elem);
  DeviceBuffer buf(total);
  auto* dst = buf.get<std::byte>();
  const DType want = elem == Elem::kBF16 ? DType::kBF16 : DType::kF32;
  std::vector<std::byte> staging;
  for (const TensorView* p : parts) {
    const size_t bytes = static_cast<size_t>(p->numel()) * elem_size(elem);
    if (p->dtype == want) {
      check_cuda(cudaMemcpy(dst, p->data, bytes, cudaMemcpyHostToDevice), "weight upload");
    } else {
      staging.resize(bytes);
      const int64_t n = p->numel();
      if (elem == Elem::kBF16) {
        auto* out = reinterpret_cast<uint16_t*>(staging.data());
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(p->at(i));
      } else {
        auto* out = reinterpret_cast<float*>(staging.data());
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) out[i] = p->at(i);
      }
      check_cuda(cudaMemcpy(dst, staging.data(), bytes, cudaMemcpyHostToDevice), "weight upload");
    }
    dst += bytes;
  }
  return buf;
}

DeviceBuffer upload_f32(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.at(i);
  DeviceBuffer buf(v.size() * 4);
  check_cuda(cudaMemcpy(buf.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice),
             "weight upload");
  return buf;
}

const ModelConfig& validated(const ModelConfig& config) {
  config.validate();
  return config;
}

}  // namespace

CudaBackendImpl::CudaBackendImpl(const ModelConfig& config, const TensorStore& store,
                                 const BackendOptions& options)
    : config_(validated(config)) {
  // The streams, handles and events the body makes are not RAII: a throw part-way (a missing
  // tensor, a GPU out of memory) releases what it made before it leaves.
  try {
    load(store, options);
  } catch (...) {
    release();
    throw;
  }
}

void CudaBackendImpl::load(const TensorStore& store, const BackendOptions& options) {
  // Checked on a GPU against transformers: Llama, Qwen2, Mistral. Gemma's layer and Qwen3's
  // per-head q/k norms have no kernels yet (refused before looking for a GPU, so the refusal is
  // tested without one).
  if (config_.gemma.enabled)
    throw Error("cuda backend: " + config_.architecture +
                " ((1 + w) norms, GeGLU, per-layer windows, soft-capping) is not supported on the "
                "GPU yet; use --backend cpu");
  if (config_.qk_norm)
    throw Error("cuda backend: " + config_.architecture +
                " (per-head q/k norms) is not supported on the GPU yet; use --backend cpu");
  // Phi-3's partial RoPE and longrope have no kernel yet (the fused tensors would load).
  if (config_.architecture == "Phi3ForCausalLM" || config_.rotary_dim() != config_.head_dim ||
      config_.rope_scaling.type == "longrope")
    throw Error("cuda backend: " + config_.architecture +
                " (partial RoPE, longrope) is not checked on the GPU yet; use --backend cpu");
  std::string why;
  if (!cuda_device_available(&why)) throw Error("the cuda backend found no usable GPU: " + why);
  if (options.deterministic)
    throw Error(
        "the cuda backend has no --deterministic mode yet (cuBLAS chooses its GEMM algorithm by "
        "batch shape, so a row's result may depend on the batch); use --backend cpu for it");
  if (options.page_size < 1) throw Error("cuda backend: page size must be at least 1");
  const char* unsupported = nullptr;
  if (!cuda::attention_supports(static_cast<int32_t>(config_.num_heads),
                                static_cast<int32_t>(config_.num_kv_heads),
                                static_cast<int32_t>(config_.head_dim), &unsupported))
    throw Error(std::string("cuda backend: unsupported attention shape: ") + unsupported);
  const DType file = check_tensors(config_, store);
  elem_ = file == DType::kF32 ? Elem::kF32 : Elem::kBF16;
  embed_elem_ = file == DType::kBF16 ? Elem::kBF16 : Elem::kF32;  // the cpu backend's rule

  // Kernels, layout, splits and the nano-batch pipeline: the --cuda-* flags, else the
  // environment (knobs.h).
  const cuda::Knobs knobs = cuda::parse_knobs(options.cuda_knobs);
  attention_kernel_ = knobs.attention;
  prefill_kernel_ = knobs.prefill;
  if (knobs.gate_up_bf16 && elem_ == Elem::kBF16 && config_.intermediate_size % 4 == 0)
    gate_up_elem_ = Elem::kBF16;
  kv_layout_ = knobs.kv_layout;
  decode_heads_fastest_ = knobs.decode_heads_fastest;
  decode_splits_ = knobs.decode_splits;
  min_decode_splits_ = knobs.min_decode_splits;
  nano_mode_ = knobs.nano;
  nano_gemm_sms_ = knobs.nano_gemm_sms;
  if (attention_kernel_ != cuda::AttentionKernel::kTiled64 &&
      attention_kernel_ != cuda::AttentionKernel::kTiled32)
    prefill_tile_tokens_ = cuda::prefill_tile_tokens(static_cast<int32_t>(config_.num_heads),
                                                     static_cast<int32_t>(config_.num_kv_heads),
                                                     static_cast<int32_t>(config_.head_dim), elem_);
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  check_cuda(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, 0),
             "cudaDeviceGetAttribute");
  for (Lane& lane : lanes_) {
    check_cuda(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cublas(cublasCreate(&lane.blas), "cublasCreate");
    check_cublas(cublasSetStream(lane.blas, lane.stream), "cublasSetStream");
    check_cublas(cublasCreate(&lane.nano_blas), "cublasCreate");
    check_cublas(cublasSetStream(lane.nano_blas, lane.stream), "cublasSetStream");
    if (nano_gemm_sms_ > 0)
      check_cublas(cublasSetSmCountTarget(lane.nano_blas, nano_gemm_sms_),
                   "cublasSetSmCountTarget");
  }
  stream_ = lanes_[0].stream;
  check_cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  graphs_ = knobs.graphs;
  draw_cuts_ = knobs.draw_cuts;
  if (graphs_) {  // cuBLAS's workspace set, so that a capture allocates none (32 MiB: Hopper's)
    const size_t bytes = size_t{32} << 20;
    check_cublas(cublasSetWorkspace(lanes_[0].blas, graph_workspace_.reserve(bytes), bytes),
                 "cublasSetWorkspace");
  }
  nano_green_ = knobs.nano_green;
  if (!knobs.nano_profile.empty()) {
    nano_profile_ = cuda::load_nano_profile(knobs.nano_profile, multiprocessors_,
                                            static_cast<int32_t>(config_.num_layers));
  } else if (nano_green_) {
    green_split(nano_gemm_sms_);  // refused here, at load, where green contexts cannot split so
  }

  const LlamaTensors tensors = bind_llama_tensors(config_, store);
  for (const LlamaLayerTensors& t : tensors.layers) {
    Layer l;
    l.attn_norm = upload_f32(*t.attention_norm);
    l.mlp_norm = upload_f32(*t.ffn_norm);
    l.qkv = upload_rows(t.qkv, elem_);
    if (!t.qkv_bias.empty()) l.qkv_bias = upload_rows(t.qkv_bias, Elem::kF32);
    l.o = upload_rows({t.o}, elem_);
    l.gate_up = upload_rows(t.gate_up, elem_);
    l.down = upload_rows({t.down}, elem_);
    layers_.push_back(std::move(l));
  }
  final_norm_ = upload_f32(*tensors.final_norm);
  embed_ = upload_rows({tensors.embedding}, embed_elem_);
  lm_head_ = upload_rows({tensors.lm_head}, elem_);
  const std::vector<double> inv = rope_inv_freq(config_);
  inv_freq_.reserve(inv.size() * sizeof(double));
  check_cuda(
      cudaMemcpy(inv_freq_.get(), inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice),
      "upload");

  kv_ = {.base = nullptr,
         .elem = elem_,
         .num_layers = static_cast<int32_t>(config_.num_layers),
         .num_kv_heads = static_cast<int32_t>(config_.num_kv_heads),
         .head_dim = static_cast<int32_t>(config_.head_dim),
         .page_size = options.page_size};
  // What the KV cache may take by default: the free memory less room for activations, logits
  // and cuBLAS's workspace (4 GiB or a tenth of the card, whichever is more).
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const int64_t reserve =
      std::max<int64_t>(int64_t{4} << 30, static_cast<int64_t>(total_bytes / 10));
  kv_budget_ = std::max<int64_t>(static_cast<int64_t>(free_bytes) - reserve, int64_t{64} << 20);
  if (nano_mode_ != cuda::NanoMode::kOff) {
    nano_cost_ = measure_nano_cost();
    if (knobs.nano_interference) nano_cost_.interference = *knobs.nano_interference;
    std::fprintf(stderr,
                 "cuda backend: nano-batches %s: GEMMs %.3f us/token, weight read %.2f ms, KV "
                 "%.2f ns/token, interference %.2f, GEMMs on %d SMs\n",
                 knobs.nano_name.c_str(), nano_cost_.gemm_seconds_per_token * 1e6,
                 nano_cost_.weight_seconds * 1e3, nano_cost_.kv_seconds_per_token * 1e9,
                 nano_cost_.interference, nano_gemm_sms_);
    if (nano_profile_)
      std::fprintf(stderr,
                   "cuda backend: nano-batch plans by autosearch on %s (%d SMs at steps of %d)\n",
                   knobs.nano_profile.c_str(), nano_profile_->total_sms, nano_profile_->sm_step);
    else if (nano_green_)
      std::fprintf(stderr, "cuda backend: green contexts: GEMM phases on %d SMs, attention on %d\n",
                   green_split(nano_gemm_sms_).partition->sms(0),
                   green_split(nano_gemm_sms_).partition->sms(1));
    for (size_t i = 0; i < kPhaseEventKinds * (layers_.size() + 1) + 2; ++i) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      phase_events_.push_back(e);
    }
  }
  if (options.num_pages > 0) allocate_kv(options.num_pages);
  if (options.overlap) compute_steps_on_worker();
}

CudaBackendImpl::~CudaBackendImpl() {
  release();
}

void CudaBackendImpl::release() {
  for (Lane& lane : lanes_)
    if (lane.stream) cudaStreamSynchronize(lane.stream);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  events_.clear();
  for (auto& [key, exec] : graph_cache_) cudaGraphExecDestroy(exec);
  graph_cache_.clear();
  for (cudaEvent_t e : phase_events_) cudaEventDestroy(e);
  phase_events_.clear();
  green_splits_.clear();
  for (Lane& lane : lanes_) {
    if (lane.blas) cublasDestroy(lane.blas);
    if (lane.nano_blas) cublasDestroy(lane.nano_blas);
    if (lane.stream) cudaStreamDestroy(lane.stream);
    lane.blas = lane.nano_blas = nullptr;
    lane.stream = nullptr;
  }
  stream_ = nullptr;
  if (copy_stream_) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  copy_stream_ = nullptr;
}

CudaBackendImpl::GreenSplit::~GreenSplit() {
  for (LaneStreams& l : lanes)
    if (l.blas) {
      const SmPartition::Current in_gemm_group(*partition, 0);
      cublasDestroy(l.blas);
    }
  partition.reset();  // its streams, events and contexts
}

CudaBackendImpl::GreenSplit& CudaBackendImpl::green_split(int gemm_sms) {
  std::unique_ptr<GreenSplit>& split = green_splits_[gemm_sms];
  if (split) return *split;
  auto made = std::make_unique<GreenSplit>();
  made->partition = std::make_unique<SmPartition>(gemm_sms);
  SmPartition& partition = *made->partition;
  for (GreenSplit::LaneStreams& l : made->lanes) {
    l.gemm = partition.make_stream(0);
    l.attention = partition.make_stream(1);
    {
      const SmPartition::Current in_gemm_group(partition, 0);
      check_cublas(cublasCreate(&l.blas), "cublasCreate");
    }
    check_cublas(cublasSetStream(l.blas, l.gemm), "cublasSetStream");
    for (int64_t i = 0; i <= config_.num_layers; ++i) {  // layers_ may not be loaded yet
      l.gemm_done.push_back(partition.make_event(0, /*timing=*/false));
      l.attention_done.push_back(partition.make_event(1, false));
    }
  }
  split = std::move(made);
  return *split;
}

void CudaBackendImpl::allocate_kv(int64_t num_pages) {
  if (num_pages_ > 0) throw Error("cuda backend: the KV cache is allocated already");
  if (num_pages < 1) throw Error("cuda backend: the KV cache needs at least one page");
  // With graphs, one page more than the pool's: the scratch page padded decode rows write
  // (cuda::pad_decode_batch), zeroed like the rest so that nothing they read is NaN.
  const int64_t pages = num_pages + (graphs_ ? 1 : 0);
  const size_t bytes = static_cast<size_t>(pages) * static_cast<size_t>(kv_bytes_per_page());
  kv_cache_.reserve(bytes);
  check_cuda(cudaMemset(kv_cache_.get(), 0, bytes), "cudaMemset");
  kv_.base = kv_cache_.get();
  cuda::set_kv_layout(kv_, kv_layout_, pages);
  num_pages_ = num_pages;
  scratch_page_ = static_cast<PageId>(num_pages);
}

void CudaBackendImpl::mark(double CudaOpTimes::*slot) {
  if (!timing_) return;
  if (events_used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "cudaEventCreate");
    events_.push_back(e);
    event_slots_.push_back(nullptr);
  }
  check_cuda(cudaEventRecord(events_[events_used_], stream_), "cudaEventRecord");
  event_slots_[events_used_++] = slot;
}

void CudaBackendImpl::collect_op_times() {
  if (!timing_ || events_used_ == 0) return;
  for (size_t i = 1; i < events_used_; ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), "cudaEventElapsedTime");
    times_.*event_slots_[i] += ms;
  }
  times_.steps += 1;
  events_used_ = 0;
}

void CudaBackendImpl::gemm(cublasHandle_t blas, const void* x, int64_t m, const DeviceBuffer& w,
                           int64_t n, int64_t k, void* y, bool accumulate, Elem y_elem) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cudaDataType_t t = elem_ == Elem::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t yt = y_elem == Elem::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  // Row-major y = x w^T is column-major y^T = w x^T: w is column-major k x n, used transposed.
  check_cublas(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                            static_cast<int>(m), static_cast<int>(k), &alpha, w.get(), t,
                            static_cast<int>(k), x, t, static_cast<int>(k), &beta, y, yt,
                            static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

void CudaBackendImpl::forward(const ForwardBatch& batch, std::span<float> logits) {
  const int64_t r = compute_logits(batch, logits.size());
  if (r > 0)
    check_cuda(cudaMemcpyAsync(logits.data(), logits_.get(), r * config_.vocab_size * 4,
                               cudaMemcpyDeviceToHost, stream_),
               "logits download");
  check_cuda(cudaStreamSynchronize(stream_), "forward");
  collect_op_times();
}

bool CudaBackendImpl::forward_argmax(const ForwardBatch& batch, std::span<TokenId> tokens) {
  std::vector<SampledToken> out(tokens.size());
  if (!draw_on_device(batch, {}, out)) return false;
  for (size_t r = 0; r < out.size(); ++r) tokens[r] = out[r].token;
  return true;
}

bool CudaBackendImpl::draws_fit(std::span<const DeviceDraw> draws) const {
  const bool cuts_or_logprobs = std::any_of(
      draws.begin(), draws.end(), [](const DeviceDraw& d) { return d.cuts_or_logprobs(); });
  return (draw_cuts_ || !cuts_or_logprobs) && cuda::draw_fits(config_.vocab_size);
}

bool CudaBackendImpl::samples_on_device(std::span<const SampleRow> rows) const {
  const std::optional<std::vector<DeviceDraw>> draws = device_draws(rows);
  if (!draws) return false;
  // Greedy rows without logprobs take the argmax kernel, which fits any vocabulary.
  const bool argmaxes = std::all_of(draws->begin(), draws->end(),
                                    [](const DeviceDraw& d) { return d.argmax_only(); });
  return argmaxes || draws_fit(*draws);
}

bool CudaBackendImpl::forward_draw(const ForwardBatch& batch, std::span<const DeviceDraw> draws,
                                   std::span<SampledToken> out) {
  if (!draws_fit(draws) || out.size() != draws.size())
    return Backend::forward_draw(batch, draws, out);
  return draw_on_device(batch, draws, out);
}

bool CudaBackendImpl::draw_on_device(const ForwardBatch& batch, std::span<const DeviceDraw> draws,
                                     std::span<SampledToken> out) {
  const auto r = static_cast<int64_t>(out.size());
  const size_t vocab = static_cast<size_t>(config_.vocab_size);
  const int64_t rows = compute_logits(batch, out.size() * vocab);
  if (rows != r)
    throw Error("internal: cuda backend: " + std::to_string(r) + " token slots for " +
                std::to_string(rows) + " logit rows");
  // One upload of the rows' draws as they are (none for argmaxes); the results come back in one
  // download, and the top logprobs in a second where a row asked for them.
  bool full = false;
  int32_t most_top = 0;
  for (const DeviceDraw& d : draws) {
    full |= d.cuts_or_logprobs();
    most_top = std::max(most_top, d.logprobs);
  }
  const size_t params_bytes = draws.size() * sizeof(DeviceDraw);
  const size_t results_bytes = r * sizeof(cuda::DrawResult);
  const size_t top_bytes = most_top > 0 ? r * kMaxDeviceLogprobs * sizeof(int32_t) : 0;
  auto* buf = static_cast<std::byte*>(
      draw_scratch_.reserve(params_bytes + results_bytes + 2 * std::max<size_t>(top_bytes, 4)));
  auto* d_params = draws.empty() ? nullptr : reinterpret_cast<DeviceDraw*>(buf);
  auto* d_results = reinterpret_cast<cuda::DrawResult*>(buf + params_bytes);
  auto* d_top_ids = reinterpret_cast<int32_t*>(buf + params_bytes + results_bytes);
  auto* d_top_logits = reinterpret_cast<float*>(buf + params_bytes + results_bytes + top_bytes);
  if (d_params)
    check_cuda(
        cudaMemcpyAsync(d_params, draws.data(), params_bytes, cudaMemcpyHostToDevice, stream_),
        "draw upload");
  cuda::draw_rows(logits_.get<float>(), r, config_.vocab_size, d_params, full, d_results, d_top_ids,
                  d_top_logits, stream_);
  std::vector<cuda::DrawResult> results(static_cast<size_t>(r));
  check_cuda(
      cudaMemcpyAsync(results.data(), d_results, results_bytes, cudaMemcpyDeviceToHost, stream_),
      "token download");
  std::vector<int32_t> top_ids(top_bytes / sizeof(int32_t));
  std::vector<float> top_logits(top_ids.size());
  if (top_bytes > 0) {
    check_cuda(
        cudaMemcpyAsync(top_ids.data(), d_top_ids, top_bytes, cudaMemcpyDeviceToHost, stream_),
        "top logprobs download");
    check_cuda(cudaMemcpyAsync(top_logits.data(), d_top_logits, top_bytes, cudaMemcpyDeviceToHost,
                               stream_),
               "top logprobs download");
  }
  check_cuda(cudaStreamSynchronize(stream_), "forward");
  collect_op_times();
  for (const cuda::DrawResult& res : results)
    if (res.flag) return false;  // a NaN or +inf: the host sampler decides
  for (int64_t i = 0; i < r; ++i) {
    const cuda::DrawResult& res = results[static_cast<size_t>(i)];
    SampledToken& t = out[static_cast<size_t>(i)];
    t = SampledToken{.token = res.token};
    const int32_t n = draws.empty() ? -1 : draws[static_cast<size_t>(i)].logprobs;
    if (n < 0) continue;
    t.logprob = row_logprob(res.token_logit, res.max, res.total);
    for (int32_t j = 0; j < n && j < config_.vocab_size; ++j) {
      const size_t k = static_cast<size_t>(i * kMaxDeviceLogprobs + j);
      t.top.push_back({top_ids[k], row_logprob(top_logits[k], res.max, res.total)});
    }
  }
  return true;
}

int64_t CudaBackendImpl::compute_logits(const ForwardBatch& batch, size_t host_logits_size) {
  check_forward_batch(batch, config_, kv_.page_size, num_pages_, host_logits_size, "cuda");
  if (batch.num_tokens() == 0) return 0;
  const int64_t r = batch.num_logit_rows();
  // A decode-only step may replay a CUDA graph (BLEND_CUDA_GRAPHS), padded to the row count of
  // its graph (cuda::graph_rows) so that steps of nearby counts share one. Per-op timing
  // records events a graph would not.
  const bool graph = graphs_ && !timing_ &&
                     std::all_of(batch.chunks.begin(), batch.chunks.end(), [](const SeqChunk& c) {
                       return c.num_tokens == 1 && c.num_cached > 0;
                     });
  const int32_t padded_rows = graph ? cuda::graph_rows(batch.num_tokens()) : 0;
  auto* logits = static_cast<float*>(
      logits_.reserve(std::max<int64_t>({r, padded_rows, 1}) * config_.vocab_size * 4));
  events_used_ = 0;  // a step that threw left its events unread
  if (nano_mode_ != cuda::NanoMode::kOff && batch.chunks.size() >= 2) {
    std::vector<cuda::ChunkWork> work(batch.chunks.size());
    for (size_t i = 0; i < work.size(); ++i)
      work[i] = {.tokens = batch.chunks[i].num_tokens, .cached = batch.chunks[i].num_cached};
    const cuda::NanoStepPlan plan = cuda::plan_nano_step(
        work, nano_profile_ ? &*nano_profile_ : nullptr, nano_cost_,
        nano_green_ ? nano_gemm_sms_ : 0, nano_mode_ == cuda::NanoMode::kAlways);
    if (plan.cut > 0) {
      run_nano_batches(batch, static_cast<size_t>(plan.cut), logits,
                       plan.green_gemm_sms > 0 ? &green_split(plan.green_gemm_sms) : nullptr);
      return r;
    }
  }
  // The padded rows' logits follow the batch's own r rows, which are all anyone reads.
  const ForwardBatch padded = padded_rows > batch.num_tokens()
                                  ? cuda::pad_decode_batch(batch, padded_rows, scratch_page_)
                                  : ForwardBatch{};
  const ForwardBatch& step = padded.chunks.empty() ? batch : padded;
  const LaneStep s = prepare(lanes_[0], step, 0, step.chunks.size(), graph);
  if (graph && run_graph(s, logits)) return r;
  mark(nullptr);
  StepOps ops{*this, s, logits};
  llama::forward(ops, 0, static_cast<int64_t>(layers_.size()));
  return r;
}

std::string CudaBackendImpl::graph_key(const LaneStep& s, const float* logits) {
  std::string key;
  auto put = [&key](const auto& v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  const cuda::BatchView& v = s.view;
  for (const int32_t* p : {v.tokens, v.positions, v.token_chunk, v.chunk_table, v.tables,
                           v.reversed, v.logit_rows, v.prefill_tiles, v.single_tokens})
    put(p);
  for (int32_t n : {v.num_tokens, v.num_logit_rows, v.num_prefill_tiles, v.num_single_tokens,
                    v.max_single_context})
    put(n);
  const cuda::DecodeScratch& d = s.scratch;
  put(d.data);
  put(d.floats);
  put(d.multiprocessors);
  put(d.splits);
  put(d.min_splits);
  put(d.heads_fastest);
  put(s.m);
  for (const void* p :
       std::initializer_list<const void*>{s.x, s.xn, s.qkv, s.attn, s.gu, s.act, logits})
    put(p);
  put(s.blas);
  put(s.stream);
  put(s.attention_stream);
  return key;
}

bool CudaBackendImpl::run_graph(const LaneStep& s, float* logits) {
  std::string key = graph_key(s, logits);
  if (auto it = graph_cache_.find(key); it != graph_cache_.end()) {
    check_cuda(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
    ++graph_stats_.replayed;
    return true;
  }
  if (graph_cache_.size() >= kMaxGraphs) {
    for (auto& [k, exec] : graph_cache_) cudaGraphExecDestroy(exec);
    graph_cache_.clear();
  }
  // A refused capture (an operation the runtime does not capture) leaves the step to run
  // uncaptured, and graphs off: every later capture would fail the same way.
  auto refuse = [&](const char* why) {
    cudaGetLastError();  // the capture's error is not the step's
    ++graph_stats_.failed;
    graphs_ = false;
    std::fprintf(stderr, "cuda backend: CUDA graphs off: %s\n", why);
    return false;
  };
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
    return refuse("cudaStreamBeginCapture failed");
  cudaGraph_t graph = nullptr;
  try {
    StepOps ops{*this, s, logits};
    llama::forward(ops, 0, static_cast<int64_t>(layers_.size()));
  } catch (const std::exception& e) {  // the stream must leave capture mode whatever failed
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    return refuse(e.what());
  }
  if (cudaStreamEndCapture(stream_, &graph) != cudaSuccess || !graph)
    return refuse("cudaStreamEndCapture failed");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) return refuse("cudaGraphInstantiate failed");
  graph_cache_.emplace(std::move(key), exec);
  ++graph_stats_.captured;
  check_cuda(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
  return true;
}

CudaBackendImpl::LaneStep CudaBackendImpl::prepare(Lane& lane, const ForwardBatch& batch,
                                                   size_t first, size_t end, bool for_graph) {
  // For a graph: the tables' capacity the next power of two of their pages (at least 256), and
  // the longest context rounded up to 256 keys. The context only sizes the decode kernel's
  // splits (a split past a token's keys is empty, as for any token shorter than the longest).
  int64_t table_capacity = 0;
  if (for_graph) {
    int64_t pages = 0;
    for (size_t i = first; i < end; ++i)
      pages +=
          (int64_t{batch.chunks[i].num_cached} + batch.chunks[i].num_tokens + kv_.page_size - 1) /
          kv_.page_size;
    table_capacity = 256;
    while (table_capacity < pages) table_capacity *= 2;
  }
  cuda::BatchLayout layout = cuda::layout_chunks(batch, first, end, kv_.page_size,
                                                 prefill_tile_tokens_, 8, table_capacity);
  if (for_graph) layout.max_single_context = (layout.max_single_context + 255) / 256 * 256;
  auto* meta = static_cast<int32_t*>(lane.meta.reserve(layout.data.size() * sizeof(int32_t)));
  // From pageable memory: the copy is staged before the call returns, so `layout` may go.
  check_cuda(cudaMemcpyAsync(meta, layout.data.data(), layout.data.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice, lane.stream),
             "batch upload");
  LaneStep s;
  s.lane = &lane;
  s.blas = lane.blas;
  s.stream = lane.stream;
  s.attention_stream = lane.stream;
  s.view = {.tokens = meta + layout.tokens,
            .positions = meta + layout.positions,
            .token_chunk = meta + layout.token_chunk,
            .chunk_table = meta + layout.chunk_table,
            .tables = meta + layout.tables,
            .reversed = meta + layout.reversed,
            .logit_rows = meta + layout.logit_rows,
            .prefill_tiles = meta + layout.prefill_tiles,
            .single_tokens = meta + layout.single_tokens,
            .num_tokens = layout.num_tokens,
            .num_logit_rows = layout.num_logit_rows,
            .num_prefill_tiles = layout.num_prefill_tiles,
            .num_single_tokens = layout.num_single_tokens,
            .max_single_context = layout.max_single_context};
  // Scratch for the most splits the decode kernel may choose (it picks within it).
  int32_t splits = std::max(cuda::decode_splits(layout.num_single_tokens, kv_.num_kv_heads,
                                                layout.max_single_context, multiprocessors_),
                            min_decode_splits_);
  if (decode_splits_ == cuda::DecodeSplits::kWaves)
    splits =
        std::max(splits, cuda::wave_splits_most(cuda::decode_tiles(layout.max_single_context)));
  const size_t scratch_floats = cuda::decode_scratch_floats(
      layout.num_single_tokens, static_cast<int32_t>(config_.num_heads), kv_.head_dim, splits);
  s.scratch = {.data = static_cast<float*>(lane.decode_scratch.reserve(scratch_floats * 4)),
               .floats = scratch_floats,
               .multiprocessors = multiprocessors_,
               .splits = decode_splits_,
               .min_splits = min_decode_splits_,
               .heads_fastest = decode_heads_fastest_};
  const int64_t m = layout.num_tokens, h = config_.hidden_size, qd = config_.q_dim();
  const int64_t f = config_.intermediate_size, nqkv = qkv_width();
  const size_t es = elem_size(elem_);
  s.m = m;
  s.x = static_cast<float*>(lane.x.reserve(m * h * 4));
  s.xn = lane.xn.reserve(m * h * es);
  s.qkv = static_cast<float*>(lane.qkv.reserve(m * nqkv * 4));
  s.attn = lane.attn.reserve(m * qd * es);
  s.gu = static_cast<float*>(lane.gu.reserve(m * 2 * f * 4));
  s.act = lane.act.reserve(m * f * es);
  return s;
}

void CudaBackendImpl::StepOps::embed() {
  cuda::embed(s.view, b.embed_.get(), b.embed_elem_, b.config_.hidden_size, s.x, s.stream);
  b.mark(&CudaOpTimes::embed);
}

void CudaBackendImpl::StepOps::norm(int64_t layer, llama::Norm which) {
  const Layer& l = b.layers_[static_cast<size_t>(layer)];
  const DeviceBuffer& weight = which == llama::Norm::kAttention ? l.attn_norm : l.mlp_norm;
  cuda::rmsnorm(s.x, nullptr, s.m, b.config_.hidden_size, weight.get<float>(),
                static_cast<float>(b.config_.rms_norm_eps), s.xn, b.elem_, s.stream);
  b.mark(&CudaOpTimes::norm);
}

void CudaBackendImpl::StepOps::project(int64_t layer, llama::Projection which) {
  const Layer& l = b.layers_[static_cast<size_t>(layer)];
  const ModelConfig& c = b.config_;
  const int64_t h = c.hidden_size, f = c.intermediate_size;
  switch (which) {
    case llama::Projection::kQkv:
      b.gemm(s.blas, s.xn, s.m, l.qkv, b.qkv_width(), h, s.qkv, false);
      if (c.attention_bias)
        cuda::add_bias(s.qkv, s.m, b.qkv_width(), l.qkv_bias.get<float>(), s.stream);
      b.mark(&CudaOpTimes::qkv);
      return;
    case llama::Projection::kO:
      b.gemm(s.blas, s.attn, s.m, l.o, h, c.q_dim(), s.x, true);
      b.mark(&CudaOpTimes::o_proj);
      return;
    case llama::Projection::kGateUp:
      b.gemm(s.blas, s.xn, s.m, l.gate_up, 2 * f, h, s.gu, false, b.gate_up_elem_);
      b.mark(&CudaOpTimes::gate_up);
      return;
    case llama::Projection::kDown:
      b.gemm(s.blas, s.act, s.m, l.down, h, f, s.x, true);
      b.mark(&CudaOpTimes::down);
      return;
  }
}

// No model with these norms reaches this backend (refused at construction).
void CudaBackendImpl::StepOps::qk_norm(int64_t) {}

void CudaBackendImpl::StepOps::rope_write_kv(int64_t layer) {
  cuda::rope_write_kv(s.view, s.qkv, b.qkv_width(), static_cast<int32_t>(b.config_.num_heads),
                      b.inv_freq_.get<double>(), b.kv_, static_cast<int32_t>(layer), s.stream);
  b.mark(&CudaOpTimes::rope_kv);
}

void CudaBackendImpl::StepOps::attention(int64_t layer) {
  cuda::attention(s.view, s.qkv, b.qkv_width(), b.kv_, static_cast<int32_t>(layer),
                  static_cast<int32_t>(b.config_.num_heads),
                  static_cast<int32_t>(b.config_.sliding_window.value_or(0)), s.attn, b.elem_,
                  b.attention_kernel_, b.prefill_kernel_, s.scratch, s.attention_stream);
  b.mark(&CudaOpTimes::attention);
}

void CudaBackendImpl::StepOps::swiglu() {
  cuda::swiglu(s.gu, b.gate_up_elem_, s.m, b.config_.intermediate_size, s.act, b.elem_, s.stream);
  b.mark(&CudaOpTimes::act);
}

void CudaBackendImpl::StepOps::head() {
  const int64_t r = s.view.num_logit_rows;
  if (r > 0) {
    cuda::rmsnorm(s.x, s.view.logit_rows, r, b.config_.hidden_size, b.final_norm_.get<float>(),
                  static_cast<float>(b.config_.rms_norm_eps), s.xn, b.elem_, s.stream);
    b.gemm(s.blas, s.xn, r, b.lm_head_, b.config_.vocab_size, b.config_.hidden_size, logits, false);
  }
  b.mark(&CudaOpTimes::lm_head);
}

void CudaBackendImpl::copy_page(PageId src, PageId dst) {
  check_page(src, "copy_page");
  check_page(dst, "copy_page");
  // A page is num_layers runs of layer_bytes() at layer_pitch() (one run when page-major).
  check_cuda(cudaMemcpy2DAsync(page_ptr(dst), layer_pitch(), page_ptr(src), layer_pitch(),
                               layer_bytes(), kv_.num_layers, cudaMemcpyDeviceToDevice, stream_),
             "copy_page");
  check_cuda(cudaStreamSynchronize(stream_), "copy_page");
}

void CudaBackendImpl::read_pages(std::span<const PageId> pages, std::byte* out) const {
  const auto bytes = static_cast<size_t>(kv_bytes_per_page());
  for (PageId p : pages) {
    check_page(p, "read_pages");
    // The image is page-major whatever the layout: its layers are back to back.
    check_cuda(cudaMemcpy2DAsync(out, layer_bytes(), page_ptr(p), layer_pitch(), layer_bytes(),
                                 kv_.num_layers, cudaMemcpyDeviceToHost, copy_stream_),
               "read_pages");
    out += bytes;
  }
  check_cuda(cudaStreamSynchronize(copy_stream_), "read_pages");
}

void CudaBackendImpl::write_pages(std::span<const PageId> pages, const std::byte* in) {
  const auto bytes = static_cast<size_t>(kv_bytes_per_page());
  for (PageId p : pages) {
    check_page(p, "write_pages");
    check_cuda(cudaMemcpy2DAsync(page_ptr(p), layer_pitch(), in, layer_bytes(), layer_bytes(),
                                 kv_.num_layers, cudaMemcpyHostToDevice, copy_stream_),
               "write_pages");
    in += bytes;
  }
  check_cuda(cudaStreamSynchronize(copy_stream_), "write_pages");
}

// A layer of a page is 2 * num_kv_heads runs of page_size slots, each slot head_dim elements:
// the slots [first, first + count) of every run are one strided 2-D copy per layer (one for the
// whole page when page-major: its layers are back to back, as in the host image).
void CudaBackendImpl::copy_slots(PageId page, int32_t first, int32_t count, std::byte* host,
                                 bool to_host) const {
  const char* what = to_host ? "read_slots" : "write_slots";
  check_page(page, what);
  if (first < 0 || count < 0 || first + count > kv_.page_size)
    throw Error(std::string("cuda backend: ") + what + ": slots outside the page");
  if (count == 0) return;
  const size_t slot = static_cast<size_t>(kv_.head_dim) * elem_size(elem_);
  const size_t pitch = slot * kv_.page_size;
  const bool contiguous = layer_pitch() == layer_bytes();
  const int32_t calls = contiguous ? 1 : kv_.num_layers;
  const size_t runs = static_cast<size_t>(contiguous ? kv_.num_layers : 1) * 2 * kv_.num_kv_heads;
  for (int32_t l = 0; l < calls; ++l) {
    std::byte* device = page_ptr(page, l) + first * slot;
    std::byte* image = host + l * layer_bytes() + first * slot;
    check_cuda(to_host ? cudaMemcpy2DAsync(image, pitch, device, pitch, count * slot, runs,
                                           cudaMemcpyDeviceToHost, copy_stream_)
                       : cudaMemcpy2DAsync(device, pitch, image, pitch, count * slot, runs,
                                           cudaMemcpyHostToDevice, copy_stream_),
               what);
  }
  check_cuda(cudaStreamSynchronize(copy_stream_), what);
}

}  // namespace blend::cuda

namespace blend {

bool cuda_device_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error for later calls
    if (why) *why = cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
}

int64_t cuda_device_memory_bytes() {
  if (!cuda_device_available()) return 0;
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return 0;
  return static_cast<int64_t>(p.totalGlobalMem);
}

std::string cuda_device_description() {
  std::string why;
  if (!cuda_device_available(&why)) return "no GPU (" + why + ")";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "GPU 0 (properties unreadable)";
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f", static_cast<double>(p.totalGlobalMem) / (1 << 30));
  return std::string(p.name) + ", " + gib + " GiB, sm_" + std::to_string(p.major) +
         std::to_string(p.minor) + ", " + std::to_string(p.multiProcessorCount) + " SMs";
}

std::unique_ptr<CudaBackend> make_cuda_backend(const ModelConfig& config,
                                               const TensorStore& weights,
                                               const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackendImpl>(config, weights, options);
}

}  // namespace blend
