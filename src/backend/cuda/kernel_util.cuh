// What the cuda backend's kernel files share (kernels.cu, attention.cu): element loads and
// stores in f32 or bf16, warp and block reductions, grid sizing, and the KV cache's addressing.
// Private to backend/cuda: internal linkage, one copy per kernel file.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace blend::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float load_f(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float load_f(const bf16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store_f(float* p, int64_t i, float v) {
  p[i] = v;
}
// Round to nearest even, as the cpu backend's f32_to_bf16.
__device__ __forceinline__ void store_f(bf16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the total.
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const float total = scratch[0];
  __syncthreads();
  return total;
}

// A grid that covers n elements with `threads` per block, one element per thread.
unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// The element offset of K (v = 0) or V (v = 1) of `kv_head` at position `pos` of `layer`, for a
// sequence whose pages start at tables[table_base] (KvView's strides give the layout).
__device__ __forceinline__ int64_t kv_offset(const BatchView& b, const KvView& kv,
                                             int32_t table_base, int32_t pos, int32_t layer,
                                             int32_t v, int32_t kv_head) {
  const int32_t ps = kv.page_size;
  const int32_t j = pos / ps;
  int32_t slot = pos - j * ps;
  if (b.reversed[table_base + j]) slot = ps - 1 - slot;
  const int64_t page = b.tables[table_base + j];
  return page * kv.page_stride + layer * kv.layer_stride +
         ((int64_t{v} * kv.num_kv_heads + kv_head) * ps + slot) * kv.head_dim;
}

}  // namespace

// The warp-parallel decode kernel (decode_warps.cu) for the bf16 single tokens: launches it
// (with `splits` partials into `partial` when splits > 1, which the caller combines) and returns
// true, or returns false where it does not run the shape (decode_warps_supports).
bool decode_warps_supports(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim);
bool launch_decode_warps(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
                         int32_t layer, int32_t num_heads, int32_t window, __nv_bfloat16* out,
                         int32_t tokens, int32_t splits, float* partial, int32_t unroll,
                         bool heads_fastest, cudaStream_t stream);

// The register-resident tensor-core prefill kernel (prefill_mma.cu) for the batch's prefill
// tiles: launches it and returns true, or returns false where it does not run the shape
// (head_dim a multiple of 16 up to 128, query heads per KV head dividing 64).
bool launch_prefill_mma(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
                        int32_t layer, int32_t num_heads, int32_t window, __nv_bfloat16* out,
                        cudaStream_t stream);

}  // namespace blend::cuda
