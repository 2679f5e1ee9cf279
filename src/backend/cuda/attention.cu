// Attention kernels (see kernels.h): the tiled online-softmax kernels (f32 and any head_dim),
// the pipelined flash-decoding kernel for single tokens and its combine step, and the first
// tensor-core (wmma) prefill kernel (the default one is in prefill_mma.cu).
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace blend::cuda {
namespace {

// Attention: one block per (token, KV head) computes the token's query heads of that KV head
// together (GQA: the keys are read once for the group). Keys and values come in tiles of kTile
// positions through shared memory; the softmax is the online one (running max m and sum l per
// head, the accumulator rescaled by exp(m_old - m) per tile), as the cpu backend's. Two
// instances: kTile 64 with 16-byte loads (head_dim a multiple of 16 bytes), and kTile 32 with
// element loads for any head_dim.
constexpr int kAttnThreads = 256;
constexpr int kMaxOutPerThread = 16;
constexpr int kMaxGroupDim = kAttnThreads * kMaxOutPerThread;  // query heads per KV head * D

size_t attention_smem(int32_t group, int32_t d, int32_t tile) {
  return sizeof(float) * (size_t{1} * group * d + size_t{1} * tile * (d + 1) +
                          size_t{1} * group * tile + 3 * group);
}

// tile[kk][e] (rows `ld` floats apart) = K (v = 0) or V (v = 1) of positions k0 + kk, kk < n.
template <typename T, bool kVector>
__device__ __forceinline__ void load_tile(float* tile, int32_t ld, const T* cache,
                                          const BatchView& b, const KvView& kv, int32_t base,
                                          int32_t k0, int32_t n, int32_t layer, int32_t v,
                                          int32_t kv_head) {
  const int32_t d = kv.head_dim;
  if constexpr (kVector) {
    constexpr int32_t kWidth = 16 / sizeof(T);
    const int32_t per_row = d / kWidth;
    for (int32_t i = threadIdx.x; i < n * per_row; i += blockDim.x) {
      const int32_t kk = i / per_row, e = (i - kk * per_row) * kWidth;
      const uint4 raw = *reinterpret_cast<const uint4*>(
          cache + kv_offset(b, kv, base, k0 + kk, layer, v, kv_head) + e);
      const T* vals = reinterpret_cast<const T*>(&raw);
      float* dst = tile + kk * ld + e;
#pragma unroll
      for (int32_t j = 0; j < kWidth; ++j) dst[j] = load_f(vals, j);
    }
  } else {
    for (int32_t i = threadIdx.x; i < n * d; i += blockDim.x) {
      const int32_t kk = i / d, e = i - kk * d;
      tile[kk * ld + e] = load_f(cache, kv_offset(b, kv, base, k0 + kk, layer, v, kv_head) + e);
    }
  }
}

template <typename T, int kTile, bool kVector>
__global__ void __launch_bounds__(kAttnThreads)
    attention_kernel(BatchView b, const float* qkv, int64_t nqkv, KvView kv, int32_t layer,
                     int32_t num_heads, int32_t window, T* out) {
  static_assert(kTile % 32 == 0, "the softmax step gives each lane kTile / 32 keys");
  extern __shared__ float sm[];
  const int32_t d = kv.head_dim, group = num_heads / kv.num_kv_heads, ld = d + 1;
  const int32_t t =
      b.single_tokens ? b.single_tokens[blockIdx.x] : static_cast<int32_t>(blockIdx.x);
  const int32_t kv_head = blockIdx.y, tid = threadIdx.x;
  float* q_s = sm;                   // [group][d], pre-scaled
  float* kv_s = q_s + group * d;     // [kTile][d + 1]: a tile of keys, then of values
  float* p_s = kv_s + kTile * ld;    // [group][kTile]: scores, then probabilities
  float* m_s = p_s + group * kTile;  // [group] running max
  float* l_s = m_s + group;          // [group] running sum
  float* alpha_s = l_s + group;      // [group] this tile's rescale of the accumulator
  const int32_t pos = b.positions[t];
  const int32_t base = b.chunk_table[b.token_chunk[t]];
  const int32_t lo = window > 0 ? max(0, pos - window + 1) : 0, hi = pos + 1;
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  const float* q = qkv + t * nqkv + int64_t{kv_head} * group * d;
  for (int32_t i = tid; i < group * d; i += kAttnThreads) q_s[i] = q[i] * scale;
  if (tid < group) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  float acc[kMaxOutPerThread];
#pragma unroll
  for (int j = 0; j < kMaxOutPerThread; ++j) acc[j] = 0.0f;
  const T* cache = static_cast<const T*>(kv.base);
  const int32_t warp = tid >> 5, lane = tid & 31;
  __syncthreads();

  for (int32_t k0 = lo; k0 < hi; k0 += kTile) {
    const int32_t n = min(kTile, hi - k0);
    load_tile<T, kVector>(kv_s, ld, cache, b, kv, base, k0, n, layer, 0, kv_head);
    __syncthreads();
    for (int32_t i = tid; i < n * group; i += kAttnThreads) {
      const int32_t g = i / n, kk = i - g * n;
      const float* qg = q_s + g * d;
      const float* kr = kv_s + kk * ld;
      float s = 0.0f;
      for (int32_t e = 0; e < d; ++e) s += qg[e] * kr[e];
      p_s[g * kTile + kk] = s;
    }
    __syncthreads();
    for (int32_t g = warp; g < group; g += kAttnThreads / 32) {
      float s[kTile / 32];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTile / 32; ++j) {
        const int32_t kk = lane + 32 * j;
        s[j] = kk < n ? p_s[g * kTile + kk] : -INFINITY;
        tile_max = fmaxf(tile_max, s[j]);
      }
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, warp_max(tile_max));
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kTile / 32; ++j) {
        const int32_t kk = lane + 32 * j;
        const float p = kk < n ? expf(s[j] - m_new) : 0.0f;
        p_s[g * kTile + kk] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = expf(m_old - m_new);
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    load_tile<T, kVector>(kv_s, ld, cache, b, kv, base, k0, n, layer, 1, kv_head);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kMaxOutPerThread; ++j) {
      const int32_t i = tid + j * kAttnThreads;
      if (i < group * d) {
        const int32_t g = i / d, e = i - g * d;
        const float* pg = p_s + g * kTile;
        float a = acc[j] * alpha_s[g];
        for (int32_t kk = 0; kk < n; ++kk) a += pg[kk] * kv_s[kk * ld + e];
        acc[j] = a;
      }
    }
    __syncthreads();
  }
  T* o = out + int64_t{t} * num_heads * d + int64_t{kv_head} * group * d;
#pragma unroll
  for (int j = 0; j < kMaxOutPerThread; ++j) {
    const int32_t i = tid + j * kAttnThreads;
    if (i < group * d) store_f(o, i, acc[j] / l_s[i / d]);
  }
}

template <typename T, int kTile, bool kVector>
void launch_attention(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
                      int32_t layer, int32_t num_heads, int32_t window, T* out,
                      cudaStream_t stream) {
  const size_t smem = attention_smem(num_heads / kv.num_kv_heads, kv.head_dim, kTile);
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(attention_kernel<T, kTile, kVector>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  const int32_t tokens = batch.single_tokens ? batch.num_single_tokens : batch.num_tokens;
  if (tokens == 0) return;
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(kv.num_kv_heads));
  attention_kernel<T, kTile, kVector>
      <<<grid, kAttnThreads, smem, stream>>>(batch, qkv, nqkv, kv, layer, num_heads, window, out);
}

// Decode attention, pipelined: one block of 128 threads per (token, KV head), like
// attention_kernel, but the bf16 K and V tiles of 32 keys stream into shared memory with
// asynchronous copies (cp.async) through kStages buffers, so the next kStages - 1 tiles' reads
// are in flight while one is computed; keys and values stay bf16 in shared memory (16-byte
// reads). For bf16 caches with head_dim a multiple of 8 and query heads per KV head x head_dim
// <= 2048.
namespace dec {
constexpr int kThreads = 128, kKeys = 32, kMaxChunks = 4;  // chunks: 4 outputs of one head each
struct Layout {
  int ld;  // bf16 elements per K / V row in shared memory (16-byte multiple, not a bank stride)
  size_t q, k, v, p, m, l, alpha, total;
  __host__ __device__ Layout(int d, int group, int stages) : ld(d + 8) {
    q = 0;
    k = q + size_t{4} * group * d;
    v = k + size_t{2} * stages * kKeys * ld;
    p = v + size_t{2} * stages * kKeys * ld;
    m = p + size_t{4} * group * kKeys;
    l = m + size_t{4} * group;
    alpha = l + size_t{4} * group;
    total = alpha + size_t{4} * group;
  }
};
bool supports(int32_t group, int32_t d) {
  return d % 8 == 0 && group * d <= kThreads * kMaxChunks * 4;
}
}  // namespace dec

// With splits > 1 (flash-decoding, for batches too small to fill the GPU) block z of a token
// takes the z-th share of its key tiles and writes unnormalised partials (acc[d], m, l per query
// head) to `partial`, [single token][query head][split][d + 2]; combine_kernel merges them.
template <int kStages>
__global__ void __launch_bounds__(dec::kThreads)
    decode_attention_kernel(BatchView b, const float* qkv, int64_t nqkv, KvView kv, int32_t layer,
                            int32_t num_heads, int32_t window, bf16* out, int32_t splits,
                            float* partial, int32_t heads_fastest) {
  using dec::kKeys;
  using dec::kMaxChunks;
  using dec::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  const int32_t d = kv.head_dim, group = num_heads / kv.num_kv_heads;
  const dec::Layout L(d, group, kStages);
  float* q_s = reinterpret_cast<float*>(smem + L.q);  // [group][d], pre-scaled
  bf16* k_s = reinterpret_cast<bf16*>(smem + L.k);    // [kStages][kKeys][ld]
  bf16* v_s = reinterpret_cast<bf16*>(smem + L.v);    // [kStages][kKeys][ld]
  float* p_s = reinterpret_cast<float*>(smem + L.p);  // [group][kKeys]
  float* m_s = reinterpret_cast<float*>(smem + L.m);
  float* l_s = reinterpret_cast<float*>(smem + L.l);
  float* alpha_s = reinterpret_cast<float*>(smem + L.alpha);
  const int32_t row = static_cast<int32_t>(heads_fastest ? blockIdx.y : blockIdx.x);
  const int32_t t = b.single_tokens ? b.single_tokens[row] : row;
  const int32_t kv_head = static_cast<int32_t>(heads_fastest ? blockIdx.x : blockIdx.y);
  const int32_t tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int32_t pos = b.positions[t];
  const int32_t base = b.chunk_table[b.token_chunk[t]];
  const int32_t lo = window > 0 ? max(0, pos - window + 1) : 0, hi = pos + 1;
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  const float* q = qkv + t * nqkv + int64_t{kv_head} * group * d;
  for (int32_t i = tid; i < group * d; i += kThreads) q_s[i] = q[i] * scale;
  if (tid < group) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  const bf16* cache = static_cast<const bf16*>(kv.base);
  const int32_t vecs = d / 8;
  const int64_t v_delta = int64_t{kv.num_kv_heads} * kv.page_size * d;  // V's offset from K's
  // Starts the copies of tile [k0, k0 + kKeys) into buffer `buf` (one pipeline group).
  auto issue = [&](int32_t k0, int32_t buf) {
    const int32_t n = min(kKeys, hi - k0);
    bf16* kd = k_s + buf * kKeys * L.ld;
    bf16* vd = v_s + buf * kKeys * L.ld;
    for (int32_t i = tid; i < n * vecs; i += kThreads) {
      const int32_t kk = i / vecs, e = (i - kk * vecs) * 8;
      const int64_t off = kv_offset(b, kv, base, k0 + kk, layer, 0, kv_head) + e;
      __pipeline_memcpy_async(kd + kk * L.ld + e, cache + off, 16);
      __pipeline_memcpy_async(vd + kk * L.ld + e, cache + off + v_delta, 16);
    }
    __pipeline_commit();
  };
  float acc[kMaxChunks][4];
#pragma unroll
  for (int j = 0; j < kMaxChunks; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  const int32_t chunks = group * d / 4, quarter = d / 4;
  // This block's share of the key tiles.
  const int32_t tiles = (hi - lo + kKeys - 1) / kKeys, per = (tiles + splits - 1) / splits;
  const int32_t s_lo = lo + static_cast<int32_t>(blockIdx.z) * per * kKeys;
  const int32_t s_hi = min(hi, s_lo + per * kKeys);
  __syncthreads();  // q_s, m_s, l_s written
  // One pipeline group per tile, empty past the end, so "all but the newest kStages - 1" below
  // is always this tile's.
#pragma unroll
  for (int32_t st = 0; st < kStages - 1; ++st) {
    if (s_lo + st * kKeys < s_hi)
      issue(s_lo + st * kKeys, st);
    else
      __pipeline_commit();
  }
  int32_t buf = 0;
  for (int32_t k0 = s_lo; k0 < s_hi; k0 += kKeys, buf = buf + 1 == kStages ? 0 : buf + 1) {
    const int32_t n = min(kKeys, s_hi - k0);
    // The buffer computed last iteration (all threads passed its closing barrier) takes the
    // tile kStages - 1 ahead.
    const int32_t ahead = k0 + (kStages - 1) * kKeys;
    if (ahead < s_hi)
      issue(ahead, buf == 0 ? kStages - 1 : buf - 1);
    else
      __pipeline_commit();
    __pipeline_wait_prior(kStages - 1);
    __syncthreads();
    const bf16* kt = k_s + buf * kKeys * L.ld;
    const bf16* vt = v_s + buf * kKeys * L.ld;
    for (int32_t i = tid; i < kKeys * group; i += kThreads) {
      const int32_t g = i / kKeys, kk = i - g * kKeys;
      if (kk < n) {
        const float* qg = q_s + g * d;
        const bf16* kr = kt + kk * L.ld;
        float s = 0.0f;
        for (int32_t e = 0; e < d; e += 8) {
          const uint4 raw = *reinterpret_cast<const uint4*>(kr + e);
          const bf16* k8 = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
          for (int j = 0; j < 8; ++j) s += qg[e + j] * __bfloat162float(k8[j]);
        }
        p_s[g * kKeys + kk] = s;
      }
    }
    __syncthreads();
    for (int32_t g = warp; g < group; g += kThreads / 32) {
      const float s = lane < n ? p_s[g * kKeys + lane] : -INFINITY;
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float p = lane < n ? expf(s - m_new) : 0.0f;
      const float sum = warp_sum(p);
      p_s[g * kKeys + lane] = p;
      if (lane == 0) {
        const float alpha = expf(m_old - m_new);
        alpha_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kMaxChunks; ++j) {
      const int32_t c = tid + j * kThreads;
      if (c < chunks) {
        const int32_t g = c / quarter, d0 = (c - g * quarter) * 4;
        const float alpha = alpha_s[g];
        float a0 = acc[j][0] * alpha, a1 = acc[j][1] * alpha, a2 = acc[j][2] * alpha,
              a3 = acc[j][3] * alpha;
        const float* pg = p_s + g * kKeys;
        for (int32_t kk = 0; kk < n; ++kk) {
          const uint2 raw = *reinterpret_cast<const uint2*>(vt + kk * L.ld + d0);
          const bf16* v4 = reinterpret_cast<const bf16*>(&raw);
          const float p = pg[kk];
          a0 += p * __bfloat162float(v4[0]);
          a1 += p * __bfloat162float(v4[1]);
          a2 += p * __bfloat162float(v4[2]);
          a3 += p * __bfloat162float(v4[3]);
        }
        acc[j][0] = a0;
        acc[j][1] = a1;
        acc[j][2] = a2;
        acc[j][3] = a3;
      }
    }
    __syncthreads();  // the buffer and p_s are rewritten next
  }
  __pipeline_wait_prior(0);
  if (splits > 1) {
    // [single token][query head][split][d + 2]: acc, then m and l.
    auto at = [&](int32_t g) {
      return partial +
             ((int64_t{row} * num_heads + kv_head * group + g) * splits + blockIdx.z) * (d + 2);
    };
#pragma unroll
    for (int j = 0; j < kMaxChunks; ++j) {
      const int32_t c = tid + j * kThreads;
      if (c < chunks) {
        const int32_t g = c / quarter, d0 = (c - g * quarter) * 4;
        for (int i = 0; i < 4; ++i) at(g)[d0 + i] = acc[j][i];
      }
    }
    if (tid < group) {
      at(tid)[d] = m_s[tid];
      at(tid)[d + 1] = l_s[tid];
    }
    return;
  }
  bf16* o = out + int64_t{t} * num_heads * d + int64_t{kv_head} * group * d;
#pragma unroll
  for (int j = 0; j < kMaxChunks; ++j) {
    const int32_t c = tid + j * kThreads;
    if (c < chunks) {
      const int32_t g = c / quarter, d0 = (c - g * quarter) * 4;
      const float inv = 1.0f / l_s[g];
      for (int i = 0; i < 4; ++i) o[g * d + d0 + i] = __float2bfloat16_rn(acc[j][i] * inv);
    }
  }
}

// Merges the splits' partials of one (single token, query head): out = sum_z w_z acc_z /
// sum_z w_z l_z with w_z = exp(m_z - max m). A split with no keys has l = 0 and weighs nothing.
__global__ void combine_kernel(BatchView b, const float* partial, int32_t num_heads, int32_t d,
                               int32_t splits, bf16* out) {
  const int32_t t =
      b.single_tokens ? b.single_tokens[blockIdx.x] : static_cast<int32_t>(blockIdx.x);
  const int32_t h = blockIdx.y;
  const float* p = partial + (int64_t{blockIdx.x} * num_heads + h) * splits * (d + 2);
  float m = -INFINITY;
  for (int32_t z = 0; z < splits; ++z)
    if (p[z * (d + 2) + d + 1] > 0.0f) m = fmaxf(m, p[z * (d + 2) + d]);
  float total = 0.0f;
  for (int32_t z = 0; z < splits; ++z) {
    const float l = p[z * (d + 2) + d + 1];
    if (l > 0.0f) total += l * expf(p[z * (d + 2) + d] - m);
  }
  for (int32_t e = threadIdx.x; e < d; e += blockDim.x) {
    float v = 0.0f;
    for (int32_t z = 0; z < splits; ++z) {
      const float l = p[z * (d + 2) + d + 1];
      if (l > 0.0f) v += p[z * (d + 2) + e] * expf(p[z * (d + 2) + d] - m);
    }
    out[int64_t{t} * num_heads * d + int64_t{h} * d + e] = __float2bfloat16_rn(v / total);
  }
}

// Blocks of the decode kernel with `smem` bytes that one multiprocessor holds at once (the
// runtime's occupancy calculation: host-side arithmetic, no GPU work).
template <int kStages>
int32_t decode_blocks_per_multiprocessor(size_t smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_attention_kernel<kStages>,
                                                    dec::kThreads, smem) != cudaSuccess) {
    cudaGetLastError();
    n = 1;
  }
  return std::max(1, n);
}

template <int kStages>
void launch_decode_attention(const BatchView& batch, const float* qkv, int64_t nqkv,
                             const KvView& kv, int32_t layer, int32_t num_heads, int32_t window,
                             bf16* out, const DecodeScratch& scratch, int32_t warps_unroll,
                             cudaStream_t stream) {
  const int32_t tokens = batch.single_tokens ? batch.num_single_tokens : batch.num_tokens;
  if (tokens == 0) return;
  const size_t smem = dec::Layout(kv.head_dim, num_heads / kv.num_kv_heads, kStages).total;
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(decode_attention_kernel<kStages>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  int32_t splits =
      decode_splits(tokens, kv.num_kv_heads, batch.max_single_context, scratch.multiprocessors);
  if (scratch.splits == DecodeSplits::kWaves)
    splits = std::max(splits, wave_splits(int64_t{tokens} * kv.num_kv_heads,
                                          decode_tiles(batch.max_single_context),
                                          decode_blocks_per_multiprocessor<kStages>(smem) *
                                              int64_t{scratch.multiprocessors}));
  splits = std::max(splits, scratch.min_splits);
  if (scratch.floats < decode_scratch_floats(tokens, num_heads, kv.head_dim, splits)) splits = 1;
  // The grid's fastest dimension: tokens (blocks running together read one KV head of many
  // sequences) or KV heads (all heads of fewer sequences); grid y holds at most 65,535.
  const bool heads_fastest = scratch.heads_fastest && tokens <= 65535;
  // The warp-parallel kernel takes the same splits (the wave policy sized by this kernel's
  // occupancy: an approximation for it) and writes the same partials.
  if (warps_unroll == 0 ||
      !launch_decode_warps(batch, qkv, nqkv, kv, layer, num_heads, window, out, tokens, splits,
                           scratch.data, warps_unroll, heads_fastest, stream)) {
    const auto nt = static_cast<unsigned>(tokens), nh = static_cast<unsigned>(kv.num_kv_heads);
    const dim3 grid(heads_fastest ? nh : nt, heads_fastest ? nt : nh,
                    static_cast<unsigned>(splits));
    decode_attention_kernel<kStages>
        <<<grid, dec::kThreads, smem, stream>>>(batch, qkv, nqkv, kv, layer, num_heads, window, out,
                                                splits, scratch.data, heads_fastest ? 1 : 0);
  }
  if (splits > 1)
    combine_kernel<<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(num_heads)), 128, 0,
                     stream>>>(batch, scratch.data, num_heads, kv.head_dim, splits, out);
}

template <typename T>
void attention_of(AttentionKernel kernel, const BatchView& batch, const float* qkv, int64_t nqkv,
                  const KvView& kv, int32_t layer, int32_t num_heads, int32_t window, T* out,
                  const DecodeScratch& scratch, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    const int32_t warps_unroll = kernel == AttentionKernel::kWarps    ? 4
                                 : kernel == AttentionKernel::kWarps8 ? 8
                                                                      : 0;
    if ((kernel == AttentionKernel::kDefault || kernel == AttentionKernel::kPipelined3 ||
         warps_unroll > 0) &&
        dec::supports(num_heads / kv.num_kv_heads, kv.head_dim)) {
      if (kernel == AttentionKernel::kPipelined3)
        launch_decode_attention<3>(batch, qkv, nqkv, kv, layer, num_heads, window, out, scratch, 0,
                                   stream);
      else
        launch_decode_attention<2>(batch, qkv, nqkv, kv, layer, num_heads, window, out, scratch,
                                   warps_unroll, stream);
      return;
    }
  }
  const bool vector = kernel != AttentionKernel::kTiled32 && kv.head_dim * sizeof(T) % 16 == 0;
  if (vector)
    launch_attention<T, 64, true>(batch, qkv, nqkv, kv, layer, num_heads, window, out, stream);
  else
    launch_attention<T, 32, false>(batch, qkv, nqkv, kv, layer, num_heads, window, out, stream);
}

// Prefill attention on tensor cores (wmma, bf16 in, f32 accumulate): one block per (tile of
// consecutive query tokens of one chunk, KV head). Its 64 query rows are (token, query head of
// the group) pairs; keys come in tiles of 64. Per key tile: S = Q K^T (bf16 Q pre-scaled),
// the causal / window mask and the online softmax in f32 (4 threads per row), P rounded to
// bf16, O = O * alpha + P V with O kept in shared memory in f32 (flash attention's loop).
namespace pf {
constexpr int kRows = 64, kKeys = 64, kThreads = 256, kWarps = kThreads / 32;
// Shared memory layout for head_dim d, in bytes from the start.
struct Layout {
  int ldq, ldk, lds, ldp, ldo;
  size_t q, kv, s, p, o, m, l, alpha, total;
  __host__ __device__ explicit Layout(int d)
      : ldq(d + 8), ldk(d + 8), lds(kKeys + 4), ldp(kKeys + 8), ldo(d + 4) {
    q = 0;
    kv = q + size_t{2} * kRows * ldq;
    s = kv + size_t{2} * kKeys * ldk;
    p = s + size_t{4} * kRows * lds;
    o = p + size_t{2} * kRows * ldp;
    m = o + size_t{4} * kRows * ldo;
    l = m + 4 * kRows;
    alpha = l + 4 * kRows;
    total = alpha + 4 * kRows;
  }
};
}  // namespace pf

__global__ void __launch_bounds__(pf::kThreads)
    prefill_attention_kernel(BatchView b, const float* qkv, int64_t nqkv, KvView kv, int32_t layer,
                             int32_t num_heads, int32_t window, bf16* out) {
  using namespace nvcuda;
  using pf::kKeys;
  using pf::kRows;
  extern __shared__ __align__(128) unsigned char smem[];
  const int32_t d = kv.head_dim, group = num_heads / kv.num_kv_heads;
  const pf::Layout L(d);
  bf16* q_s = reinterpret_cast<bf16*>(smem + L.q);
  bf16* kv_s = reinterpret_cast<bf16*>(smem + L.kv);
  float* s_s = reinterpret_cast<float*>(smem + L.s);
  bf16* p_s = reinterpret_cast<bf16*>(smem + L.p);
  float* o_s = reinterpret_cast<float*>(smem + L.o);
  float* m_s = reinterpret_cast<float*>(smem + L.m);
  float* l_s = reinterpret_cast<float*>(smem + L.l);
  float* alpha_s = reinterpret_cast<float*>(smem + L.alpha);
  const int32_t tid = threadIdx.x, warp = tid >> 5, kv_head = blockIdx.y;
  const int32_t t0 = b.prefill_tiles[2 * blockIdx.x], nq = b.prefill_tiles[2 * blockIdx.x + 1];
  const int32_t rows = nq * group;  // valid query rows
  const int32_t pos0 = b.positions[t0];
  const int32_t base = b.chunk_table[b.token_chunk[t0]];
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  // Query rows (token t0 + r / group, head kv_head * group + r % group); rows past nq are 0.
  for (int32_t i = tid; i < kRows * d; i += pf::kThreads) {
    const int32_t r = i / d, e = i - r * d;
    float v = 0.0f;
    if (r < rows)
      v = qkv[int64_t{t0 + r / group} * nqkv + int64_t{kv_head * group + r % group} * d + e] *
          scale;
    q_s[r * L.ldq + e] = __float2bfloat16_rn(v);
  }
  for (int32_t i = tid; i < kRows * d; i += pf::kThreads) o_s[(i / d) * L.ldo + i % d] = 0.0f;
  if (tid < kRows) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  const bf16* cache = static_cast<const bf16*>(kv.base);
  const int32_t lo = window > 0 ? max(0, pos0 - window + 1) : 0, hi = pos0 + nq;
  const int32_t vec_per_row = d / 8;  // 16-byte vectors of 8 bf16
  // Loads keys (v = 0) or values (v = 1) of positions [k0, k0 + n) into kv_s; rows past n are 0.
  auto load = [&](int32_t k0, int32_t n, int32_t v) {
    for (int32_t i = tid; i < kKeys * vec_per_row; i += pf::kThreads) {
      const int32_t kk = i / vec_per_row, e = (i - kk * vec_per_row) * 8;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (kk < n)
        raw = *reinterpret_cast<const uint4*>(
            cache + kv_offset(b, kv, base, k0 + kk, layer, v, kv_head) + e);
      *reinterpret_cast<uint4*>(kv_s + kk * L.ldk + e) = raw;
    }
  };
  __syncthreads();

  for (int32_t k0 = lo; k0 < hi; k0 += kKeys) {
    const int32_t n = min(kKeys, hi - k0);
    load(k0, n, 0);
    __syncthreads();
    // S = Q K^T: 4 x 4 fragments of 16 x 16, two per warp.
    for (int32_t f = warp; f < 16; f += pf::kWarps) {
      const int32_t rb = f / 4, kb = f % 4;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::fill_fragment(c, 0.0f);
      for (int32_t e = 0; e < d; e += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bk;
        wmma::load_matrix_sync(a, q_s + rb * 16 * L.ldq + e, L.ldq);
        wmma::load_matrix_sync(bk, kv_s + kb * 16 * L.ldk + e, L.ldk);
        wmma::mma_sync(c, a, bk, c);
      }
      wmma::store_matrix_sync(s_s + rb * 16 * L.lds + kb * 16, c, L.lds, wmma::mem_row_major);
    }
    __syncthreads();
    load(k0, n, 1);  // kv_s is free: S is in s_s
    // Softmax: 4 threads per row (consecutive lanes), 16 keys each.
    {
      const int32_t r = tid / 4, part = tid % 4;
      const int32_t qpos = pos0 + r / group;
      const int32_t row_lo = window > 0 ? max(0, qpos - window + 1) : 0;
      float sv[16];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int32_t kk = part * 16 + j, kpos = k0 + kk;
        const bool ok = r < rows && kk < n && kpos <= qpos && kpos >= row_lo;
        sv[j] = ok ? s_s[r * L.lds + kk] : -INFINITY;
        tile_max = fmaxf(tile_max, sv[j]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, tile_max);
      // A row with no valid key yet (all -inf) keeps p = 0 and alpha = 1.
      const bool none = m_new == -INFINITY;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float pv = none ? 0.0f : expf(sv[j] - m_new);
        p_s[r * L.ldp + part * 16 + j] = __float2bfloat16_rn(pv);
        sum += pv;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float alpha = none ? 1.0f : expf(m_old - m_new);
      for (int32_t e = part; e < d; e += 4) o_s[r * L.ldo + e] *= alpha;
      __syncwarp();
      if (part == 0) {
        alpha_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
      }
    }
    __syncthreads();
    // O += P V: 4 x (d / 16) fragments.
    for (int32_t f = warp; f < 4 * (d / 16); f += pf::kWarps) {
      const int32_t rb = f % 4, cb = f / 4;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      float* o_tile = o_s + rb * 16 * L.ldo + cb * 16;
      wmma::load_matrix_sync(c, o_tile, L.ldo, wmma::mem_row_major);
#pragma unroll
      for (int32_t kb = 0; kb < kKeys / 16; ++kb) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> bv;
        wmma::load_matrix_sync(a, p_s + rb * 16 * L.ldp + kb * 16, L.ldp);
        wmma::load_matrix_sync(bv, kv_s + kb * 16 * L.ldk + cb * 16, L.ldk);
        wmma::mma_sync(c, a, bv, c);
      }
      wmma::store_matrix_sync(o_tile, c, L.ldo, wmma::mem_row_major);
    }
    __syncthreads();
  }
  for (int32_t i = tid; i < rows * d; i += pf::kThreads) {
    const int32_t r = i / d, e = i - r * d;
    out[int64_t{t0 + r / group} * num_heads * d + int64_t{kv_head * group + r % group} * d + e] =
        __float2bfloat16_rn(o_s[r * L.ldo + e] / l_s[r]);
  }
}

}  // namespace

bool attention_supports(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                        const char** why) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    *why = "query heads must be a multiple of KV heads";
    return false;
  }
  if (int64_t{num_heads / num_kv_heads} * head_dim > kMaxGroupDim) {
    *why = "query heads per KV head times head_dim is over 4096";
    return false;
  }
  if (head_dim % 2 != 0) {
    *why = "head_dim must be even (RoPE)";
    return false;
  }
  return true;
}

int32_t decode_splits(int32_t tokens, int32_t num_kv_heads, int32_t max_context,
                      int32_t multiprocessors) {
  const int64_t blocks = int64_t{tokens} * num_kv_heads;
  if (blocks >= multiprocessors || max_context <= 2 * dec::kKeys) return 1;
  // Enough blocks for two per multiprocessor, each split at least two key tiles, at most 32.
  const int64_t want = (2 * int64_t{multiprocessors} + blocks - 1) / blocks;
  const int64_t most = (max_context + 2 * dec::kKeys - 1) / (2 * dec::kKeys);
  return static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>({want, most, 32})));
}

int32_t decode_tiles(int32_t context) {
  return (context + dec::kKeys - 1) / dec::kKeys;
}

int32_t wave_splits_most(int32_t tiles) {
  return std::min(32, std::max(1, tiles / 2));
}

int32_t wave_splits(int64_t blocks, int32_t tiles, int64_t resident) {
  if (blocks <= 0 || tiles <= 0 || resident <= 0) return 1;
  // Each split of s holds ceil(tiles / s) tiles plus one tile's worth of fixed cost (its first
  // copy, the query, the partials); the blocks run in ceil(blocks * s / resident) waves.
  int32_t best = 1;
  double best_time = 0;
  for (int32_t s = 1; s <= wave_splits_most(tiles); ++s) {
    const double waves = static_cast<double>((blocks * s + resident - 1) / resident);
    const double time = waves * ((tiles + s - 1) / s + 1);
    if (s == 1 || time < best_time) {
      best = s;
      best_time = time;
    }
  }
  return best;
}

size_t decode_scratch_floats(int32_t tokens, int32_t num_heads, int32_t head_dim, int32_t splits) {
  return splits <= 1
             ? 0
             : size_t{1} * tokens * num_heads * splits * (static_cast<size_t>(head_dim) + 2);
}

int32_t prefill_tile_tokens(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, Elem elem) {
  if (elem != Elem::kBF16 || head_dim % 16 != 0 || head_dim > 128 || num_kv_heads <= 0 ||
      num_heads % num_kv_heads != 0)
    return 0;
  const int32_t group = num_heads / num_kv_heads;
  return pf::kRows % group == 0 ? pf::kRows / group : 0;
}

void attention(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
               int32_t layer, int32_t num_heads, int32_t sliding_window, void* out, Elem out_elem,
               AttentionKernel kernel, PrefillKernel prefill, const DecodeScratch& scratch,
               cudaStream_t stream) {
  if (batch.num_tokens == 0) return;
  if (kv.elem != out_elem) throw Error("internal: cuda attention: KV and output types differ");
  if (batch.num_prefill_tiles > 0 && out_elem != Elem::kBF16)
    throw Error("internal: cuda prefill attention needs bf16");
  if (batch.num_prefill_tiles > 0 &&
      !(prefill == PrefillKernel::kMma &&
        launch_prefill_mma(batch, qkv, nqkv, kv, layer, num_heads, sliding_window,
                           static_cast<bf16*>(out), stream))) {
    const size_t smem = pf::Layout(kv.head_dim).total;
    cudaFuncSetAttribute(prefill_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
    const dim3 grid(static_cast<unsigned>(batch.num_prefill_tiles),
                    static_cast<unsigned>(kv.num_kv_heads));
    prefill_attention_kernel<<<grid, pf::kThreads, smem, stream>>>(
        batch, qkv, nqkv, kv, layer, num_heads, sliding_window, static_cast<bf16*>(out));
    check_launch("prefill attention");
  }
  if (out_elem == Elem::kBF16)
    attention_of(kernel, batch, qkv, nqkv, kv, layer, num_heads, sliding_window,
                 static_cast<bf16*>(out), scratch, stream);
  else
    attention_of(kernel, batch, qkv, nqkv, kv, layer, num_heads, sliding_window,
                 static_cast<float*>(out), scratch, stream);
  check_launch("attention");
}

}  // namespace blend::cuda
