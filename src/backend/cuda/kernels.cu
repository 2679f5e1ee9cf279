#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/kernels.h"
#include "core/error.h"

// The elementwise kernels and argmax; attention is in attention.cu.
namespace blend::cuda {
namespace {

template <typename E>
__global__ void embed_kernel(const int32_t* tokens, const E* table, int64_t hidden, float* x) {
  const int64_t t = blockIdx.x;
  const int64_t row = tokens[t];
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    x[t * hidden + i] = load_f(table, row * hidden + i);
}

template <typename T>
__global__ void rmsnorm_kernel(const float* x, const int32_t* rows_index, int64_t dim,
                               const float* weight, float eps, T* out) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t row = rows_index ? rows_index[r] : r;
  const float* xr = x + row * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    store_f(out, r * dim + i, weight[i] * (xr[i] * inv));
}

__global__ void add_bias_kernel(float* y, int64_t rows, int64_t cols, const float* bias) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < rows * cols) y[i] += bias[i % cols];
}

template <typename T>
__global__ void rope_kv_kernel(BatchView b, float* qkv, int64_t nqkv, int32_t num_heads,
                               const double* inv_freq, KvView kv, int32_t layer) {
  extern __shared__ float cos_sin[];  // [half] cos, then [half] sin
  const int32_t t = blockIdx.x;
  const int32_t d = kv.head_dim, half = d / 2, hkv = kv.num_kv_heads;
  const int32_t pos = b.positions[t];
  for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = static_cast<double>(pos) * inv_freq[i];
    cos_sin[i] = static_cast<float>(cos(angle));
    cos_sin[half + i] = static_cast<float>(sin(angle));
  }
  __syncthreads();
  float* row = qkv + t * nqkv;
  // q heads, then k heads: consecutive in the row.
  for (int32_t idx = threadIdx.x; idx < (num_heads + hkv) * half; idx += blockDim.x) {
    const int32_t h = idx / half, i = idx - h * half;
    float* v = row + int64_t{h} * d;
    const float x1 = v[i], x2 = v[i + half], c = cos_sin[i], s = cos_sin[half + i];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
  __syncthreads();
  const int32_t base = b.chunk_table[b.token_chunk[t]];
  const float* k = row + int64_t{num_heads} * d;
  const float* v = k + int64_t{hkv} * d;
  T* cache = static_cast<T*>(kv.base);
  for (int32_t idx = threadIdx.x; idx < hkv * d; idx += blockDim.x) {
    const int32_t h = idx / d, i = idx - h * d;
    store_f(cache, kv_offset(b, kv, base, pos, layer, 0, h) + i, k[idx]);
    store_f(cache, kv_offset(b, kv, base, pos, layer, 1, h) + i, v[idx]);
  }
}

__global__ void swiglu_kernel(const float* gate_up, int64_t rows, int64_t f, void* out,
                              bool bf16_out) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= rows * f) return;
  const int64_t r = idx / f, i = idx - r * f;
  const float g = gate_up[r * 2 * f + i], u = gate_up[r * 2 * f + f + i];
  const float y = g / (1.0f + expf(-g)) * u;
  if (bf16_out)
    store_f(static_cast<bf16*>(out), idx, y);
  else
    store_f(static_cast<float*>(out), idx, y);
}

__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* tokens, int32_t* flags) {
  __shared__ float best_s[32];
  __shared__ int32_t id_s[32];
  __shared__ int32_t bad_s;
  const float* row = logits + blockIdx.x * vocab;
  if (threadIdx.x == 0) bad_s = 0;
  __syncthreads();
  float best = -INFINITY;
  int32_t id = INT32_MAX;
  bool bad = false;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    bad |= !(v <= 3.402823466e38f);  // NaN or +inf
    if (v > best || (v == best && i < id)) {
      best = v;
      id = static_cast<int32_t>(i);
    }
  }
  if (bad) bad_s = 1;
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ob > best || (ob == best && oi < id)) {
      best = ob;
      id = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    best_s[warp] = best;
    id_s[warp] = id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
      if (best_s[w] > best || (best_s[w] == best && id_s[w] < id)) {
        best = best_s[w];
        id = id_s[w];
      }
    // A row of -inf only (every token masked) has no maximum: flagged for the host too.
    tokens[blockIdx.x] = id == INT32_MAX ? 0 : id;
    flags[blockIdx.x] = bad_s || id == INT32_MAX || !(best > -INFINITY) ? 1 : 0;
  }
}

}  // namespace

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* tokens, int32_t* flags,
                 cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(logits, vocab, tokens, flags);
  check_launch("argmax_rows");
}

void set_kv_layout(KvView& kv, KvLayout layout, int64_t num_pages) {
  if (layout == KvLayout::kPageMajor) {
    kv.page_stride = kv.page_elems();
    kv.layer_stride = kv.layer_elems();
  } else {
    kv.page_stride = kv.layer_elems();
    kv.layer_stride = num_pages * kv.layer_elems();
  }
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("cuda backend: ") + what + ": " + cudaGetErrorString(e));
}

void embed(const BatchView& batch, const void* table, Elem table_elem, int64_t hidden, float* x,
           cudaStream_t stream) {
  if (batch.num_tokens == 0) return;
  if (table_elem == Elem::kBF16)
    embed_kernel<<<batch.num_tokens, 256, 0, stream>>>(batch.tokens,
                                                       static_cast<const bf16*>(table), hidden, x);
  else
    embed_kernel<<<batch.num_tokens, 256, 0, stream>>>(batch.tokens,
                                                       static_cast<const float*>(table), hidden, x);
  check_launch("embed");
}

void rmsnorm(const float* x, const int32_t* rows_index, int64_t rows, int64_t dim,
             const float* weight, float eps, void* out, Elem out_elem, cudaStream_t stream) {
  if (rows == 0) return;
  const auto grid = static_cast<unsigned>(rows);
  if (out_elem == Elem::kBF16)
    rmsnorm_kernel<<<grid, 512, 0, stream>>>(x, rows_index, dim, weight, eps,
                                             static_cast<bf16*>(out));
  else
    rmsnorm_kernel<<<grid, 512, 0, stream>>>(x, rows_index, dim, weight, eps,
                                             static_cast<float*>(out));
  check_launch("rmsnorm");
}

void add_bias(float* y, int64_t rows, int64_t cols, const float* bias, cudaStream_t stream) {
  if (rows * cols == 0) return;
  add_bias_kernel<<<blocks_for(rows * cols, 256), 256, 0, stream>>>(y, rows, cols, bias);
  check_launch("add_bias");
}

void rope_write_kv(const BatchView& batch, float* qkv, int64_t nqkv, int32_t num_heads,
                   const double* inv_freq, const KvView& kv, int32_t layer, cudaStream_t stream) {
  if (batch.num_tokens == 0) return;
  const size_t smem = sizeof(float) * kv.head_dim;
  if (kv.elem == Elem::kBF16)
    rope_kv_kernel<bf16>
        <<<batch.num_tokens, 128, smem, stream>>>(batch, qkv, nqkv, num_heads, inv_freq, kv, layer);
  else
    rope_kv_kernel<float>
        <<<batch.num_tokens, 128, smem, stream>>>(batch, qkv, nqkv, num_heads, inv_freq, kv, layer);
  check_launch("rope_write_kv");
}

void swiglu(const float* gate_up, int64_t rows, int64_t f, void* out, Elem out_elem,
            cudaStream_t stream) {
  if (rows * f == 0) return;
  swiglu_kernel<<<blocks_for(rows * f, 256), 256, 0, stream>>>(gate_up, rows, f, out,
                                                               out_elem == Elem::kBF16);
  check_launch("swiglu");
}

}  // namespace blend::cuda
