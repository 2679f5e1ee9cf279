#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/safetensors.h"

namespace blend::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

memory::data_type dnnl_type(DType t) {
  return t == DType::kF32 ? memory::data_type::f32 : memory::data_type::bf16;
}

// Default-mode kernels run on m rounded up to this, so at most max_rows / 16 kernel instances
// exist per shape however the batch sizes vary.
constexpr int64_t kRowBucket = 16;
// Row count used to ask oneDNN for its preferred weight layout at load time.
constexpr int64_t kPackRows = 256;
// Deterministic mode: a column slice (the output columns one thread computes alone) holds about
// this many weights: 512 columns of smollm-135m's K = 576 (590 KB of packed bf16 weights, about a
// core's L2). Each slice is one oneDNN call, ~5 us of fixed cost against ~80 us of bf16 work on a
// 16-row tile here; the 256-column slices before cost a K = 64 lm_head (the tiny preset's 128K
// vocabulary: 500 slices) 2.7x the default mode's time.
constexpr int64_t kSliceWeights = 512 * 576;

// Width of the column slices of an [n][k] weight run by `threads` threads: about kSliceWeights
// weights each, and a multiple of `threads` slices so that a one-tile call keeps every thread
// equally busy. Fixed at load: a row's bits depend on the slices' kernels, never on the batch.
int64_t slice_width(int64_t n, int64_t k, int threads) {
  const int64_t target = std::max<int64_t>(64, kSliceWeights / std::max<int64_t>(k, 1));
  int64_t slices = (n + target - 1) / target;
  slices = (slices + threads - 1) / threads * threads;
  const int64_t width = ((n + slices - 1) / slices + 15) / 16 * 16;
  return std::min(width, n);
}

float element(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, t.data + i * 4, 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, t.data + i * 2, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, t.data + i * 2, 2);
      return f16_to_f32(h);
    }
    case DType::kQ8_0:  // biases only: block-type matrices are converted a row at a time
    case DType::kQ5_0:
    case DType::kQ4_K:
    case DType::kQ6_K:
      return t.at(i);
  }
  return 0.0f;
}

// Writes `count` elements of `t` starting at `first` as compute-dtype elements into `out`.
void convert(const TensorView& t, int64_t first, int64_t count, DType to, std::byte* out) {
  if (t.dtype == to) {
    std::memcpy(out, t.data + first * dtype_size(to), count * dtype_size(to));
    return;
  }
  std::vector<float> row;  // a block-type row dequantized whole (first, count: one row)
  if (is_block_type(t.dtype)) {
    const int64_t cols = t.shape.back();
    row.resize(static_cast<size_t>(count));
    dequantize_block_row(t.dtype, t.data + first / cols * row_bytes(t.dtype, cols), count,
                         row.data());
  }
  for (int64_t i = 0; i < count; ++i) {
    const float v = row.empty() ? element(t, first + i) : row[static_cast<size_t>(i)];
    if (to == DType::kF32) {
      std::memcpy(out + i * 4, &v, 4);
    } else {
      const uint16_t h = f32_to_bf16(v);  // f16 and f32 checkpoints on the bf16 path
      std::memcpy(out + i * 2, &h, 2);
    }
  }
}

}  // namespace

bool onednn_has_bf16_matmul() {
  static const bool has = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      const auto bf16 = memory::data_type::bf16;
      const dnnl::matmul::primitive_desc probe(
          dnnl::matmul::desc(memory::desc({16, 64}, bf16, Tag::ab),
                             memory::desc({64, 64}, bf16, Tag::any),
                             memory::desc({16, 64}, memory::data_type::f32, Tag::ab)),
          engine);
      return true;
    } catch (const dnnl::error&) {
      return false;  // "could not create a primitive descriptor": no bf16 kernel on this ISA
    }
  }();
  return has;
}

namespace {

// Whether a row's output from a deterministic-mode call on `tile` rows (the real path: packed
// weights, column slices, one thread a slice) is bitwise the same at every position of the
// tile, the other rows random, for two shapes (one with odd tails and two slices).
bool row_invariant(DType compute, int64_t tile) {
  GemmContext ctx({.compute = compute, .lib = GemmLib::kOneDnn, .row_tile = tile});
  uint32_t state = 12345;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
  };
  const size_t es = dtype_size(compute);
  // `count` random values as compute-dtype elements.
  auto random_row = [&](int64_t count, std::byte* out) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& f : v) f = next();
    store_row(v.data(), count, compute, out);
  };
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{64, 64}, {200, 300}}) {
    std::vector<float> w(static_cast<size_t>(k * n));
    for (float& v : w) v = next();
    const TensorView weight{.name = "row-invariance probe",
                            .dtype = DType::kF32,
                            .shape = {n, k},
                            .data = reinterpret_cast<const std::byte*>(w.data()),
                            .nbytes = w.size() * 4};
    Linear linear(ctx, {&weight});
    std::vector<std::byte> x(static_cast<size_t>(tile * k) * es), row(static_cast<size_t>(k) * es);
    random_row(k, row.data());
    std::vector<float> y(static_cast<size_t>(tile * n)), first(static_cast<size_t>(n));
    for (int64_t pos = 0; pos < tile; ++pos) {
      random_row(tile * k, x.data());
      std::memcpy(&x[static_cast<size_t>(pos * k) * es], row.data(), row.size());
      linear.forward(x.data(), tile, y.data());
      const float* out = &y[static_cast<size_t>(pos * n)];
      if (pos == 0) {
        std::memcpy(first.data(), out, first.size() * 4);
      } else if (std::memcmp(first.data(), out, first.size() * 4) != 0) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int64_t deterministic_row_tile(DType compute, int64_t preferred) {
  static std::map<std::pair<DType, int64_t>, int64_t> chosen;
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  auto it = chosen.find({compute, preferred});
  if (it != chosen.end()) return it->second;
  int64_t tile = 0;
  for (int64_t candidate : {preferred, int64_t{24}, int64_t{48}, int64_t{64}})
    if (row_invariant(compute, candidate)) {
      tile = candidate;
      break;
    }
  if (tile == 0)
    throw Error(
        "cpu gemm: no row tile gives batch-invariant rows on this CPU; run without "
        "--deterministic");
  return chosen[{compute, preferred}] = tile;
}

GemmContext::GemmContext(const GemmOptions& options)
    : options_(options), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
  if (options_.compute != DType::kF32 && options_.compute != DType::kBF16)
    throw Error("cpu gemm: compute dtype must be F32 or BF16");
  if (options_.lib == GemmLib::kOpenBlas && options_.compute != DType::kF32)
    throw Error("cpu gemm: OpenBLAS has no bf16 GEMM here; use oneDNN for bf16 weights");
  if (options_.lib == GemmLib::kOneDnn && options_.compute == DType::kBF16 &&
      !onednn_has_bf16_matmul())
    throw Error("cpu gemm: oneDNN has no bf16 matmul on this CPU (no AVX-512); compute in f32");
}

int64_t GemmContext::padded_rows(int64_t m) const {
  const int64_t q = options_.row_tile > 0 ? options_.row_tile : kRowBucket;
  return (m + q - 1) / q * q;
}

GemmContext::Kernel& GemmContext::kernel(int64_t m, int64_t k, int64_t n, int64_t ldy, bool bias,
                                         bool accumulate, const memory::desc& weights) {
  const Key key{m, k, n, ldy, bias, accumulate, omp_in_parallel() ? 1 : omp_get_max_threads()};
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  const auto dt = dnnl_type(options_.compute);
  const memory::desc src({m, k}, dt, Tag::ab);
  const memory::desc dst({m, n}, memory::data_type::f32, memory::dims{ldy, 1});
  dnnl::primitive_attr attr;
  if (accumulate) {
    // dst += x W^T: the residual add happens inside the kernel's output stage.
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  // Deterministic mode runs kernels from several threads at once, each with its own scratch.
  if (options_.row_tile > 0) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto desc =
      bias ? dnnl::matmul::desc(src, weights, memory::desc({1, n}, memory::data_type::f32, Tag::ab),
                                dst)
           : dnnl::matmul::desc(src, weights, dst);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
  return cache_.emplace(key, Kernel{dnnl::matmul(pd), pd.scratchpad_desc()}).first->second;
}

void GemmContext::prepare_threads(int threads, size_t scratch_bytes, size_t out_bytes) {
  if (threads_.size() < static_cast<size_t>(threads)) threads_.resize(static_cast<size_t>(threads));
  for (ThreadState& t : threads_) {
    if (!t.stream) t.stream = dnnl::stream(engine_);
    if (t.scratch_bytes < scratch_bytes) {
      t.scratch = allocate_buffer(scratch_bytes);
      t.scratch_bytes = scratch_bytes;
    }
    if (t.out_bytes < out_bytes) {
      t.out = allocate_buffer(out_bytes);
      t.out_bytes = out_bytes;
    }
  }
}

Linear::Linear(GemmContext& ctx, const std::vector<const TensorView*>& parts,
               const std::vector<const TensorView*>& bias_parts)
    : ctx_(ctx) {
  if (parts.empty()) throw Error("cpu gemm: a linear layer needs a weight");
  if (!bias_parts.empty() && bias_parts.size() != parts.size())
    throw Error("cpu gemm: one bias per weight part expected");
  k_ = parts[0]->shape.at(1);
  for (const TensorView* p : parts) {
    if (p->shape.size() != 2 || p->shape[1] != k_)
      throw Error("cpu gemm: weight '" + p->name + "' has shape " + shape_string(p->shape) +
                  ", expected [*, " + std::to_string(k_) + "]");
    n_ += p->shape[0];
  }
  const bool q8 = std::all_of(parts.begin(), parts.end(),
                              [](const TensorView* p) { return p->dtype == DType::kQ8_0; });
  if (!bias_parts.empty()) {
    bias_.reserve(n_);
    for (size_t i = 0; i < bias_parts.size(); ++i) {
      const TensorView& b = *bias_parts[i];
      if (b.numel() != parts[i]->shape[0])
        throw Error("cpu gemm: bias '" + b.name + "' does not match its weight");
      for (int64_t j = 0; j < b.numel(); ++j) bias_.push_back(element(b, j));
    }
  }

  if (q8) {  // kept quantized: the int8 kernels (q8_gemm.h) instead of oneDNN
    q8_ = std::make_unique<Q8Matrix>(parts);
    return;
  }
  if (KQuantMatrix::takes(parts)) {  // a Q4_K_M file's types: kquant_gemm.h
    kquant_ = std::make_unique<KQuantMatrix>(parts);
    return;
  }

  // The stacked [n][k] weight in the compute dtype, rows converted in parallel.
  const DType dt = ctx_.options().compute;
  const size_t esize = dtype_size(dt);
  const size_t plain_bytes = static_cast<size_t>(n_ * k_) * esize;
  const Buffer plain = allocate_buffer(plain_bytes);
  int64_t row0 = 0;
  for (const TensorView* p : parts) {
    const int64_t rows = p->shape[0];
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      convert(*p, r * k_, k_, dt, plain.get() + (row0 + r) * k_ * esize);
    row0 += rows;
  }

  if (ctx_.options().lib == GemmLib::kOpenBlas) {
    plain_.resize(n_ * k_);
    std::memcpy(plain_.data(), plain.get(), plain_bytes);
    return;
  }
  const int64_t width =
      ctx_.options().row_tile > 0 ? slice_width(n_, k_, std::max(1, omp_get_max_threads())) : n_;
  max_slice_ = width;
  for (int64_t first = 0; first < n_; first += width) {
    Slice& slice = slices_.emplace_back();
    slice.first = first;
    slice.count = std::min(width, n_ - first);
    pack(plain.get(), slice);
  }
}

void Linear::pack(const std::byte* plain, Slice& slice) {
  // oneDNN computes src[m][k] x wei[k][n]; our [n][k] rows are wei in "ba" order. Ask the
  // kernel for its preferred blocked layout and reorder into it once.
  const auto ddt = dnnl_type(ctx_.options().compute);
  const int64_t n = slice.count;
  const memory::desc any({k_, n}, ddt, Tag::any);
  const dnnl::matmul::primitive_desc probe(
      dnnl::matmul::desc(memory::desc({kPackRows, k_}, ddt, Tag::ab), any,
                         memory::desc({kPackRows, n}, memory::data_type::f32, Tag::ab)),
      ctx_.engine_);
  slice.desc = probe.weights_desc();
  const std::byte* rows = plain + slice.first * k_ * static_cast<int64_t>(ctx_.elem_size());
  memory src(memory::desc({k_, n}, ddt, Tag::ba), ctx_.engine_, const_cast<std::byte*>(rows));
  slice.data = allocate_buffer(slice.desc.get_size());
  slice.weights = memory(slice.desc, ctx_.engine_, slice.data.get());
  dnnl::reorder(src, slice.weights).execute(ctx_.stream_, src, slice.weights);
  ctx_.stream_.wait();
  if (!bias_.empty())
    slice.bias = memory(memory::desc({1, n}, memory::data_type::f32, Tag::ab), ctx_.engine_,
                        bias_.data() + slice.first);
}

GemmContext::Kernel& Linear::tile_kernel(const Slice& s) const {
  // A dense [row_tile][count] output: oneDNN 2.6's brgemm matmul takes no strided dst and falls
  // back to its reference kernel (ref:any, 100x slower) when the slice writes into y's rows.
  return ctx_.kernel(ctx_.options().row_tile, k_, s.count, s.count, !bias_.empty(), false, s.desc);
}

std::string Linear::impl() const {
  if (q8_) return "q8_0 " + q8_kernel_name(best_q8_kernel());
  if (kquant_) return "k-quant " + q8_kernel_name(best_q8_kernel());
  if (ctx_.options().lib == GemmLib::kOpenBlas) return "openblas";
  const Slice& s = slices_.front();
  // The kernel a one-row call runs: the row-tile kernel in deterministic mode.
  auto& p = ctx_.options().row_tile > 0
                ? tile_kernel(s)
                : ctx_.kernel(ctx_.padded_rows(1), k_, s.count, n_, !bias_.empty(), false, s.desc);
  const char* info = nullptr;
  dnnl_primitive_desc_query(p.matmul.get_primitive_desc(), dnnl_query_impl_info_str, 0, &info);
  return info ? info : "?";
}

void Linear::run(int64_t rows, const void* x, float* y, bool accumulate) {
  if (ctx_.options().lib == GemmLib::kOpenBlas) {
    // OpenBLAS's own thread pool would fight the OpenMP threads of the other ops for the
    // cores, so each OpenMP thread runs a single-threaded sgemm on its slice of columns.
    const int threads = omp_get_max_threads();
    const int64_t slice = ((n_ + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel num_threads(threads)
    {
      const int64_t j0 = std::min<int64_t>(n_, omp_get_thread_num() * slice);
      const int64_t nj = std::min<int64_t>(n_ - j0, slice);
      if (nj > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                    static_cast<int>(nj), static_cast<int>(k_), 1.0f, static_cast<const float*>(x),
                    static_cast<int>(k_), plain_.data() + j0 * k_, static_cast<int>(k_),
                    accumulate ? 1.0f : 0.0f, y + j0, static_cast<int>(n_));
        if (!bias_.empty())
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = j0; j < j0 + nj; ++j) y[r * n_ + j] += bias_[j];
      }
    }
    return;
  }
  const Slice& s = slices_.front();
  auto& prim = ctx_.kernel(rows, k_, n_, n_, !bias_.empty(), accumulate, s.desc).matmul;
  const auto dt = dnnl_type(ctx_.options().compute);
  memory src(memory::desc({rows, k_}, dt, Tag::ab), ctx_.engine_, const_cast<void*>(x));
  memory dst(memory::desc({rows, n_}, memory::data_type::f32, Tag::ab), ctx_.engine_, y);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, s.weights}, {DNNL_ARG_DST, dst}};
  if (!bias_.empty()) args.emplace(DNNL_ARG_BIAS, s.bias);
  prim.execute(ctx_.stream_, args);
  ctx_.stream_.wait();
}

void Linear::run_tiles(int64_t tiles, const void* x, float* y, bool accumulate) {
  const int64_t tile = ctx_.options().row_tile;
  const int64_t num_slices = static_cast<int64_t>(slices_.size());
  // Each slice's kernel is looked up once (the primitive cache is not thread-safe, so never
  // inside the loop below), and the scratch sized before it.
  size_t scratch_bytes = 0;
  for (Slice& s : slices_) {
    if (s.tile_kernel == nullptr) s.tile_kernel = &tile_kernel(s);
    scratch_bytes = std::max(scratch_bytes, s.tile_kernel->scratchpad.get_size());
  }
  const int threads = omp_get_max_threads();
  ctx_.prepare_threads(threads, scratch_bytes, static_cast<size_t>(tile * max_slice_) * 4);
  const auto dt = dnnl_type(ctx_.options().compute);
  const size_t x_row = static_cast<size_t>(k_) * ctx_.elem_size();
  const int64_t units = tiles * num_slices;
  // Inside the parallel loop each oneDNN call runs on the calling thread alone. Slice-major
  // order: a thread runs one slice over consecutive tiles, so the slice's packed weights stay in
  // its cache while the row tiles stream past.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t r = u % tiles * tile;
    const Slice& s = slices_[static_cast<size_t>(u / tiles)];
    GemmContext::ThreadState& ts = ctx_.threads_[static_cast<size_t>(omp_get_thread_num())];
    float* out = reinterpret_cast<float*>(ts.out.get());
    memory src(memory::desc({tile, k_}, dt, Tag::ab), ctx_.engine_,
               const_cast<std::byte*>(static_cast<const std::byte*>(x) + r * x_row));
    memory dst(memory::desc({tile, s.count}, memory::data_type::f32, Tag::ab), ctx_.engine_, out);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, s.weights}, {DNNL_ARG_DST, dst}};
    if (scratch_bytes > 0)
      args.emplace(DNNL_ARG_SCRATCHPAD,
                   memory(s.tile_kernel->scratchpad, ctx_.engine_, ts.scratch.get()));
    if (!bias_.empty()) args.emplace(DNNL_ARG_BIAS, s.bias);
    s.tile_kernel->matmul.execute(ts.stream, args);
    ts.stream.wait();
    // Into the slice's columns of y: an f32 add or copy per element, the same for every row.
    for (int64_t i = 0; i < tile; ++i) {
      float* yr = y + (r + i) * n_ + s.first;
      const float* o = out + i * s.count;
      if (accumulate) {
        for (int64_t j = 0; j < s.count; ++j) yr[j] += o[j];
      } else {
        std::memcpy(yr, o, static_cast<size_t>(s.count) * 4);
      }
    }
  }
}

void Linear::forward(const void* x, int64_t m, float* y, bool accumulate) {
  if (m <= 0) return;
  if (q8_) {  // each row alone through one fixed sequence: batch invariant in every mode
    q8_->forward(x, ctx_.options().compute, m, bias_.empty() ? nullptr : bias_.data(), y,
                 accumulate);
    return;
  }
  if (kquant_) {  // the same for a Q4_K_M file's types
    kquant_->forward(x, ctx_.options().compute, m, bias_.empty() ? nullptr : bias_.data(), y,
                     accumulate);
    return;
  }
  if (ctx_.options().lib == GemmLib::kOpenBlas) openblas_set_num_threads(1);
  const int64_t tile = ctx_.options().row_tile;
  if (tile <= 0) {
    // OpenBLAS takes any m; oneDNN kernels are instantiated per bucketed row count.
    run(ctx_.options().lib == GemmLib::kOpenBlas ? m : ctx_.padded_rows(m), x, y, accumulate);
    return;
  }
  if (ctx_.options().lib == GemmLib::kOneDnn) {
    run_tiles((m + tile - 1) / tile, x, y, accumulate);
    return;
  }
  const auto* xb = static_cast<const std::byte*>(x);
  const size_t x_row = static_cast<size_t>(k_) * ctx_.elem_size();
  for (int64_t r = 0; r < m; r += tile) run(tile, xb + r * x_row, y + r * n_, accumulate);
}

}  // namespace blend::cpu
