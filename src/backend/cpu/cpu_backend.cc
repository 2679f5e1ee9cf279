#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>

#include "backend/cpu/attention.h"
#include "backend/cpu/blocks.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/memory.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/threads.h"
#include "backend/layer_op_seconds.h"
#include "backend/llama_forward.h"
#include "core/error.h"
#include "model/lora.h"
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

class CpuBackendImpl final : public CpuBackend {
 public:
  CpuBackendImpl(const ModelConfig& config, std::span<const TensorStore* const> stores,
                 const BackendOptions& options, CpuGemmLib f32_gemm,
                 std::span<const LoraAdapter* const> adapters);

  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "cpu"; }
  int32_t num_models() const override { return static_cast<int32_t>(blocks_.chains.size()); }
  WeightStats weight_stats() const override { return blocks_.stats; }
  int64_t kv_bytes_per_page() const override { return kv_.bytes_per_page(); }
  int64_t num_pages() const override { return kv_.num_pages(); }
  int64_t kv_bytes_per_token() const override { return kv_.bytes_per_page() / kv_.page_size(); }
  int64_t kv_memory_budget() const override { return kv_budget_; }
  void allocate_kv(int64_t num_pages) override;
  void forward(const ForwardBatch& batch, std::span<float> logits) override;
  bool scores_every_row() const override { return true; }
  void forward_layers(const ForwardBatch& batch, int64_t first, int64_t last,
                      std::span<const float> hidden_in, std::span<float> hidden_out,
                      std::span<float> logits) override;
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
  OpStatistics op_statistics() const override {
    return {.seconds = layer_op_seconds(times_, 1.0),
            .steps = times_.steps,
            .tokens = times_.tokens,
            .thread_steps = times_.thread_steps};
  }
  DType compute_dtype() const override { return compute_; }
  std::string gemm_info() const override;
  ModelId add_chain(const ChainSpec& spec) override;
  bool shares_block(ModelId a, ModelId b, int64_t layer, LayerBlock block) const override;
  void set_threads(int threads) override {
    core_share_.reset();
    threads_ = std::clamp(threads, 1, max_threads_);
  }
  int threads() const override { return threads_; }

 private:
  using Embedding = cpu::Embedding;
  using LoraDelta = cpu::LoraDelta;
  using Attention = cpu::AttentionBlock;
  using Ffn = cpu::FfnBlock;
  using Head = cpu::HeadBlock;
  using Chain = cpu::Chain;

  // Rows [begin, end) of the batch that run through one block.
  struct RowRun {
    int64_t begin = 0, end = 0;
    ModelId model = 0;
  };
  void embed(const ForwardBatch& batch, const std::vector<RowRun>& runs, float* x) const;
  // Gemma's attention scale, soft-capping and local RoPE (constructor).
  void set_up_gemma();
  // One pass's operations, in the order backend/llama_forward.h gives them.
  struct StepOps;
  // Layers [first, last) of the batch (forward() runs them all). The stream enters from
  // hidden_in or, when empty, the embedding; leaves into hidden_out unless empty. Logits: the
  // last token of each chunk that wants them, or every row when `all_rows`.
  void run_layers(const ForwardBatch& batch, int64_t first, int64_t last,
                  std::span<const float> hidden_in, std::span<float> hidden_out,
                  std::span<float> logits, bool all_rows);
  // Consecutive chunks of one model as row runs, and those runs merged where consecutive models
  // share the block `pick` chooses: each block computes once over all its rows (BlockLLM §5.1).
  static std::vector<RowRun> model_runs(const ForwardBatch& batch);
  // The runs of chains that reach block `pick` needs (has(chain) says), merged where adjacent
  // runs share the block `pick` chooses.
  template <typename Has, typename Pick>
  std::vector<RowRun> block_runs(const std::vector<RowRun>& runs, Has has, Pick pick) const;
  // y[run rows] (+)= x[run rows] W^T. A run that is the whole batch calls the kernel directly;
  // others go through padded scratch, since a call writes padded_rows(m) rows (gemm.h).
  void linear(Linear& w, const void* x, const RowRun& run, int64_t m, float* y,
              bool accumulate = false);
  // y[run rows] += the adapter's delta for inputs x[run rows] (compute dtype).
  void lora(const LoraDelta& delta, const void* x, const RowRun& run, int64_t m, float* y);
  // Zeroes rows [from, to) of a GEMM input so padding rows hold finite values.
  void zero_rows(void* buf, int64_t from, int64_t to, int64_t cols) const {
    const size_t row = static_cast<size_t>(cols) * gemm_.elem_size();
    if (to > from) std::memset(static_cast<std::byte*>(buf) + from * row, 0, (to - from) * row);
  }

  ModelConfig config_;
  int max_threads_ = 1;  // at construction (what the weights were laid out for)
  int threads_ = 1;      // this pass's OpenMP threads: all of max_threads, or what core_share_ says
  // Set when the user left the thread count to blend (BackendOptions::threads 0): each pass runs
  // on the cores other processes leave free (threads.h).
  std::optional<cpu::CoreShare> core_share_;
  DType file_dtype_ = DType::kBF16;  // of the checkpoint's tensors
  DType compute_ = DType::kBF16;     // GEMM inputs and packed weights: F32 or BF16
  GemmContext gemm_;
  cpu::BlockSet blocks_;  // the models' chains and the blocks they point to
  std::vector<double> inv_freq_;
  double rope_scale_ = 1.0;             // cos and sin multiplier (longrope's attention factor)
  std::vector<double> inv_freq_local_;  // Gemma 3's local layers' RoPE, or empty
  cpu::AttentionShape shape_;
  cpu::KvCache kv_;
  Scratch x_, xn_, qkv_, attn_, gu_, act_, cos_, sin_, logit_rows_, logit_tail_, run_in_, run_out_,
      lora_t_, lora_in_, post_, cos_local_, sin_local_;
  CpuOpTimes times_;
  int64_t kv_budget_ = 0;
};

// The user's count, or the cores this process may run on: its affinity mask (omp_get_num_procs)
// capped by its cgroup's CPU quota (a container's --cpus).
int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const int procs = omp_get_num_procs();
  const int quota = cpu::cgroup_cpu_limit();
  return quota > 0 ? std::min(procs, quota) : procs;
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
// most 8 GB (room for activations, the page cache of the weight files and other processes on a
// shared machine), at least 64 MB. Read before the weights are packed.
int64_t default_kv_budget(std::span<const TensorStore* const> stores) {
  int64_t weight_bytes = 0;
  for (const TensorStore* store : stores)
    for (const auto& [name, view] : store->tensors()) weight_bytes += view->nbytes;
  return std::clamp<int64_t>((available_memory_bytes() - weight_bytes) / 3, 64 << 20,
                             8'000'000'000);
}

const ModelConfig& validated(const ModelConfig& config) {
  config.validate();
  return config;
}

// The checkpoints' dtype: every model's tensors checked against `config`, all in one dtype.
DType checked_dtype(const ModelConfig& config, std::span<const TensorStore* const> stores) {
  if (stores.empty()) throw Error("cpu backend: no model weights");
  const DType dtype = check_tensors(config, *stores[0], QuantizedWeights::kAllowMatrices);
  for (size_t i = 1; i < stores.size(); ++i) {
    const DType other = check_tensors(config, *stores[i], QuantizedWeights::kAllowMatrices);
    if (other != dtype)
      throw Error("cpu backend: model " + std::to_string(i) + "'s checkpoint is " +
                  std::string(dtype_name(other)) + ", model 0's " + std::string(dtype_name(dtype)) +
                  "; models served together need one dtype");
  }
  return dtype;
}

// Hash of a tensor's dtype, shape and bytes: its content address.
CpuBackendImpl::CpuBackendImpl(const ModelConfig& config,
                               std::span<const TensorStore* const> stores,
                               const BackendOptions& options, CpuGemmLib f32_gemm,
                               std::span<const LoraAdapter* const> adapters)
    : config_(validated(config)),
      threads_(resolve_threads(options.threads)),
      file_dtype_(checked_dtype(config_, stores)),
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
      kv_budget_(default_kv_budget(stores)) {
  cpu::use_threads(threads_);
  max_threads_ = threads_;
  if (options.threads == 0 && threads_ > 1) core_share_.emplace(threads_);
  if (options.overlap) compute_steps_on_worker();
  cpu::BlockLoader loader(blocks_, gemm_, config_, file_dtype_,
                          /*share=*/stores.size() > 1 && options.tenancy == Tenancy::kBlocks,
                          /*per_model=*/options.tenancy == Tenancy::kPerModel);
  if (!adapters.empty() && adapters.size() != stores.size())
    throw Error("cpu backend: " + std::to_string(adapters.size()) + " adapter slots for " +
                std::to_string(stores.size()) + " models");
  for (size_t i = 0; i < stores.size(); ++i)
    blocks_.chains.push_back(loader.load(*stores[i], adapters.empty() ? nullptr : adapters[i]));
  inv_freq_ = rope_inv_freq(config_, options.max_model_len);
  rope_scale_ = rope_attention_factor(config_);
  shape_ = {.num_heads = config_.num_heads,
            .num_kv_heads = config_.num_kv_heads,
            .head_dim = config_.head_dim,
            .sliding_window = config_.sliding_window.value_or(0)};
  if (config_.gemma.enabled) set_up_gemma();
}

void CpuBackendImpl::set_up_gemma() {
  const GemmaSettings& g = config_.gemma;
  // transformers: scaling = query_pre_attn_scalar ** -0.5 (a Python float), applied in f32.
  shape_.scale = static_cast<float>(1.0 / std::sqrt(g.query_pre_attn_scalar));
  shape_.softcap = static_cast<float>(g.attn_logit_softcapping);
  if (g.rope_local_theta) {
    ModelConfig local = config_;  // Gemma3RotaryEmbedding of the local layers: unscaled
    local.rope_theta = *g.rope_local_theta;
    local.rope_scaling = RopeScaling{};
    inv_freq_local_ = rope_inv_freq(local);
  }
}

void CpuBackendImpl::allocate_kv(int64_t num_pages) {
  if (kv_.num_pages() > 0) throw Error("cpu backend: the KV cache is allocated already");
  kv_ = cpu::KvCache(config_.num_layers, config_.num_kv_heads, config_.head_dim, kv_.page_size(),
                     num_pages, compute_);
}

std::string CpuBackendImpl::gemm_info() const {
  const std::string impl =
      blocks_.ffns.empty() ? blocks_.heads[0]->lm_head->impl() : blocks_.ffns[0]->gate_up->impl();
  if (impl.starts_with("q8_0") || impl.starts_with("k-quant"))
    return impl + " (int8 activations a 32-value block)";
  std::string s = gemm_.options().lib == cpu::GemmLib::kOpenBlas ? "openblas" : "onednn";
  s += compute_ == DType::kF32 ? " f32 " : " bf16 ";
  s += impl;
  if (gemm_.options().row_tile > 0) s += ", row tile " + std::to_string(gemm_.options().row_tile);
  return s;
}

std::vector<CpuBackendImpl::RowRun> CpuBackendImpl::model_runs(const ForwardBatch& batch) {
  std::vector<RowRun> runs;
  for (const SeqChunk& c : batch.chunks) {
    if (!runs.empty() && runs.back().model == c.model)
      runs.back().end += c.num_tokens;
    else
      runs.push_back({c.token_offset, c.token_offset + c.num_tokens, c.model});
  }
  return runs;
}

template <typename Has, typename Pick>
std::vector<CpuBackendImpl::RowRun> CpuBackendImpl::block_runs(const std::vector<RowRun>& runs,
                                                               Has has, Pick pick) const {
  std::vector<RowRun> merged;
  for (const RowRun& run : runs) {
    if (!has(blocks_.chains[run.model])) continue;
    if (!merged.empty() && merged.back().end == run.begin &&
        pick(blocks_.chains[merged.back().model]) == pick(blocks_.chains[run.model]))
      merged.back().end = run.end;
    else
      merged.push_back(run);
  }
  return merged;
}

ModelId CpuBackendImpl::add_chain(const ChainSpec& spec) {
  const auto models = static_cast<ModelId>(blocks_.chains.size());
  auto check = [&](ModelId m) {
    if (m < 0 || m >= models)
      throw Error("cpu backend: a chain names model " + std::to_string(m) + " of " +
                  std::to_string(models));
    return static_cast<size_t>(m);
  };
  const auto layers = static_cast<int64_t>(spec.attention.size());
  if (layers > config_.num_layers ||
      (spec.ffn.size() != spec.attention.size() && spec.ffn.size() + 1 != spec.attention.size()))
    throw Error("cpu backend: a chain of " + std::to_string(spec.attention.size()) +
                " attention and " + std::to_string(spec.ffn.size()) +
                " FFN blocks (at most one attention more, at most num_hidden_layers)");
  Chain chain;
  chain.embed = blocks_.chains[check(spec.base)].embed;
  chain.head = blocks_.chains[check(spec.base)].head;
  for (size_t i = 0; i < spec.attention.size(); ++i)
    chain.attention.push_back(blocks_.chains[check(spec.attention[i])].attention[i]);
  for (size_t i = 0; i < spec.ffn.size(); ++i)
    chain.ffn.push_back(blocks_.chains[check(spec.ffn[i])].ffn[i]);
  blocks_.chains.push_back(chain);
  return models;
}

bool CpuBackendImpl::shares_block(ModelId a, ModelId b, int64_t layer, LayerBlock block) const {
  const Chain &ca = blocks_.chains.at(static_cast<size_t>(a)),
              &cb = blocks_.chains.at(static_cast<size_t>(b));
  const auto l = static_cast<size_t>(layer);
  if (block == LayerBlock::kAttention)
    return l < ca.attention.size() && l < cb.attention.size() && ca.attention[l] == cb.attention[l];
  return l < ca.ffn.size() && l < cb.ffn.size() && ca.ffn[l] == cb.ffn[l];
}

void CpuBackendImpl::linear(Linear& w, const void* x, const RowRun& run, int64_t m, float* y,
                            bool accumulate) {
  const int64_t rows = run.end - run.begin, k = w.k(), n = w.n();
  const size_t es = gemm_.elem_size();
  if (run.begin == 0 && rows == m) return w.forward(x, m, y, accumulate);
  const int64_t padded = gemm_.padded_rows(rows);
  auto* in = run_in_.get<std::byte>(padded * k * es);
  std::memcpy(in, static_cast<const std::byte*>(x) + run.begin * k * es, rows * k * es);
  zero_rows(in, rows, padded, k);
  float* out = run_out_.get<float>(padded * n * 4);
  w.forward(in, rows, out);
  float* dst = y + run.begin * n;
  if (!accumulate) {
    std::memcpy(dst, out, rows * n * 4);
    return;
  }
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int64_t i = 0; i < rows * n; ++i) dst[i] += out[i];
}

void CpuBackendImpl::lora(const LoraDelta& delta, const void* x, const RowRun& run, int64_t m,
                          float* y) {
  const int64_t r = delta.a->n(), mp = gemm_.padded_rows(m);
  const size_t es = gemm_.elem_size();
  float* t = lora_t_.get<float>(mp * r * 4);
  linear(*delta.a, x, run, m, t);
  // x A^T in the GEMM input dtype; rows past m stay as the scratch holds them (zero or earlier
  // finite values), so a whole-batch call reads finite padding.
  auto* in = lora_in_.get<std::byte>(mp * r * es);
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int64_t i = run.begin; i < run.end; ++i)
    cpu::store_row(t + i * r, r, compute_, in + i * r * static_cast<int64_t>(es));
  linear(*delta.b, in, run, m, y, /*accumulate=*/true);
}

void CpuBackendImpl::embed(const ForwardBatch& batch, const std::vector<RowRun>& runs,
                           float* x) const {
  const int64_t h = config_.hidden_size;
  for (const RowRun& run : runs) {
    const Embedding& e = *blocks_.chains[run.model].embed;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t t = run.begin; t < run.end; ++t) {
      const int64_t row = batch.tokens[t];
      if (e.dtype == DType::kF32) {
        std::memcpy(x + t * h, e.rows.data() + row * h * 4, h * 4);
      } else if (is_block_type(e.dtype)) {
        dequantize_block_row(e.dtype, e.rows.data() + row * row_bytes(e.dtype, h), h, x + t * h);
      } else {
        const auto* in = reinterpret_cast<const uint16_t*>(e.rows.data()) + row * h;
        for (int64_t i = 0; i < h; ++i) x[t * h + i] = bf16_to_f32(in[i]);
      }
    }
  }
}

void CpuBackendImpl::forward(const ForwardBatch& batch, std::span<float> logits) {
  check_forward_batch(batch, config_, kv_.page_size(), kv_.num_pages(), logits.size(), "cpu",
                      num_models());
  run_layers(batch, 0, config_.num_layers, {}, {}, logits, /*all_rows=*/false);
}

void CpuBackendImpl::forward_layers(const ForwardBatch& batch, int64_t first, int64_t last,
                                    std::span<const float> hidden_in, std::span<float> hidden_out,
                                    std::span<float> logits) {
  // Logit rows are every row here, checked below (not the chunks' wants_logits).
  check_forward_batch(batch, config_, kv_.page_size(), kv_.num_pages(),
                      std::numeric_limits<size_t>::max(), "cpu", num_models());
  const auto m = static_cast<size_t>(batch.num_tokens());
  const auto h = static_cast<size_t>(config_.hidden_size);
  auto fail = [](const std::string& what) { throw Error("cpu backend: forward_layers: " + what); };
  if (first < 0 || first > last || last > config_.num_layers)
    fail("layers [" + std::to_string(first) + ", " + std::to_string(last) + ") outside 0.." +
         std::to_string(config_.num_layers));
  if (hidden_in.empty() ? first != 0 : hidden_in.size() != m * h)
    fail(hidden_in.empty() ? "no input states for a range that does not start at layer 0"
                           : "hidden_in holds " + std::to_string(hidden_in.size()) +
                                 " floats, the batch needs " + std::to_string(m * h));
  if (!hidden_out.empty() && hidden_out.size() != m * h)
    fail("hidden_out holds " + std::to_string(hidden_out.size()) + " floats, the batch needs " +
         std::to_string(m * h));
  if (!logits.empty() && logits.size() != m * static_cast<size_t>(config_.vocab_size))
    fail("logits hold " + std::to_string(logits.size()) + " floats, the batch needs " +
         std::to_string(m * static_cast<size_t>(config_.vocab_size)));
  run_layers(batch, first, last, hidden_in, hidden_out, logits, /*all_rows=*/true);
}

// One pass over a batch: its buffers, row runs and attention plan, and the operations that
// backend/llama_forward.h sequences. A block-level op runs once per run of rows whose chains
// share the block (BlockLLM §5.1); rows whose chain ends before a layer skip it.
struct CpuBackendImpl::StepOps {
  StepOps(CpuBackendImpl& backend, const ForwardBatch& batch, std::span<const float> hidden_in,
          std::span<float> hidden_out, std::span<float> logits, bool all_rows);

  void embed();
  void norm(int64_t layer, llama::Norm which);
  void project(int64_t layer, llama::Projection which);
  void qk_norm(int64_t layer);
  void rope_write_kv(int64_t layer);
  void attention(int64_t layer);
  void swiglu();
  void head();
  // Gemma: the output of a layer's attention or MLP (in `post`) through that block's own norm,
  // then added to the residual.
  void post_norm(size_t layer, bool attention);
  // The RoPE tables of a layer: Gemma 3's local ones on its sliding layers.
  bool local_rope(int64_t layer) const {
    return !b.inv_freq_local_.empty() && config.gemma.sliding_layers[static_cast<size_t>(layer)];
  }

  CpuBackendImpl& b;
  const ForwardBatch& batch;
  std::span<const float> hidden_in;
  std::span<float> hidden_out, logits;
  bool all_rows;
  const ModelConfig& config;
  const int64_t m, h, qd, kvd, f, nqkv, half, mp;
  const int64_t group;  // the lm_head of a run of logit rows may read a row group past the last
  const size_t es;
  const float eps;
  float* x;
  void* xn;
  float* qkv;
  void* attn;
  float* gu;
  void* act;
  float* cos;
  float* sin;
  float* post = nullptr;  // Gemma's attention / MLP output before its norm
  float* cos_local = nullptr;
  float* sin_local = nullptr;
  std::vector<RowRun> runs;
  std::vector<cpu::AttentionItem> items;
  double t;  // when the last op ended (CpuOpTimes)

 private:
  void lap(double& slot) {
    const double t1 = now();
    slot += t1 - t;
    t = t1;
  }
  std::byte* rows_of(void* buf, int64_t row, int64_t cols) const {
    return static_cast<std::byte*>(buf) + row * cols * static_cast<int64_t>(es);
  }
  const Chain& chain(const RowRun& run) const { return b.blocks_.chains[run.model]; }
  // Layer l's attention (or FFN) block of a chain; null when the chain ends before it.
  static const void* block_of(const Chain& c, size_t l, bool attention) {
    if (attention) return l < c.attention.size() ? c.attention[l] : nullptr;
    return l < c.ffn.size() ? c.ffn[l] : nullptr;
  }
  // The rows whose chains reach that block, in runs merged where `pick` (by default the block
  // itself) is the same.
  template <typename Pick>
  std::vector<RowRun> runs_of(size_t l, bool attention, Pick pick) const {
    return b.block_runs(
        runs, [&](const Chain& c) { return block_of(c, l, attention) != nullptr; }, pick);
  }
  std::vector<RowRun> runs_of(size_t l, bool attention) const {
    return runs_of(l, attention, [&](const Chain& c) { return block_of(c, l, attention); });
  }
};

CpuBackendImpl::StepOps::StepOps(CpuBackendImpl& backend, const ForwardBatch& step_batch,
                                 std::span<const float> states_in, std::span<float> states_out,
                                 std::span<float> logits_out, bool every_row)
    : b(backend),
      batch(step_batch),
      hidden_in(states_in),
      hidden_out(states_out),
      logits(logits_out),
      all_rows(every_row),
      config(backend.config_),
      m(step_batch.num_tokens()),
      h(config.hidden_size),
      qd(config.q_dim()),
      kvd(config.kv_dim()),
      f(config.intermediate_size),
      nqkv(qd + 2 * kvd),
      half(config.rotary_dim() / 2),
      mp(backend.gemm_.padded_rows(m)),
      group(backend.gemm_.padded_rows(1)),
      es(backend.gemm_.elem_size()),
      eps(static_cast<float>(config.rms_norm_eps)),
      t(now()) {
  x = b.x_.get<float>(mp * h * 4);
  xn = b.xn_.get((mp + group) * h * es);
  qkv = b.qkv_.get<float>(mp * nqkv * 4);
  attn = b.attn_.get(mp * qd * es);
  gu = b.gu_.get<float>(mp * 2 * f * 4);
  act = b.act_.get(mp * f * es);
  cos = b.cos_.get<float>(m * half * 4);
  sin = b.sin_.get<float>(m * half * 4);
  if (config.gemma.enabled) post = b.post_.get<float>(mp * h * 4);
  if (!b.inv_freq_local_.empty()) {
    cos_local = b.cos_local_.get<float>(m * half * 4);
    sin_local = b.sin_local_.get<float>(m * half * 4);
  }
  runs = model_runs(step_batch);
}

void CpuBackendImpl::StepOps::embed() {
  if (hidden_in.empty())
    b.embed(batch, runs, x);
  else
    std::memcpy(x, hidden_in.data(), m * h * 4);
  if (hidden_in.empty() && config.gemma.enabled) {
    // Gemma scales the embeddings by sqrt(hidden_size), a tensor of the activations' dtype.
    float normalizer = std::sqrt(static_cast<float>(h));
    if (b.compute_ == DType::kBF16) normalizer = bf16_to_f32(f32_to_bf16(normalizer));
#pragma omp parallel for num_threads(b.threads_) schedule(static)
    for (int64_t i = 0; i < m * h; ++i) x[i] *= normalizer;
  }
  std::memset(x + m * h, 0, (mp - m) * h * 4);
  b.zero_rows(xn, m, mp, h);
  b.zero_rows(attn, m, mp, qd);
  b.zero_rows(act, m, mp, f);
  cpu::rope_tables(batch.positions.data(), m, b.inv_freq_, cos, sin, b.threads_, b.rope_scale_);
  if (cos_local)
    cpu::rope_tables(batch.positions.data(), m, b.inv_freq_local_, cos_local, sin_local,
                     b.threads_);
  items = cpu::plan_attention(batch, b.shape_);
  lap(b.times_.embed);
}

void CpuBackendImpl::StepOps::norm(int64_t layer, llama::Norm which) {
  const auto l = static_cast<size_t>(layer);
  const bool attention = which == llama::Norm::kAttention;
  for (const RowRun& run : runs_of(l, attention)) {
    const Chain& c = chain(run);
    const float* weight = attention ? c.attention[l]->norm->data() : c.ffn[l]->norm->data();
    cpu::rmsnorm(x + run.begin * h, h, run.end - run.begin, h, weight, eps, b.compute_,
                 rows_of(xn, run.begin, h), b.threads_);
  }
  lap(b.times_.norm);
}

void CpuBackendImpl::StepOps::project(int64_t layer, llama::Projection which) {
  using P = llama::Projection;
  const auto l = static_cast<size_t>(layer);
  const bool attention = which == P::kQkv || which == P::kO;
  // The block's projection and its adapter's delta (null without one).
  auto parts = [&](const Chain& c) -> std::pair<Linear*, const LoraDelta*> {
    switch (which) {
      case P::kQkv:
        return {c.attention[l]->qkv.get(), c.attention[l]->qkv_lora.get()};
      case P::kO:
        return {c.attention[l]->o.get(), c.attention[l]->o_lora.get()};
      case P::kGateUp:
        return {c.ffn[l]->gate_up.get(), c.ffn[l]->gate_up_lora.get()};
      case P::kDown:
        return {c.ffn[l]->down.get(), c.ffn[l]->down_lora.get()};
    }
    return {nullptr, nullptr};
  };
  auto weights = [&](const Chain& c) { return parts(c).first; };
  const void* in = which == P::kO ? attn : which == P::kDown ? act : xn;
  // Gemma's outputs pass a norm before the residual add (post_norm below).
  const bool to_residual = which == P::kO || which == P::kDown;
  const bool residual = to_residual && !post;
  float* out = which == P::kQkv ? qkv : which == P::kGateUp ? gu : residual ? x : post;
  // Base projections run over the rows of every block sharing them, adapters on their own.
  for (const RowRun& run : runs_of(l, attention, weights))
    b.linear(*weights(chain(run)), in, run, m, out, residual);
  for (const RowRun& run : runs_of(l, attention))
    if (const LoraDelta* delta = parts(chain(run)).second) b.lora(*delta, in, run, m, out);
  if (to_residual && post) post_norm(l, attention);
  CpuOpTimes& times = b.times_;
  lap(which == P::kQkv      ? times.qkv
      : which == P::kO      ? times.o_proj
      : which == P::kGateUp ? times.gate_up
                            : times.down);
}

void CpuBackendImpl::StepOps::qk_norm(int64_t layer) {
  if (!config.qk_norm) return;
  const auto l = static_cast<size_t>(layer);
  const int64_t d = config.head_dim;
  for (const RowRun& run : runs_of(l, /*attention=*/true)) {
    const auto& block = *chain(run).attention[l];
    // Each head of a token is one row of the norm (in place: a row is read before it is
    // written); the tokens are spread over the threads.
#pragma omp parallel for num_threads(b.threads_) schedule(static)
    for (int64_t i = run.begin; i < run.end; ++i) {
      float* q = qkv + i * nqkv;
      cpu::rmsnorm(q, d, config.num_heads, d, block.q_norm->data(), eps, DType::kF32, q, 1);
      cpu::rmsnorm(q + qd, d, config.num_kv_heads, d, block.k_norm->data(), eps, DType::kF32,
                   q + qd, 1);
    }
  }
  lap(b.times_.norm);
}

void CpuBackendImpl::StepOps::post_norm(size_t l, bool attention) {
  for (const RowRun& run : runs_of(l, attention)) {
    const Chain& c = chain(run);
    const float* weight =
        attention ? c.attention[l]->post_norm->data() : c.ffn[l]->post_norm->data();
    float* rows = post + run.begin * h;
    const int64_t n = (run.end - run.begin) * h;
    cpu::rmsnorm(rows, h, run.end - run.begin, h, weight, eps, DType::kF32, rows, b.threads_);
    float* dst = x + run.begin * h;
#pragma omp parallel for num_threads(b.threads_) schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] += rows[i];
  }
}

void CpuBackendImpl::StepOps::rope_write_kv(int64_t layer) {
  const bool local = local_rope(layer);
  const float* cs = local ? cos_local : cos;
  const float* sn = local ? sin_local : sin;
#pragma omp parallel for num_threads(b.threads_) schedule(static)
  for (int64_t i = 0; i < m; ++i) {
    float* row = qkv + i * nqkv;
    const int64_t d = config.head_dim;
    cpu::rope_apply(row, config.num_heads, d, half, cs + i * half, sn + i * half);
    cpu::rope_apply(row + qd, config.num_kv_heads, d, half, cs + i * half, sn + i * half);
  }
  cpu::write_kv(batch, qkv, nqkv, qd, qd + kvd, layer, b.kv_, b.threads_);
  lap(b.times_.rope_kv);
}

void CpuBackendImpl::StepOps::attention(int64_t layer) {
  cpu::AttentionShape shape = b.shape_;
  if (config.gemma.enabled)
    shape.sliding_window = config.gemma.sliding(layer) ? config.gemma.sliding_window : 0;
  cpu::paged_attention(batch, items, qkv, nqkv, layer, b.kv_, shape, b.compute_, attn, b.threads_);
  lap(b.times_.attention);
}

void CpuBackendImpl::StepOps::swiglu() {
  if (config.gemma.enabled)
    cpu::geglu_tanh(gu, m, f, b.compute_, act, b.threads_);
  else
    cpu::swiglu(gu, m, f, b.compute_, act, b.threads_);
  lap(b.times_.act);
}

void CpuBackendImpl::StepOps::head() {
  if (!hidden_out.empty()) std::memcpy(hidden_out.data(), x, m * h * 4);
  // Final norm and lm_head only for the last token of each chunk that wants logits (every row
  // of an all_logits chunk, and of every chunk when `all_rows`); logit row i is the i-th such
  // row, and runs of them share a head.
  std::vector<int64_t> rows;
  std::vector<RowRun> logit_runs;
  for (const SeqChunk& c : batch.chunks) {
    const bool every = all_rows || c.all_logits;
    if (!every && !c.wants_logits) continue;
    const int64_t end = c.token_offset + c.num_tokens;
    for (int64_t row = every ? c.token_offset : end - 1; row < end; ++row) {
      const auto i = static_cast<int64_t>(rows.size());
      rows.push_back(row);
      if (!logit_runs.empty() && chain(logit_runs.back()).head == b.blocks_.chains[c.model].head)
        logit_runs.back().end = i + 1;
      else
        logit_runs.push_back({i, i + 1, c.model});
    }
  }
  const int64_t r = logits.empty() ? 0 : static_cast<int64_t>(rows.size());
  if (r > 0) {
    float* lx = b.logit_rows_.get<float>(r * h * 4);
    for (int64_t i = 0; i < r; ++i) std::memcpy(lx + i * h, x + rows[i] * h, h * 4);
    void* ln = xn;  // r <= m rows (plus a group of padding), so the layers' norm buffer has room
    b.zero_rows(ln, r, b.gemm_.padded_rows(r), h);
    const int64_t vocab = config.vocab_size;
    for (const RowRun& run : logit_runs) {
      const Head& head = *chain(run).head;
      const int64_t n = run.end - run.begin;
      cpu::rmsnorm(lx + run.begin * h, h, n, h, head.norm->data(), eps, b.compute_,
                   rows_of(ln, run.begin, h), b.threads_);
    }
    for (const RowRun& run : logit_runs) {
      // Whole row groups straight into `logits`; the remainder through a small padded buffer
      // (a call writes whole groups, which must not run past `logits` or into the next run's).
      Linear& lm_head = *chain(run).head->lm_head;
      const int64_t n = run.end - run.begin, full = n / group * group;
      if (full > 0)
        lm_head.forward(rows_of(ln, run.begin, h), full, logits.data() + run.begin * vocab);
      if (full < n) {
        float* tail = b.logit_tail_.get<float>(group * vocab * 4);
        lm_head.forward(rows_of(ln, run.begin + full, h), n - full, tail);
        std::memcpy(logits.data() + (run.begin + full) * vocab, tail, (n - full) * vocab * 4);
      }
    }
    if (const double cap = config.gemma.final_logit_softcapping; cap > 0)
      cpu::softcap_rows(logits.data(), r, vocab, static_cast<float>(cap), b.threads_);
  }
  lap(b.times_.lm_head);
}

void CpuBackendImpl::run_layers(const ForwardBatch& batch, int64_t first, int64_t last,
                                std::span<const float> hidden_in, std::span<float> hidden_out,
                                std::span<float> logits, bool all_rows) {
  const int64_t m = batch.num_tokens();
  if (m == 0) return;
  if (core_share_) threads_ = core_share_->threads();
  omp_set_num_threads(threads_);  // oneDNN and OpenBLAS follow the calling thread's setting
  StepOps ops(*this, batch, hidden_in, hidden_out, logits, all_rows);
  llama::forward(ops, first, last);
  times_.steps += 1;
  times_.tokens += m;
  times_.thread_steps += threads_;
}

}  // namespace

DType cpu_compute_dtype(DType checkpoint) {
  // bf16 and f16 checkpoints compute in bf16 where oneDNN has a bf16 kernel, else in f32
  // (AVX2-only CPUs): twice the weight and KV memory, the same model.
  return checkpoint == DType::kF32 || !cpu::onednn_has_bf16_matmul() ? DType::kF32 : DType::kBF16;
}

std::unique_ptr<CpuBackend> make_cpu_backend(const ModelConfig& config,
                                             std::span<const TensorStore* const> weights,
                                             const BackendOptions& options, CpuGemmLib f32_gemm,
                                             std::span<const LoraAdapter* const> adapters) {
  return std::make_unique<CpuBackendImpl>(config, weights, options, f32_gemm, adapters);
}

std::unique_ptr<CpuBackend> make_cpu_backend(const ModelConfig& config, const TensorStore& weights,
                                             const BackendOptions& options, CpuGemmLib f32_gemm) {
  const TensorStore* one[] = {&weights};
  return make_cpu_backend(config, one, options, f32_gemm);
}

CpuBackend& cpu_backend_for(Backend& backend, const std::string& needs) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  if (!cpu) throw Error(needs + " needs the cpu backend (this is " + backend.name() + ")");
  return *cpu;
}

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& config, const TensorStore& weights,
                                          const BackendOptions& options) {
  return make_cpu_backend(config, weights, options, CpuGemmLib::kOneDnn);
}

}  // namespace blend
