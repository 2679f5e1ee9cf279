// Prefill attention on tensor cores with everything in registers (BLEND_CUDA_PREFILL=mma, the
// default; kernels.h): flash attention 2's loop (Dao, 2023, §3.1) over blend's paged KV.
//
// One block of four warps per (prefill tile, KV head); the tile's 64 query rows are (token,
// query head of the group) pairs as in the wmma kernel (attention.cu), 16 rows per warp. Per
// 64-key tile, each warp computes S = Q K^T with mma.sync m16n8k16 (bf16 in, f32 accumulate),
// applies the causal / window mask and the online softmax to S where the accumulator left it
// (each thread owns two rows' worth of 16 scores), rounds P to bf16 straight into the A
// operand of the next mma (the m16n8 accumulator's layout is the m16n8k16 A operand's), and
// adds P V into an output accumulator that never leaves registers. K and V tiles come in by
// cp.async, double-buffered, and are read into fragments with ldmatrix (.trans for V).
//
// Why a second kernel: the wmma kernel kept S, P and O in shared memory, with O loaded, scaled
// and stored back on every key tile and four barriers per tile; it ran prefill attention at
// ~20 TFLOP/s on an H200 (13.4 of a 4 x 512 prefill step's 61.6 ms, docs/BENCHMARKS.md).
// Numerics are the wmma kernel's: Q scaled by 1/sqrt(d) then rounded to bf16, P rounded to bf16
// for P V, the row sums l from the unrounded P, f32 everywhere else.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include <cmath>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/kernels.h"

namespace blend::cuda {
namespace {

constexpr int kRows = 64, kKeys = 64, kWarps = 4, kThreads = kWarps * 32;

// Shared memory: [2 buffers][K, V][kKeys][d + 8] bf16. The 8-element pad makes a row
// 16 * (d / 8 + 1) bytes, an odd number of 16-byte units, so ldmatrix's eight row reads of a
// matrix land in distinct banks.
size_t smem_bytes(int32_t d) {
  return size_t{2} * 2 * kKeys * static_cast<size_t>(d + 8) * sizeof(bf16);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 bf16 matrices; lane L gives the address of row L % 8 of matrix L / 8. Lane i gets
// of each matrix the pair at (row i / 4, columns 2 (i % 4) and + 1), or with kTrans the pair at
// (rows 2 (i % 4) and + 1, column i / 4).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c (16 x 8, f32) += a (16 x 16, bf16, row-major) * b (16 x 8, bf16, column-major).
// Fragments (g = lane / 4, q = lane % 4): a = {(g, 2q..), (g + 8, 2q..), (g, 2q + 8..),
// (g + 8, 2q + 8..)}; b = {(k 2q.., n g), (k 2q + 8.., n g)}; c = {(g, 2q), (g, 2q + 1),
// (g + 8, 2q), (g + 8, 2q + 1)}.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// kMaxD: the largest head_dim an instance holds in registers; d (a multiple of 16) <= kMaxD.
template <int kMaxD>
__global__ void __launch_bounds__(kThreads)
    prefill_mma_kernel(BatchView b, const float* qkv, int64_t nqkv, KvView kv, int32_t layer,
                       int32_t num_heads, int32_t window, bf16* out) {
  constexpr int kChunks = kMaxD / 16;  // 16-wide slices of d: Q K^T's k steps, P V's n pairs
  constexpr int kKeyBlocks = kKeys / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const int32_t d = kv.head_dim, group = num_heads / kv.num_kv_heads, ld = d + 8;
  bf16* k_s = reinterpret_cast<bf16*>(smem);  // [2][kKeys][ld]
  bf16* v_s = k_s + 2 * kKeys * ld;           // [2][kKeys][ld]
  const int32_t tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q4 = lane & 3;
  const int32_t kv_head = static_cast<int32_t>(blockIdx.y);
  // The last tiles (the longest key ranges of their chunks) first, for a shorter tail.
  const int32_t tile = static_cast<int32_t>(gridDim.x - 1 - blockIdx.x);
  const int32_t t0 = b.prefill_tiles[2 * tile], nq = b.prefill_tiles[2 * tile + 1];
  const int32_t rows = nq * group;  // valid query rows
  const int32_t pos0 = b.positions[t0];
  const int32_t base = b.chunk_table[b.token_chunk[t0]];
  const int32_t lo = window > 0 ? max(0, pos0 - window + 1) : 0, hi = pos0 + nq;

  // This thread's two rows and the key positions each may see.
  const int32_t row0 = warp * 16 + g, row1 = row0 + 8;
  const int32_t qpos0 = pos0 + row0 / group, qpos1 = pos0 + row1 / group;
  const int32_t klo0 = window > 0 ? qpos0 - window + 1 : 0;
  const int32_t klo1 = window > 0 ? qpos1 - window + 1 : 0;
  // The warp's key range: nothing to do on a key tile outside it.
  const int32_t warp_last_row = min(warp * 16 + 15, rows - 1);
  const int32_t warp_hi = pos0 + warp_last_row / group;  // largest query position
  const int32_t warp_lo = window > 0 ? pos0 + (warp * 16) / group - window + 1 : 0;
  const bool warp_active = warp * 16 < rows;

  // Q as A fragments, scaled and rounded to bf16; rows past `rows` are 0.
  const float scale = 1.0f / sqrtf(static_cast<float>(d));
  uint32_t qf[kChunks][4];
  {
    auto row_ptr = [&](int32_t r) -> const float* {
      return r < rows
                 ? qkv + int64_t{t0 + r / group} * nqkv + int64_t{kv_head * group + r % group} * d
                 : nullptr;
    };
    const float *qa = row_ptr(row0), *qb = row_ptr(row1);
    auto pair = [&](const float* p, int32_t c) {
      if (!p) return 0u;
      const float2 v = *reinterpret_cast<const float2*>(p + c);
      return pack_bf16(v.x * scale, v.y * scale);
    };
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      if (kc * 16 >= d) break;
      const int32_t c = kc * 16 + 2 * q4;
      qf[kc][0] = pair(qa, c);
      qf[kc][1] = pair(qb, c);
      qf[kc][2] = pair(qa, c + 8);
      qf[kc][3] = pair(qb, c + 8);
    }
  }

  const bf16* cache = static_cast<const bf16*>(kv.base);
  const int32_t vecs = d / 8;                                           // 16-byte vectors a row
  const int64_t v_delta = int64_t{kv.num_kv_heads} * kv.page_size * d;  // V's offset from K's
  // Starts the copies of keys [k0, k0 + kKeys) into buffer `buf` (one pipeline group); rows
  // past the end are zeros (P is 0 there, and 0 * a stale NaN would not be).
  auto issue = [&](int32_t k0, int32_t buf) {
    const int32_t n = min(kKeys, hi - k0);
    bf16* kd = k_s + buf * kKeys * ld;
    bf16* vd = v_s + buf * kKeys * ld;
    for (int32_t i = tid; i < kKeys * vecs; i += kThreads) {
      const int32_t kk = i / vecs, e = (i - kk * vecs) * 8;
      if (kk < n) {
        const int64_t off = kv_offset(b, kv, base, k0 + kk, layer, 0, kv_head) + e;
        __pipeline_memcpy_async(kd + kk * ld + e, cache + off, 16);
        __pipeline_memcpy_async(vd + kk * ld + e, cache + off + v_delta, 16);
      } else {
        *reinterpret_cast<uint4*>(kd + kk * ld + e) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(vd + kk * ld + e) = make_uint4(0, 0, 0, 0);
      }
    }
    __pipeline_commit();
  };

  float o[2 * kChunks][4];  // O rows row0 / row1, columns 8 j + 2 q4 (+1)
#pragma unroll
  for (int j = 0; j < 2 * kChunks; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  // Running max (in log2 units) and this thread's share of the row sums.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  constexpr float kLog2e = 1.4426950408889634f;

  const int32_t tiles = (hi - lo + kKeys - 1) / kKeys;
  issue(lo, 0);
  for (int32_t it = 0; it < tiles; ++it) {
    const int32_t k0 = lo + it * kKeys, buf = it & 1;
    if (it + 1 < tiles) {
      issue(k0 + kKeys, buf ^ 1);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    if (warp_active && k0 <= warp_hi && k0 + kKeys - 1 >= warp_lo) {
      const bf16* kt = k_s + buf * kKeys * ld;
      const bf16* vt = v_s + buf * kKeys * ld;
      // S = Q K^T: key blocks of 8, two per ldmatrix (matrices: block nb d-lo, d-hi; nb + 1).
      float s[kKeyBlocks][4];
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; nb += 2) {
        const bf16* krow = kt + ((nb + (lane >> 4)) * 8 + (lane & 7)) * ld + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kc = 0; kc < kChunks; ++kc) {
          if (kc * 16 >= d) break;
          uint32_t kb[4];
          ldmatrix_x4<false>(kb, krow + kc * 16);
          mma_bf16(s[nb], qf[kc], kb[0], kb[1]);
          mma_bf16(s[nb + 1], qf[kc], kb[2], kb[3]);
        }
      }
      // Mask, then the online softmax in log2 units; the 4 lanes of a row share its max.
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int32_t kpos = k0 + nb * 8 + 2 * q4 + j;
          s[nb][j] = kpos <= qpos0 && kpos >= klo0 ? s[nb][j] * kLog2e : -INFINITY;
          s[nb][2 + j] = kpos <= qpos1 && kpos >= klo1 ? s[nb][2 + j] * kLog2e : -INFINITY;
          mx0 = fmaxf(mx0, s[nb][j]);
          mx1 = fmaxf(mx1, s[nb][2 + j]);
        }
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // A row with no valid key yet (max -inf) keeps p = 0 and alpha = 1.
      const bool none0 = mx0 == -INFINITY, none1 = mx1 == -INFINITY;
      const float alpha0 = none0 ? 1.0f : exp2f(m0 - mx0);
      const float alpha1 = none1 ? 1.0f : exp2f(m1 - mx1);
      m0 = mx0;
      m1 = mx1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          s[nb][j] = none0 ? 0.0f : exp2f(s[nb][j] - mx0);
          s[nb][2 + j] = none1 ? 0.0f : exp2f(s[nb][2 + j] - mx1);
          sum0 += s[nb][j];
          sum1 += s[nb][2 + j];
        }
      }
      l0 = l0 * alpha0 + sum0;
      l1 = l1 * alpha1 + sum1;
#pragma unroll
      for (int j = 0; j < 2 * kChunks; ++j) {
        o[j][0] *= alpha0;
        o[j][1] *= alpha0;
        o[j][2] *= alpha1;
        o[j][3] *= alpha1;
      }
      // O += P V, 16 keys at a time: P's A fragment is the accumulators of key blocks 2 kk and
      // 2 kk + 1; V's B fragments by ldmatrix.trans (matrices: keys lo / hi of d-lo, of d-hi).
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                                pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        const bf16* vrow =
            vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8;
#pragma unroll
        for (int dc = 0; dc < kChunks; ++dc) {
          if (dc * 16 >= d) break;
          uint32_t vb[4];
          ldmatrix_x4<true>(vb, vrow + dc * 16);
          mma_bf16(o[2 * dc], pa, vb[0], vb[1]);
          mma_bf16(o[2 * dc + 1], pa, vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration but one
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int32_t r = half ? row1 : row0;
    if (r >= rows) continue;
    const float inv = 1.0f / (half ? l1 : l0);
    bf16* dst = out + (int64_t{t0 + r / group} * num_heads + kv_head * group + r % group) * d;
#pragma unroll
    for (int j = 0; j < 2 * kChunks; ++j) {
      if (j * 8 >= d) break;
      *reinterpret_cast<__nv_bfloat162*>(dst + j * 8 + 2 * q4) =
          __floats2bfloat162_rn(o[j][2 * half] * inv, o[j][2 * half + 1] * inv);
    }
  }
}

template <int kMaxD>
void launch(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv, int32_t layer,
            int32_t num_heads, int32_t window, bf16* out, cudaStream_t stream) {
  const size_t smem = smem_bytes(kv.head_dim);
  cudaFuncSetAttribute(prefill_mma_kernel<kMaxD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(smem));
  const dim3 grid(static_cast<unsigned>(batch.num_prefill_tiles),
                  static_cast<unsigned>(kv.num_kv_heads));
  prefill_mma_kernel<kMaxD>
      <<<grid, kThreads, smem, stream>>>(batch, qkv, nqkv, kv, layer, num_heads, window, out);
}

}  // namespace

bool launch_prefill_mma(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
                        int32_t layer, int32_t num_heads, int32_t window, __nv_bfloat16* out,
                        cudaStream_t stream) {
  const int32_t d = kv.head_dim;
  if (d % 16 != 0 || d > 128 || kRows % (num_heads / kv.num_kv_heads) != 0) return false;
  if (d <= 64)
    launch<64>(batch, qkv, nqkv, kv, layer, num_heads, window, out, stream);
  else
    launch<128>(batch, qkv, nqkv, kv, layer, num_heads, window, out, stream);
  return true;
}

}  // namespace blend::cuda
