#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/kernels.h"
#include "core/error.h"

// The elementwise kernels; attention is in attention.cu, sampling in draw.cu.
namespace blend::cuda {
namespace {

// dst[0..4) = v, 16-byte (f32) or 8-byte (bf16) aligned.
__device__ __forceinline__ void store4(float* dst, float4 v) {
  *reinterpret_cast<float4*>(dst) = v;
}
__device__ __forceinline__ void store4(bf16* dst, float4 v) {
  const __nv_bfloat162 p[2] = {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(p);
}
// dst[0..8) = src[0..8), 16-byte aligned both.
template <typename T>
__device__ __forceinline__ void store8(T* dst, const float* src) {
  store4(dst, reinterpret_cast<const float4*>(src)[0]);
  store4(dst + 4, reinterpret_cast<const float4*>(src)[1]);
}

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

// The same for rows of dim = 4 * kThreads * kVecs' at most, dim % 4 == 0: the row is read once
// into registers as float4s (the kernel above reads it twice, one float at a time).
constexpr int kNormThreads = 256;
template <typename T, int kVecs>
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_vec_kernel(const float* x, const int32_t* rows_index, int64_t dim, const float* weight,
                       float eps, T* out) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int64_t row = rows_index ? rows_index[r] : r;
  const auto* xr = reinterpret_cast<const float4*>(x + row * dim);
  const int32_t vecs = static_cast<int32_t>(dim / 4);
  float4 v[kVecs];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int32_t i = threadIdx.x + j * kNormThreads;
    v[j] = i < vecs ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  const auto* w = reinterpret_cast<const float4*>(weight);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int32_t i = threadIdx.x + j * kNormThreads;
    if (i >= vecs) break;
    const float4 wi = w[i];
    store4(out + r * dim + 4 * int64_t{i},
           make_float4(wi.x * (v[j].x * inv), wi.y * (v[j].y * inv), wi.z * (v[j].z * inv),
                       wi.w * (v[j].w * inv)));
  }
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
  if (d % 8 == 0) {
    // Eight elements a thread: one 16-byte store of bf16 (two of f32) per K and V run.
    const int64_t k_slot = kv_offset(b, kv, base, pos, layer, 0, 0);
    const int64_t v_delta = int64_t{hkv} * kv.page_size * d;  // V's offset from K's
    const int64_t head_stride = int64_t{kv.page_size} * d;    // between KV heads of a slot
    for (int32_t idx = threadIdx.x * 8; idx < hkv * d; idx += blockDim.x * 8) {
      const int32_t h = idx / d, i = idx - h * d;
      const int64_t off = k_slot + h * head_stride + i;
      store8(cache + off, k + idx);
      store8(cache + off + v_delta, v + idx);
    }
    return;
  }
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

// The same, four columns a thread and one row per grid row (f % 4 == 0): vector loads of the
// gate and the up half (f32, or bf16 where the gate/up GEMM wrote bf16), no 64-bit division
// per element.
__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load4(const bf16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  return make_float4(a.x, a.y, b.x, b.y);
}
template <typename In, typename Out>
__global__ void swiglu_vec_kernel(const In* gate_up, int64_t rows, int64_t f, Out* out) {
  const int64_t i = 4 * (blockIdx.x * int64_t{blockDim.x} + threadIdx.x);
  if (i >= f) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {  // grid rows cap at 65,535
    const float4 g = load4(gate_up + r * 2 * f + i);
    const float4 u = load4(gate_up + r * 2 * f + f + i);
    store4(out + r * f + i,
           make_float4(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y,
                       g.z / (1.0f + expf(-g.z)) * u.z, g.w / (1.0f + expf(-g.w)) * u.w));
  }
}

}  // namespace

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
  const int64_t vecs = dim / 4;
  if (dim % 4 == 0 && vecs <= 8 * kNormThreads) {
    const int per = static_cast<int>((vecs + kNormThreads - 1) / kNormThreads);
    auto launch = [&](auto vecs_tag) {
      constexpr int kVecs = decltype(vecs_tag)::value;
      if (out_elem == Elem::kBF16)
        rmsnorm_vec_kernel<bf16, kVecs><<<grid, kNormThreads, 0, stream>>>(
            x, rows_index, dim, weight, eps, static_cast<bf16*>(out));
      else
        rmsnorm_vec_kernel<float, kVecs><<<grid, kNormThreads, 0, stream>>>(
            x, rows_index, dim, weight, eps, static_cast<float*>(out));
    };
    if (per <= 1)
      launch(std::integral_constant<int, 1>{});
    else if (per <= 2)
      launch(std::integral_constant<int, 2>{});
    else if (per <= 4)
      launch(std::integral_constant<int, 4>{});
    else
      launch(std::integral_constant<int, 8>{});
    check_launch("rmsnorm");
    return;
  }
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

void swiglu(const void* gate_up, Elem in_elem, int64_t rows, int64_t f, void* out, Elem out_elem,
            cudaStream_t stream) {
  if (rows * f == 0) return;
  const bool bf16_out = out_elem == Elem::kBF16;
  if (f % 4 == 0) {
    const dim3 grid(blocks_for(f / 4, 256), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
    auto launch = [&](const auto* in) {
      if (bf16_out)
        swiglu_vec_kernel<<<grid, 256, 0, stream>>>(in, rows, f, static_cast<bf16*>(out));
      else
        swiglu_vec_kernel<<<grid, 256, 0, stream>>>(in, rows, f, static_cast<float*>(out));
    };
    if (in_elem == Elem::kBF16)
      launch(static_cast<const bf16*>(gate_up));
    else
      launch(static_cast<const float*>(gate_up));
    check_launch("swiglu");
    return;
  }
  if (in_elem != Elem::kF32) throw Error("internal: cuda swiglu: bf16 input needs f % 4 == 0");
  swiglu_kernel<<<blocks_for(rows * f, 256), 256, 0, stream>>>(static_cast<const float*>(gate_up),
                                                               rows, f, out, bf16_out);
  check_launch("swiglu");
}

}  // namespace blend::cuda
