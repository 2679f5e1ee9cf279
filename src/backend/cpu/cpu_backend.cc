#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "backend/cpu/attention.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/memory.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/threads.h"
#include "core/error.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend {
namespace {

using cpu::GemmContext;
using cpu::Linear;

// Rows per GEMM kernel call in deterministic mode, where the kernels allow it (see
// cpu::deterministic_row_tile). 16, the default mode's row bucket: a decode batch of up to 16
// rows computes 16 rows in both modes (32 cost small decode batches ~2x on the lm_head); on
// AVX-512 one 16-row call per slice runs as fast per row as a 256-row one (issue 25).
constexpr int64_t kDeterministicRowTile = 16;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Grow-only, zero-initialised scratch memory for activations.
class Scratch {
 public:
  template <typename T = std::byte>
  T* get(size_t bytes) {
    if (bytes > size_) {
      size_ = (bytes + 4095) / 4096 * 4096;
      data_ = cpu::allocate_buffer(size_);
      std::memset(data_.get(), 0, size_);
    }
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  cpu::Buffer data_;
  size_t size_ = 0;
};

std::vector<float> load_vector(const TensorView& t) {
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.at(i);
  return v;
}

class CpuBackendImpl final : public CpuBackend {
 public:
  CpuBackendImpl(const ModelConfig& config, const TensorStore& store, const BackendOptions& options,
                 CpuGemmLib f32_gemm);

  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "cpu"; }
  int64_t kv_bytes_per_page() const override { return kv_.bytes_per_page(); }
  int64_t num_pages() const override { return kv_.num_pages(); }
  int64_t kv_bytes_per_token() const override { return kv_.bytes_per_page() / kv_.page_size(); }
  int64_t kv_memory_budget() const override { return kv_budget_; }
  void allocate_kv(int64_t num_pages) override;
  void forward(const ForwardBatch& batch, std::span<float> logits) override;
  void copy_page(PageId src, PageId dst) override { kv_.copy_page(src, dst); }
  void read_pages(std::span<const PageId> pages, std::byte* out) const override {
    for (PageId p : pages) kv_.read_page(p, out), out += kv_.bytes_per_page();
  }
  void write_pages(std::span<const PageId> pages, const std::byte* in) override {
    for (PageId p : pages) kv_.write_page(p, in), in += kv_.bytes_per_page();
  }

  void read_slots(PageId page, int32_t first, int32_t count, std::byte* image) const override {
    kv_.read_slots(page, first, count, image);
  }
  void write_slots(PageId page, int32_t first, int32_t count, const std::byte* image) override {
    kv_.write_slots(page, first, count, image);
  }

  const CpuOpTimes& op_times() const override { return times_; }
  void reset_op_times() override { times_ = {}; }
  DType compute_dtype() const override { return compute_; }
  std::string gemm_info() const override;

 private:
  struct Layer {
    std::vector<float> attn_norm, mlp_norm;
    std::unique_ptr<Linear> qkv, o, gate_up, down;
  };

  void embed(const ForwardBatch& batch, float* x) const;
  // Zeroes rows [from, to) of a GEMM input so padding rows hold finite values.
  void zero_rows(void* buf, int64_t from, int64_t to, int64_t cols) const {
    const size_t row = static_cast<size_t>(cols) * gemm_.elem_size();
    if (to > from) std::memset(static_cast<std::byte*>(buf) + from * row, 0, (to - from) * row);
  }

  ModelConfig config_;
  int threads_ = 1;
  DType file_dtype_ = DType::kBF16;  // of the checkpoint's tensors
  DType compute_ = DType::kBF16;     // GEMM inputs and packed weights: F32 or BF16
  GemmContext gemm_;
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;
  std::unique_ptr<Linear> lm_head_;
  DType embed_dtype_ = DType::kF32;  // kBF16 for bf16 checkpoints, else exact f32
  std::vector<std::byte> embed_;
  std::vector<double> inv_freq_;
  cpu::AttentionShape shape_;
  cpu::KvCache kv_;
  Scratch x_, xn_, qkv_, attn_, gu_, act_, cos_, sin_, logit_rows_, logit_tail_;
  CpuOpTimes times_;
  int64_t kv_budget_ = 0;
};

int resolve_threads(int threads) {
  return threads > 0 ? threads : omp_get_num_procs();
}

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// The KV cache a cpu backend offers by default: a third of what is free besides the weights, at
// most 8 GB (room for activations, the page cache of the weight file and other processes on a
// shared machine), at least 64 MB. Read before the weights are packed.
int64_t default_kv_budget(const TensorStore& store) {
  int64_t weight_bytes = 0;
  for (const auto& [name, view] : store.tensors()) weight_bytes += view->nbytes;
  return std::clamp<int64_t>((available_memory_bytes() - weight_bytes) / 3, 64 << 20,
                             8'000'000'000);
}

const ModelConfig& validated(const ModelConfig& config) {
  config.validate();
  return config;
}

CpuBackendImpl::CpuBackendImpl(const ModelConfig& config, const TensorStore& store,
                               const BackendOptions& options, CpuGemmLib f32_gemm)
    : config_(validated(config)),
      threads_(resolve_threads(options.threads)),
      file_dtype_(check_tensors(config_, store)),
      compute_(cpu_compute_dtype(file_dtype_)),
      gemm_({.compute = compute_,
             .lib = compute_ == DType::kF32 && f32_gemm == CpuGemmLib::kOpenBlas
                        ? cpu::GemmLib::kOpenBlas
                        : cpu::GemmLib::kOneDnn,
             .row_tile = options.deterministic
                             ? cpu::deterministic_row_tile(compute_, kDeterministicRowTile)
                             : 0}),
      kv_(config.num_layers, config.num_kv_heads, config.head_dim, options.page_size,
          options.num_pages, compute_),
      kv_budget_(default_kv_budget(store)) {
  cpu::use_threads(threads_);
  if (options.overlap) compute_steps_on_worker();

  auto get = [&](const std::string& name) { return &store.get(name); };
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    auto name = [&](const char* s) { return layer_tensor_name(i, s); };
    Layer layer;
    layer.attn_norm = load_vector(*get(name("input_layernorm.weight")));
    layer.mlp_norm = load_vector(*get(name("post_attention_layernorm.weight")));
    std::vector<const TensorView*> qkv_bias;
    if (config_.attention_bias)
      qkv_bias = {get(name("self_attn.q_proj.bias")), get(name("self_attn.k_proj.bias")),
                  get(name("self_attn.v_proj.bias"))};
    layer.qkv = std::make_unique<Linear>(
        gemm_,
        std::vector{get(name("self_attn.q_proj.weight")), get(name("self_attn.k_proj.weight")),
                    get(name("self_attn.v_proj.weight"))},
        qkv_bias);
    layer.o = std::make_unique<Linear>(gemm_, std::vector{get(name("self_attn.o_proj.weight"))});
    layer.gate_up = std::make_unique<Linear>(
        gemm_, std::vector{get(name("mlp.gate_proj.weight")), get(name("mlp.up_proj.weight"))});
    layer.down = std::make_unique<Linear>(gemm_, std::vector{get(name("mlp.down_proj.weight"))});
    layers_.push_back(std::move(layer));
  }
  final_norm_ = load_vector(*get("model.norm.weight"));
  const TensorView& embed = *get("model.embed_tokens.weight");
  lm_head_ = std::make_unique<Linear>(
      gemm_, std::vector{config_.tie_word_embeddings ? &embed : get("lm_head.weight")});

  // The embedding rows stay exact: bf16 as stored, f16 widened to f32.
  embed_dtype_ = file_dtype_ == DType::kBF16 ? DType::kBF16 : DType::kF32;
  embed_.resize(embed.numel() * dtype_size(embed_dtype_));
  if (file_dtype_ == embed_dtype_) {
    std::memcpy(embed_.data(), embed.data, embed_.size());
  } else {
    auto* out = reinterpret_cast<float*>(embed_.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < embed.numel(); ++i) out[i] = embed.at(i);
  }

  inv_freq_ = rope_inv_freq(config_);
  shape_ = {.num_heads = config_.num_heads,
            .num_kv_heads = config_.num_kv_heads,
            .head_dim = config_.head_dim,
            .sliding_window = config_.sliding_window.value_or(0)};
}

void CpuBackendImpl::allocate_kv(int64_t num_pages) {
  if (kv_.num_pages() > 0) throw Error("cpu backend: the KV cache is allocated already");
  kv_ = cpu::KvCache(config_.num_layers, config_.num_kv_heads, config_.head_dim, kv_.page_size(),
                     num_pages, compute_);
}

std::string CpuBackendImpl::gemm_info() const {
  std::string s = gemm_.options().lib == cpu::GemmLib::kOpenBlas ? "openblas" : "onednn";
  s += compute_ == DType::kF32 ? " f32 " : " bf16 ";
  s += layers_.empty() ? lm_head_->impl() : layers_[0].gate_up->impl();
  if (gemm_.options().row_tile > 0) s += ", row tile " + std::to_string(gemm_.options().row_tile);
  return s;
}

void CpuBackendImpl::embed(const ForwardBatch& batch, float* x) const {
  const int64_t h = config_.hidden_size, n = batch.num_tokens();
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = batch.tokens[t];
    if (embed_dtype_ == DType::kF32) {
      std::memcpy(x + t * h, embed_.data() + row * h * 4, h * 4);
    } else {
      const auto* e = reinterpret_cast<const uint16_t*>(embed_.data()) + row * h;
      for (int64_t i = 0; i < h; ++i) x[t * h + i] = bf16_to_f32(e[i]);
    }
  }
}

void CpuBackendImpl::forward(const ForwardBatch& batch, std::span<float> logits) {
  double t = now();
  auto lap = [&](double& slot) {
    const double t1 = now();
    slot += t1 - t;
    t = t1;
  };
  check_forward_batch(batch, config_, kv_.page_size(), kv_.num_pages(), logits.size(), "cpu");
  const int64_t m = batch.num_tokens();
  if (m == 0) return;
  omp_set_num_threads(threads_);  // oneDNN and OpenBLAS follow the calling thread's setting

  const int64_t h = config_.hidden_size, qd = config_.q_dim(), kvd = config_.kv_dim();
  const int64_t f = config_.intermediate_size, nqkv = qd + 2 * kvd, half = config_.head_dim / 2;
  const int64_t mp = gemm_.padded_rows(m);
  const size_t es = gemm_.elem_size();
  const auto eps = static_cast<float>(config_.rms_norm_eps);

  float* x = x_.get<float>(mp * h * 4);
  void* xn = xn_.get(mp * h * es);
  float* qkv = qkv_.get<float>(mp * nqkv * 4);
  void* attn = attn_.get(mp * qd * es);
  float* gu = gu_.get<float>(mp * 2 * f * 4);
  void* act = act_.get(mp * f * es);
  float* cos = cos_.get<float>(m * half * 4);
  float* sin = sin_.get<float>(m * half * 4);

  embed(batch, x);
  std::memset(x + m * h, 0, (mp - m) * h * 4);
  zero_rows(xn, m, mp, h);
  zero_rows(attn, m, mp, qd);
  zero_rows(act, m, mp, f);
  cpu::rope_tables(batch.positions.data(), m, inv_freq_, cos, sin, threads_);
  const auto items = cpu::plan_attention(batch, shape_);
  lap(times_.embed);

  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer& layer = layers_[li];
    cpu::rmsnorm(x, h, m, h, layer.attn_norm.data(), eps, compute_, xn, threads_);
    lap(times_.norm);
    layer.qkv->forward(xn, m, qkv);
    lap(times_.qkv);
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      float* row = qkv + i * nqkv;
      cpu::rope_apply(row, config_.num_heads, half, cos + i * half, sin + i * half);
      cpu::rope_apply(row + qd, config_.num_kv_heads, half, cos + i * half, sin + i * half);
    }
    cpu::write_kv(batch, qkv, nqkv, qd, qd + kvd, static_cast<int64_t>(li), kv_, threads_);
    lap(times_.rope_kv);
    cpu::paged_attention(batch, items, qkv, nqkv, static_cast<int64_t>(li), kv_, shape_, compute_,
                         attn, threads_);
    lap(times_.attention);
    layer.o->forward(attn, m, x, /*accumulate=*/true);
    lap(times_.o_proj);
    cpu::rmsnorm(x, h, m, h, layer.mlp_norm.data(), eps, compute_, xn, threads_);
    lap(times_.norm);
    layer.gate_up->forward(xn, m, gu);
    lap(times_.gate_up);
    cpu::swiglu(gu, m, f, compute_, act, threads_);
    lap(times_.act);
    layer.down->forward(act, m, x, /*accumulate=*/true);
    lap(times_.down);
  }

  // Final norm and lm_head only for the last token of each chunk that wants logits.
  std::vector<int64_t> rows;
  for (const SeqChunk& c : batch.chunks)
    if (c.wants_logits) rows.push_back(c.token_offset + c.num_tokens - 1);
  const int64_t r = static_cast<int64_t>(rows.size());
  if (r > 0) {
    const int64_t rp = gemm_.padded_rows(r);
    float* lx = logit_rows_.get<float>(r * h * 4);
    for (int64_t i = 0; i < r; ++i) std::memcpy(lx + i * h, x + rows[i] * h, h * 4);
    void* ln = xn;  // r <= m rows, so the layers' norm buffer has room
    cpu::rmsnorm(lx, h, r, h, final_norm_.data(), eps, compute_, ln, threads_);
    zero_rows(ln, r, rp, h);
    // Whole row groups straight into `logits`; the remainder through a small padded buffer.
    const int64_t vocab = config_.vocab_size;
    const int64_t group = gemm_.padded_rows(1);
    const int64_t full = r / group * group;
    if (full > 0) lm_head_->forward(ln, full, logits.data());
    if (full < r) {
      float* tail = logit_tail_.get<float>(group * vocab * 4);
      lm_head_->forward(static_cast<std::byte*>(ln) + full * h * es, r - full, tail);
      std::memcpy(logits.data() + full * vocab, tail, (r - full) * vocab * 4);
    }
  }
  lap(times_.lm_head);
  times_.steps += 1;
  times_.tokens += m;
}

}  // namespace

DType cpu_compute_dtype(DType checkpoint) {
  // bf16 and f16 checkpoints compute in bf16 where oneDNN has a bf16 kernel, else in f32
  // (AVX2-only CPUs): twice the weight and KV memory, the same model.
  return checkpoint == DType::kF32 || !cpu::onednn_has_bf16_matmul() ? DType::kF32 : DType::kBF16;
}

std::unique_ptr<CpuBackend> make_cpu_backend(const ModelConfig& config, const TensorStore& weights,
                                             const BackendOptions& options, CpuGemmLib f32_gemm) {
  return std::make_unique<CpuBackendImpl>(config, weights, options, f32_gemm);
}

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& config, const TensorStore& weights,
                                          const BackendOptions& options) {
  return make_cpu_backend(config, weights, options, CpuGemmLib::kOneDnn);
}

}  // namespace blend
