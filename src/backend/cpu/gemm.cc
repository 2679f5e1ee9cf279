#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

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
  }
  return 0.0f;
}

// Writes `count` elements of `t` starting at `first` as compute-dtype elements into `out`.
void convert(const TensorView& t, int64_t first, int64_t count, DType to, std::byte* out) {
  if (t.dtype == to) {
    std::memcpy(out, t.data + first * dtype_size(to), count * dtype_size(to));
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    const float v = element(t, first + i);
    if (to == DType::kF32) {
      std::memcpy(out + i * 4, &v, 4);
    } else {
      const uint16_t h = f32_to_bf16(v);  // f16 and f32 checkpoints on the bf16 path
      std::memcpy(out + i * 2, &h, 2);
    }
  }
}

}  // namespace

GemmContext::GemmContext(const GemmOptions& options)
    : options_(options), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
  if (options_.compute != DType::kF32 && options_.compute != DType::kBF16)
    throw Error("cpu gemm: compute dtype must be F32 or BF16");
  if (options_.lib == GemmLib::kOpenBlas && options_.compute != DType::kF32)
    throw Error("cpu gemm: OpenBLAS has no bf16 GEMM here; use oneDNN for bf16 weights");
}

int64_t GemmContext::padded_rows(int64_t m) const {
  const int64_t q = options_.row_tile > 0 ? options_.row_tile : kRowBucket;
  return (m + q - 1) / q * q;
}

dnnl::matmul& GemmContext::primitive(int64_t m, int64_t k, int64_t n, bool bias, bool accumulate,
                                     const memory::desc& weights) {
  const Key key{m, k, n, bias, accumulate};
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  const auto dt = dnnl_type(options_.compute);
  const memory::desc src({m, k}, dt, Tag::ab);
  const memory::desc dst({m, n}, memory::data_type::f32, Tag::ab);
  dnnl::primitive_attr attr;
  if (accumulate) {
    // dst += x W^T: the residual add happens inside the kernel's output stage.
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const auto desc =
      bias ? dnnl::matmul::desc(src, weights, memory::desc({1, n}, memory::data_type::f32, Tag::ab),
                                dst)
           : dnnl::matmul::desc(src, weights, dst);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
  return cache_.emplace(key, dnnl::matmul(pd)).first->second;
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
  if (!bias_parts.empty()) {
    bias_.reserve(n_);
    for (size_t i = 0; i < bias_parts.size(); ++i) {
      const TensorView& b = *bias_parts[i];
      if (b.numel() != parts[i]->shape[0])
        throw Error("cpu gemm: bias '" + b.name + "' does not match its weight");
      for (int64_t j = 0; j < b.numel(); ++j) bias_.push_back(element(b, j));
    }
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
  // oneDNN computes src[m][k] x wei[k][n]; our [n][k] matrix is wei in "ba" order. Ask the
  // kernel for its preferred blocked layout and reorder into it once.
  const auto ddt = dnnl_type(dt);
  const memory::desc any({k_, n_}, ddt, Tag::any);
  const dnnl::matmul::primitive_desc probe(
      dnnl::matmul::desc(memory::desc({kPackRows, k_}, ddt, Tag::ab), any,
                         memory::desc({kPackRows, n_}, memory::data_type::f32, Tag::ab)),
      ctx_.engine_);
  packed_desc_ = probe.weights_desc();
  memory src(memory::desc({k_, n_}, ddt, Tag::ba), ctx_.engine_, plain.get());
  packed_data_ = allocate_buffer(packed_desc_.get_size());
  packed_ = memory(packed_desc_, ctx_.engine_, packed_data_.get());
  dnnl::reorder(src, packed_).execute(ctx_.stream_, src, packed_);
  ctx_.stream_.wait();
  if (!bias_.empty())
    bias_mem_ =
        memory(memory::desc({1, n_}, memory::data_type::f32, Tag::ab), ctx_.engine_, bias_.data());
}

std::string Linear::impl() const {
  if (ctx_.options().lib == GemmLib::kOpenBlas) return "openblas";
  auto& p = ctx_.primitive(ctx_.padded_rows(1), k_, n_, !bias_.empty(), false, packed_desc_);
  const char* info = nullptr;
  dnnl_primitive_desc_query(p.get_primitive_desc(), dnnl_query_impl_info_str, 0, &info);
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
  auto& prim = ctx_.primitive(rows, k_, n_, !bias_.empty(), accumulate, packed_desc_);
  const auto dt = dnnl_type(ctx_.options().compute);
  memory src(memory::desc({rows, k_}, dt, Tag::ab), ctx_.engine_, const_cast<void*>(x));
  memory dst(memory::desc({rows, n_}, memory::data_type::f32, Tag::ab), ctx_.engine_, y);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, packed_}, {DNNL_ARG_DST, dst}};
  if (!bias_.empty()) args.emplace(DNNL_ARG_BIAS, bias_mem_);
  prim.execute(ctx_.stream_, args);
  ctx_.stream_.wait();
}

void Linear::forward(const void* x, int64_t m, float* y, bool accumulate) {
  if (m <= 0) return;
  if (ctx_.options().lib == GemmLib::kOpenBlas) openblas_set_num_threads(1);
  const int64_t tile = ctx_.options().row_tile;
  if (tile <= 0) {
    // OpenBLAS takes any m; oneDNN kernels are instantiated per bucketed row count.
    run(ctx_.options().lib == GemmLib::kOpenBlas ? m : ctx_.padded_rows(m), x, y, accumulate);
    return;
  }
  const auto* xb = static_cast<const std::byte*>(x);
  const size_t x_row = static_cast<size_t>(k_) * ctx_.elem_size();
  for (int64_t r = 0; r < m; r += tile) run(tile, xb + r * x_row, y + r * n_, accumulate);
}

}  // namespace blend::cpu
