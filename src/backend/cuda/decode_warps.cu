// Decode attention with independent warps (BLEND_CUDA_ATTENTION=warps / warps8, kernels.h):
// one block of four warps per (token, KV head, split), like the pipelined kernel, but with no
// shared-memory staging and no barrier per tile. Each key is read by kLanes = head_dim / 8
// lanes, 16 bytes each, straight into registers; a warp holds 32 / kLanes keys per load and
// kUnroll such loads of K and of V in flight before it uses them. Each group of kLanes lanes
// keeps its own online softmax (m, l and its 8 dimensions of the accumulator for every query
// head of the group) over the keys it reads; the 4 x 32 / kLanes streams of a block are merged
// once at the end through shared memory (flash-decoding's rescaled sum). The pipelined kernel
// waits at four barriers per 32-key tile and reached ~2 TB/s on both H100 and H200
// (docs/BENCHMARKS.md); this one has nothing to wait on but its own loads.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/kernels.h"

namespace blend::cuda {
namespace {

constexpr int kWarpThreads = 128, kWarps = kWarpThreads / 32;
constexpr int kSplitKeys = 32;  // splits share key tiles of this size (decode_splits' unit)
// Blocks per multiprocessor the registers must allow: 4 (128 registers a thread) where the
// state fits without spilling, fewer for the larger groups and unrolls (measured with ptxas -v).
constexpr int min_blocks(int group, int unroll) {
  return group * unroll <= 16 ? 4 : group * unroll <= 32 ? 3 : 2;
}

template <int kGroup, int kLanes, int kUnroll>
__global__ void __launch_bounds__(kWarpThreads, min_blocks(kGroup, kUnroll))
    decode_warps_kernel(BatchView b, const float* qkv, int64_t nqkv, KvView kv, int32_t layer,
                        int32_t num_heads, int32_t window, bf16* out, int32_t splits,
                        float* partial, int32_t heads_fastest) {
  constexpr int kKeysPerLoad = 32 / kLanes;
  constexpr int kKeysPerStep = kKeysPerLoad * kUnroll;  // keys one warp reads per step
  constexpr int kD = kLanes * 8;
  constexpr int kStreams = kWarps * kKeysPerLoad;
  extern __shared__ __align__(16) unsigned char smem[];
  float* merge = reinterpret_cast<float*>(smem);  // [stream][group][kD + 2]: acc, m, l

  const int32_t row = static_cast<int32_t>(heads_fastest ? blockIdx.y : blockIdx.x);
  const int32_t t = b.single_tokens ? b.single_tokens[row] : row;
  const int32_t kv_head = static_cast<int32_t>(heads_fastest ? blockIdx.x : blockIdx.y);
  const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int32_t sub = lane / kLanes, part = lane % kLanes;
  const int32_t stream = warp * kKeysPerLoad + sub;
  const int32_t pos = b.positions[t];
  const int32_t base = b.chunk_table[b.token_chunk[t]];
  const int32_t lo = window > 0 ? max(0, pos - window + 1) : 0, hi = pos + 1;
  const int32_t tiles = (hi - lo + kSplitKeys - 1) / kSplitKeys,
                per = (tiles + splits - 1) / splits;
  const int32_t s_lo = lo + static_cast<int32_t>(blockIdx.z) * per * kSplitKeys;
  const int32_t s_hi = min(hi, s_lo + per * kSplitKeys);

  const float scale = 1.0f / sqrtf(static_cast<float>(kD));
  float q[kGroup][8];
  {
    const float* qp = qkv + int64_t{t} * nqkv + int64_t{kv_head} * kGroup * kD + part * 8;
#pragma unroll
    for (int g = 0; g < kGroup; ++g)
#pragma unroll
      for (int i = 0; i < 8; ++i) q[g][i] = qp[g * kD + i] * scale;
  }
  float m[kGroup], l[kGroup], acc[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
  }

  const bf16* cache = static_cast<const bf16*>(kv.base);
  const int64_t v_delta = int64_t{kv.num_kv_heads} * kv.page_size * kD;  // V's offset from K's
  for (int32_t k0 = s_lo + warp * kKeysPerStep; k0 < s_hi; k0 += kWarps * kKeysPerStep) {
    uint4 kr[kUnroll], vr[kUnroll];
    // Every load of the step first, so they are in flight together.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t key = k0 + u * kKeysPerLoad + sub;
      if (key < s_hi) {
        const int64_t off = kv_offset(b, kv, base, key, layer, 0, kv_head) + part * 8;
        kr[u] = __ldg(reinterpret_cast<const uint4*>(cache + off));
        vr[u] = __ldg(reinterpret_cast<const uint4*>(cache + off + v_delta));
      } else {
        kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
      }
    }
    float s[kUnroll][kGroup];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bf16* k8 = reinterpret_cast<const bf16*>(&kr[u]);
      float kf[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) kf[i] = __bfloat162float(k8[i]);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot += q[g][i] * kf[i];
          // The key's kLanes lanes are aligned, so xor offsets below kLanes stay among them.
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        s[u][g] = k0 + u * kKeysPerLoad + sub < s_hi ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float step_max = s[0][g];
#pragma unroll
      for (int u = 1; u < kUnroll; ++u) step_max = fmaxf(step_max, s[u][g]);
      const float m_new = fmaxf(m[g], step_max);
      if (m_new == -INFINITY) continue;  // no key of this stream yet
      const float alpha = expf(m[g] - m_new);
      l[g] *= alpha;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float p = expf(s[u][g] - m_new);
        const bf16* v8 = reinterpret_cast<const bf16*>(&vr[u]);
        l[g] += p;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] += p * __bfloat162float(v8[i]);
      }
      m[g] = m_new;
    }
  }

  // Merge the streams: each writes its state, then the block combines them per output.
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    float* row = merge + (stream * kGroup + g) * (kD + 2);
#pragma unroll
    for (int i = 0; i < 8; ++i) row[part * 8 + i] = acc[g][i];
    if (part == 0) {
      row[kD] = m[g];
      row[kD + 1] = l[g];
    }
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < kGroup * kD; i += kWarpThreads) {
    const int32_t g = i / kD, e = i - g * kD;
    float mx = -INFINITY;
    for (int32_t st = 0; st < kStreams; ++st)
      mx = fmaxf(mx, merge[(st * kGroup + g) * (kD + 2) + kD]);
    float sum = 0.0f, v = 0.0f;
    if (mx != -INFINITY)
      for (int32_t st = 0; st < kStreams; ++st) {
        const float* row = merge + (st * kGroup + g) * (kD + 2);
        if (row[kD] == -INFINITY) continue;
        const float w = expf(row[kD] - mx);
        sum += row[kD + 1] * w;
        v += row[e] * w;
      }
    if (splits > 1) {
      // [single token][query head][split][d + 2], as combine_kernel reads it (attention.cu).
      float* at =
          partial +
          ((int64_t{row} * num_heads + kv_head * kGroup + g) * splits + blockIdx.z) * (kD + 2);
      at[e] = v;
      if (e == 0) {
        at[kD] = mx;
        at[kD + 1] = sum;
      }
    } else {
      out[int64_t{t} * num_heads * kD + int64_t{kv_head * kGroup + g} * kD + e] =
          __float2bfloat16_rn(v / sum);
    }
  }
}

template <int kGroup, int kLanes, int kUnroll>
void launch(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv, int32_t layer,
            int32_t num_heads, int32_t window, bf16* out, int32_t tokens, int32_t splits,
            float* partial, bool heads_fastest, cudaStream_t stream) {
  const size_t smem = size_t{4} * kWarps * (32 / kLanes) * kGroup * (kLanes * 8 + 2);
  auto* kernel = decode_warps_kernel<kGroup, kLanes, kUnroll>;
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  const auto nt = static_cast<unsigned>(tokens), nh = static_cast<unsigned>(kv.num_kv_heads);
  const dim3 grid(heads_fastest ? nh : nt, heads_fastest ? nt : nh, static_cast<unsigned>(splits));
  kernel<<<grid, kWarpThreads, smem, stream>>>(batch, qkv, nqkv, kv, layer, num_heads, window, out,
                                               splits, partial, heads_fastest ? 1 : 0);
}

template <int kGroup, int kUnroll>
bool launch_lanes(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
                  int32_t layer, int32_t num_heads, int32_t window, bf16* out, int32_t tokens,
                  int32_t splits, float* partial, bool heads_fastest, cudaStream_t stream) {
  switch (kv.head_dim) {
    case 64:
      launch<kGroup, 8, kUnroll>(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens,
                                 splits, partial, heads_fastest, stream);
      return true;
    case 128:
      launch<kGroup, 16, kUnroll>(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens,
                                  splits, partial, heads_fastest, stream);
      return true;
    default:
      return false;
  }
}

template <int kUnroll>
bool launch_group(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
                  int32_t layer, int32_t num_heads, int32_t window, bf16* out, int32_t tokens,
                  int32_t splits, float* partial, bool heads_fastest, cudaStream_t stream) {
  switch (num_heads / kv.num_kv_heads) {
    case 1:
      return launch_lanes<1, kUnroll>(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens,
                                      splits, partial, heads_fastest, stream);
    case 2:
      return launch_lanes<2, kUnroll>(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens,
                                      splits, partial, heads_fastest, stream);
    case 4:
      return launch_lanes<4, kUnroll>(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens,
                                      splits, partial, heads_fastest, stream);
    case 8:
      return launch_lanes<8, kUnroll>(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens,
                                      splits, partial, heads_fastest, stream);
    default:
      return false;
  }
}

}  // namespace

bool decode_warps_supports(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return false;
  const int32_t group = num_heads / num_kv_heads;
  return (head_dim == 64 || head_dim == 128) &&
         (group == 1 || group == 2 || group == 4 || group == 8);
}

bool launch_decode_warps(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
                         int32_t layer, int32_t num_heads, int32_t window, bf16* out,
                         int32_t tokens, int32_t splits, float* partial, int32_t unroll,
                         bool heads_fastest, cudaStream_t stream) {
  if (!decode_warps_supports(num_heads, kv.num_kv_heads, kv.head_dim)) return false;
  return unroll == 8 ? launch_group<8>(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens,
                                       splits, partial, heads_fastest, stream)
                     : launch_group<4>(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens,
                                       splits, partial, heads_fastest, stream);
}

}  // namespace blend::cuda
