// Measures the cost model's GEMM-attention interference term (hardware.h overlap_interference)
// on an NVIDIA GPU. An overlapped step costs max(parts) + interference x (the rest); BlendServe
// §6.2 gets its "practical" optimum by profiling a GEMM overlapped with attention, and NanoFlow
// §4.3 overlaps them by limiting each kernel's share of the SMs (launching both on plain CUDA
// streams slows the GEMM by up to 2.5x). This program does the same with one Llama-3-8B decoder
// layer:
//   compute part: the layer's four GEMMs (QKV, O, gate-up, down) over M tokens, cuBLASLt bf16
//                 with fp32 accumulation, its SM count target set to the GEMM's share;
//   memory part:  decode attention (GQA, 32 query / 8 KV heads of 128) over R requests of C
//                 context tokens, one of our kernels below, its grid sized to its SM share.
// For each size ratio it tries SM splits, keeps the fastest overlapped pair (both parts joined
// at the end of every repetition, as a step joins its nano-batches), and prints
//   interference = (t_overlapped - max(t_gemm, t_attention)) / min(t_gemm, t_attention)
// with the alone times on the whole device. It also prints the GEMMs' TFLOP/s and the
// memory part's bytes/s alone, against the device's datasheet figures. The memory part is
// measured with three kernels: decode_attention (real attention on CUDA cores),
// decode_attention_tc (real attention on tensor cores, mma.sync m16n8k16, split over the context
// as flash-decoding does so that few SMs still get enough blocks), and kv_stream (the same reads
// and almost no math: the best any attention kernel could reach).
//
// Build and run (no GPU in CI; bench/gpu_interference.sh does both on a machine with one):
//   nvcc -O3 -std=c++17 -arch=sm_90a bench/gpu/overlap_interference.cu -lcublasLt -lcuda -o oi
//   ./oi [GEMM_TOKENS=2048] [REQUESTS=256] [streams|green] [KERNEL,...]
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)
#define CHECK_CUBLAS(call)                                                             \
  do {                                                                                 \
    cublasStatus_t s_ = (call);                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(s_));                                              \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// Llama-3-8B.
constexpr int kHidden = 4096;
constexpr int kIntermediate = 14336;
constexpr int kHeadDim = 128;
constexpr int kKvHeads = 8;
constexpr int kGroup = 4;  // query heads per KV head
constexpr int kQHeads = kKvHeads * kGroup;

// Datasheet peaks of the device at hand (the h100 / h200 presets' NanoFlow Table 1 figures; both
// have 989 dense bf16 TFLOP/s); "of_peak" in the output is against them.
constexpr double kPeakFlops = 989e12;
double peak_bytes_per_second = 3352e9;  // the H100's; main() sets the H200's

// ---------------------------------------------------------------------------------------------
// Decode attention. One block per (request, KV head) item, looping over items (persistent grid
// of `gridDim.x` blocks, which is how the SM share is set). Each half-warp reads one token's K and
// V row (256 bytes each, 16 bytes a lane) and keeps an online softmax for the group's 4 query
// heads; the 8 half-warps of a block are merged through shared memory at the end.
constexpr int kAttnWarps = 4;
constexpr int kHalfWarps = kAttnWarps * 2;
constexpr int kTokensPerLoad = 4;  // tokens a half-warp has in flight
constexpr int kTokenStride = kHalfWarps * kTokensPerLoad;

// Online-softmax state of one output element: the running max of the scores seen (-inf when
// none), and the sum of exponentials and the weighted value, both relative to that max. The
// element's attention output is value / sum.
// Merges `parts` such states, part(i) giving the i-th (as {max, sum, value}).
template <typename Part>
__device__ inline float3 merge_softmax_parts(int parts, Part part) {
  float m = -INFINITY;
  for (int i = 0; i < parts; ++i) m = fmaxf(m, part(i).x);
  float sum = 0.f, value = 0.f;
  for (int i = 0; i < parts; ++i) {
    const float3 p = part(i);
    const float weight = p.x == -INFINITY ? 0.f : __expf(p.x - m);
    sum += p.y * weight;
    value += p.z * weight;
  }
  return make_float3(m, sum, value);
}

__device__ inline void unpack8(const uint4& raw, float out[8]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__global__ void __launch_bounds__(kAttnWarps * 32)
    decode_attention(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                     const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out,
                     int requests, int context, float scale) {
  __shared__ float s_max[kHalfWarps][kGroup];
  __shared__ float s_sum[kHalfWarps][kGroup];
  __shared__ float s_acc[kHalfWarps][kGroup][kHeadDim];

  const int lane = threadIdx.x & 31;
  const int half_warp = threadIdx.x >> 4;  // 0..7
  const int sub = lane & 15;               // owns dims [8 sub, 8 sub + 8)
  const int items = requests * kKvHeads;

  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int request = item / kKvHeads;
    const int kv_head = item % kKvHeads;

    float qr[kGroup][8];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const __nv_bfloat16* qp =
          q + (static_cast<size_t>(request) * kQHeads + kv_head * kGroup + g) * kHeadDim + 8 * sub;
      unpack8(*reinterpret_cast<const uint4*>(qp), qr[g]);
#pragma unroll
      for (int i = 0; i < 8; ++i) qr[g][i] *= scale;
    }
    float running_max[kGroup], running_sum[kGroup], acc[kGroup][8];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      running_max[g] = -INFINITY;
      running_sum[g] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }

    const size_t base = static_cast<size_t>(item) * context * kHeadDim + 8 * sub;
    for (int t0 = half_warp; t0 < context; t0 += kTokenStride) {
      uint4 kraw[kTokensPerLoad], vraw[kTokensPerLoad];
#pragma unroll
      for (int u = 0; u < kTokensPerLoad; ++u) {  // context % kTokenStride == 0 (host checks)
        const size_t off = base + static_cast<size_t>(t0 + u * kHalfWarps) * kHeadDim;
        kraw[u] = __ldcs(reinterpret_cast<const uint4*>(k + off));
        vraw[u] = __ldcs(reinterpret_cast<const uint4*>(v + off));
      }
      // Scores of the 4 tokens for the 4 heads, then one softmax update for all of them.
      float score[kTokensPerLoad][kGroup];
#pragma unroll
      for (int u = 0; u < kTokensPerLoad; ++u) {
        float kf[8];
        unpack8(kraw[u], kf);
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          float dot = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) dot += qr[g][i] * kf[i];
          score[u][g] = dot;
        }
      }
#pragma unroll
      for (int offset = 8; offset > 0; offset >>= 1)  // stays inside the half-warp
#pragma unroll
        for (int u = 0; u < kTokensPerLoad; ++u)
#pragma unroll
          for (int g = 0; g < kGroup; ++g)
            score[u][g] += __shfl_xor_sync(0xffffffffu, score[u][g], offset);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float new_max = running_max[g];
#pragma unroll
        for (int u = 0; u < kTokensPerLoad; ++u) new_max = fmaxf(new_max, score[u][g]);
        const float correction = __expf(running_max[g] - new_max);
        running_sum[g] *= correction;
#pragma unroll
        for (int u = 0; u < kTokensPerLoad; ++u) {
          score[u][g] = __expf(score[u][g] - new_max);
          running_sum[g] += score[u][g];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] *= correction;
        running_max[g] = new_max;
      }
#pragma unroll
      for (int u = 0; u < kTokensPerLoad; ++u) {
        float vf[8];
        unpack8(vraw[u], vf);
#pragma unroll
        for (int g = 0; g < kGroup; ++g)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] += score[u][g] * vf[i];
      }
    }

#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (sub == 0) {
        s_max[half_warp][g] = running_max[g];
        s_sum[half_warp][g] = running_sum[g];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) s_acc[half_warp][g][8 * sub + i] = acc[g][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kGroup * kHeadDim; idx += blockDim.x) {
      const int g = idx / kHeadDim, d = idx % kHeadDim;
      const float3 o = merge_softmax_parts(
          kHalfWarps, [&](int h) { return make_float3(s_max[h][g], s_sum[h][g], s_acc[h][g][d]); });
      out[(static_cast<size_t>(request) * kQHeads + kv_head * kGroup + g) * kHeadDim + d] =
          __float2bfloat16(o.z / o.y);
    }
    __syncthreads();
  }
}

// The memory part with no arithmetic to speak of: the same K and V reads as decode_attention,
// summed. What an attention kernel that hides all its math (tensor cores, as FlashInfer's decode
// does) could reach on a given share of the SMs.
__global__ void __launch_bounds__(kAttnWarps * 32)
    kv_stream(const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
              __nv_bfloat16* __restrict__ out, int requests, int context) {
  const int half_warp = threadIdx.x >> 4, sub = threadIdx.x & 15;
  const int items = requests * kKvHeads;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    float sum = 0.f;
    const size_t base = static_cast<size_t>(item) * context * kHeadDim + 8 * sub;
    for (int t0 = half_warp; t0 < context; t0 += kTokenStride) {
      uint4 kraw[kTokensPerLoad], vraw[kTokensPerLoad];
#pragma unroll
      for (int u = 0; u < kTokensPerLoad; ++u) {
        const size_t off = base + static_cast<size_t>(t0 + u * kHalfWarps) * kHeadDim;
        kraw[u] = __ldcs(reinterpret_cast<const uint4*>(k + off));
        vraw[u] = __ldcs(reinterpret_cast<const uint4*>(v + off));
      }
#pragma unroll
      for (int u = 0; u < kTokensPerLoad; ++u) {
        const __nv_bfloat162* kp = reinterpret_cast<const __nv_bfloat162*>(&kraw[u]);
        const __nv_bfloat162* vp = reinterpret_cast<const __nv_bfloat162*>(&vraw[u]);
        __nv_bfloat162 pair = __hadd2(kp[0], vp[0]);
#pragma unroll
        for (int i = 1; i < 4; ++i) pair = __hadd2(pair, __hadd2(kp[i], vp[i]));
        sum += __low2float(pair) + __high2float(pair);
      }
    }
    if (sum == 12345.f) out[item] = __float2bfloat16(sum);  // keeps the reads alive
  }
}

// Decode attention on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), the way
// FlashAttention-2 chains its two products through registers. A warp takes 16 tokens at a time:
//   S (16 head rows, 4 real, x 16 tokens) = Q K^T   two n-tiles of 8 tokens, 8 k-steps each;
//   O (16 head rows x 128 dims)          += P V     16 n-tiles of 8 dims, one k-step of 16 tokens.
// S's accumulator layout is P's operand layout, so P never leaves registers. The dot products
// do not care in which order they visit the dimensions, so each lane loads 16 contiguous bytes
// of K and the k index is permuted to match (Q is loaded with the same permutation). V is the
// B operand of the second product, which wants two tokens of one dimension per register: each
// lane loads 16 bytes of 4 tokens and pairs them with byte permutes.
constexpr int kTcWarps = 4;
constexpr int kTcTile = 16;  // tokens per warp step
constexpr int kTcTokenStride = kTcWarps * kTcTile;

__device__ inline void mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ inline uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__global__ void __launch_bounds__(kTcWarps * 32)
    decode_attention_tc(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                        const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out,
                        int requests, int context, float scale, int splits,
                        float* __restrict__ partial) {
  __shared__ float s_max[kTcWarps][kGroup];
  __shared__ float s_sum[kTcWarps][kGroup];
  __shared__ float s_acc[kTcWarps][kGroup][kHeadDim];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = lane >> 2;  // mma groupID: a head row of S and O, a token/dim column of B
  const int quad = lane & 3;  // mma threadID_in_group
  const bool real_head = row < kGroup;
  const int items = requests * kKvHeads;
  const int tiles = context / kTcTokenStride;

  // A unit is one item's share of the context (flash-decoding's split), so that the work divides
  // evenly over the grid; with splits > 1 the units' partial results are merged by
  // merge_splits.
  for (int unit = blockIdx.x; unit < items * splits; unit += gridDim.x) {
    const int item = unit / splits, split = unit % splits;
    const int request = item / kKvHeads;
    const int kv_head = item % kKvHeads;
    const int t_begin = split * tiles / splits * kTcTokenStride;
    const int t_end = (split + 1) * tiles / splits * kTcTokenStride;

    // Q rows 0-3 are the group's heads, 4-15 zero. Chunk c covers dims [32c, 32c + 32): this
    // lane's 16 bytes are dims 32c + 8 quad .. + 8.
    uint4 qchunk[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      qchunk[c] = make_uint4(0, 0, 0, 0);
      if (real_head)
        qchunk[c] = *reinterpret_cast<const uint4*>(
            q + (static_cast<size_t>(request) * kQHeads + kv_head * kGroup + row) * kHeadDim +
            32 * c + 8 * quad);
    }
    float running_max = -INFINITY, running_sum = 0.f;  // of head `row`; the sum is this lane's
    float acc[16][4];
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;

    const __nv_bfloat16* kbase = k + static_cast<size_t>(item) * context * kHeadDim;
    const __nv_bfloat16* vbase = v + static_cast<size_t>(item) * context * kHeadDim;
    for (int t0 = t_begin + warp * kTcTile; t0 < t_end; t0 += kTcTokenStride) {
      uint4 kraw[2][4], vraw[4][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          kraw[nt][c] = __ldcs(reinterpret_cast<const uint4*>(
              kbase + static_cast<size_t>(t0 + 8 * nt + row) * kHeadDim + 32 * c + 8 * quad));
      const int vrows[4] = {2 * quad, 2 * quad + 1, 2 * quad + 8, 2 * quad + 9};
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          vraw[r][half] = __ldcs(reinterpret_cast<const uint4*>(
              vbase + static_cast<size_t>(t0 + vrows[r]) * kHeadDim + 64 * half + 8 * row));

      // S = Q K^T: score[nt] holds S[row][8 nt + 2 quad + {0, 1}] (and rows + 8: padding).
      float score[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) score[nt][i] = 0.f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          mma_bf16(score[nt], qchunk[c].x, 0u, qchunk[c].y, 0u, kraw[nt][c].x, kraw[nt][c].y);
          mma_bf16(score[nt], qchunk[c].z, 0u, qchunk[c].w, 0u, kraw[nt][c].z, kraw[nt][c].w);
        }
      }
      float tile_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          score[nt][i] *= scale;
          tile_max = fmaxf(tile_max, score[nt][i]);
        }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(running_max, tile_max);
      const float correction = __expf(running_max - new_max);
      running_max = new_max;
      float p[2][2];
      float tile_sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 2; ++i) tile_sum += (p[nt][i] = __expf(score[nt][i] - new_max));
      running_sum = running_sum * correction + tile_sum;
      const uint32_t a0 = pack_bf16(p[0][0], p[0][1]);  // tokens 2 quad, 2 quad + 1
      const uint32_t a2 = pack_bf16(p[1][0], p[1][1]);  // tokens 8 + 2 quad, 9 + 2 quad

      // O += P V over 16 n-tiles; n-tile (half, e) maps column n to dim 64 half + 8 n + e.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int word = e >> 1;
          const uint32_t selector = (e & 1) ? 0x7632u : 0x5410u;
          auto element_pair = [&](int ra, int rb) {
            const uint32_t* wa = reinterpret_cast<const uint32_t*>(&vraw[ra][half]);
            const uint32_t* wb = reinterpret_cast<const uint32_t*>(&vraw[rb][half]);
            return __byte_perm(wa[word], wb[word], selector);
          };
          float* d = acc[half * 8 + e];
#pragma unroll
          for (int i = 0; i < 4; ++i) d[i] *= correction;
          mma_bf16(d, a0, 0u, a2, 0u, element_pair(0, 1), element_pair(2, 3));
        }
      }
    }

    running_sum += __shfl_xor_sync(0xffffffffu, running_sum, 1);
    running_sum += __shfl_xor_sync(0xffffffffu, running_sum, 2);
    if (real_head) {
      if (quad == 0) {
        s_max[warp][row] = running_max;
        s_sum[warp][row] = running_sum;
      }
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          s_acc[warp][row][64 * half + 8 * (2 * quad) + e] = acc[half * 8 + e][0];
          s_acc[warp][row][64 * half + 8 * (2 * quad + 1) + e] = acc[half * 8 + e][1];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kGroup * kHeadDim; idx += blockDim.x) {
      const int g = idx / kHeadDim, d = idx % kHeadDim;
      const float3 o = merge_softmax_parts(
          kTcWarps, [&](int w) { return make_float3(s_max[w][g], s_sum[w][g], s_acc[w][g][d]); });
      if (splits == 1) {
        out[(static_cast<size_t>(request) * kQHeads + kv_head * kGroup + g) * kHeadDim + d] =
            __float2bfloat16(o.z / o.y);
      } else {  // the split's state, merged by merge_splits
        float* slot = partial + (static_cast<size_t>(unit) * kGroup + g) * (kHeadDim + 2);
        if (d == 0) slot[0] = o.x, slot[1] = o.y;
        slot[2 + d] = o.z;
      }
    }
    __syncthreads();
  }
}

// Merges the splits of each item: one block per item.
__global__ void merge_splits(const float* __restrict__ partial, __nv_bfloat16* __restrict__ out,
                             int splits) {
  const int item = blockIdx.x;
  for (int idx = threadIdx.x; idx < kGroup * kHeadDim; idx += blockDim.x) {
    const int g = idx / kHeadDim, d = idx % kHeadDim;
    const float3 o = merge_softmax_parts(splits, [&](int split) {
      const float* slot =
          partial + ((static_cast<size_t>(item) * splits + split) * kGroup + g) * (kHeadDim + 2);
      return make_float3(slot[0], slot[1], slot[2 + d]);
    });
    out[(static_cast<size_t>(item) * kGroup + g) * kHeadDim + d] = __float2bfloat16(o.z / o.y);
  }
}

enum class MemoryKernel { kCudaCores, kTensorCores, kStream };

const char* kernel_name(MemoryKernel kernel) {
  switch (kernel) {
    case MemoryKernel::kCudaCores:
      return "decode_attention";
    case MemoryKernel::kTensorCores:
      return "decode_attention_tc";
    case MemoryKernel::kStream:
      return "kv_stream";
  }
  return "?";
}

struct Attention {
  int requests = 0, context = 0;
  MemoryKernel kernel = MemoryKernel::kCudaCores;
  float* partial = nullptr;  // decode_attention_tc's split results
  static constexpr int kMaxSplits = 16;
  __nv_bfloat16 *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  size_t kv_bytes() const {
    return 2ull * requests * kKvHeads * static_cast<size_t>(context) * kHeadDim * 2;
  }
  void launch(int blocks, cudaStream_t stream) const {
    const float scale = 1.f / std::sqrt(float(kHeadDim));
    switch (kernel) {
      case MemoryKernel::kCudaCores:
        decode_attention<<<blocks, kAttnWarps * 32, 0, stream>>>(q, k, v, out, requests, context,
                                                                 scale);
        break;
      case MemoryKernel::kTensorCores: {
        // Enough units for 16 per block, so the last round leaves few SMs idle.
        const int items = requests * kKvHeads;
        const int splits = std::clamp((16 * blocks + items - 1) / items, 1,
                                      std::min(kMaxSplits, context / kTcTokenStride));
        decode_attention_tc<<<blocks, kTcWarps * 32, 0, stream>>>(q, k, v, out, requests, context,
                                                                  scale, splits, partial);
        if (splits > 1) merge_splits<<<items, 128, 0, stream>>>(partial, out, splits);
        break;
      }
      case MemoryKernel::kStream:
        kv_stream<<<blocks, kAttnWarps * 32, 0, stream>>>(k, v, out, requests, context);
        break;
    }
  }
};

// How many blocks of `kernel` an SM holds at once.
int blocks_per_sm(MemoryKernel kernel) {
  int blocks = 0;
  switch (kernel) {
    case MemoryKernel::kCudaCores:
      CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, decode_attention,
                                                               kAttnWarps * 32, 0));
      break;
    case MemoryKernel::kTensorCores:
      CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, decode_attention_tc,
                                                               kTcWarps * 32, 0));
      break;
    case MemoryKernel::kStream:
      CHECK_CUDA(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kv_stream, kAttnWarps * 32, 0));
      break;
  }
  return blocks;
}

__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed, float amplitude) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = __float2bfloat16(amplitude * ((x & 0xffff) / 32768.f - 1.f));
  }
}

__nv_bfloat16* device_random(size_t n, uint32_t seed, float amplitude) {
  __nv_bfloat16* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(__nv_bfloat16)));
  fill_random<<<1024, 256>>>(p, n, seed, amplitude);
  CHECK_CUDA(cudaGetLastError());
  return p;
}

// Every kernel needs the context in whole tiles of this many tokens.
constexpr int kContextStep = kTokenStride > kTcTokenStride ? kTokenStride : kTcTokenStride;

Attention make_attention(int requests, int context, MemoryKernel kernel) {
  if (context % kContextStep != 0) {
    std::fprintf(stderr, "context %d is not a multiple of %d\n", context, kContextStep);
    std::exit(1);
  }
  Attention a;
  a.kernel = kernel;
  a.requests = requests;
  a.context = context;
  const size_t kv = static_cast<size_t>(requests) * kKvHeads * context * kHeadDim;
  a.q = device_random(static_cast<size_t>(requests) * kQHeads * kHeadDim, 1, 1.f);
  a.k = device_random(kv, 2, 1.f);
  a.v = device_random(kv, 3, 1.f);
  CHECK_CUDA(cudaMalloc(&a.out, static_cast<size_t>(requests) * kQHeads * kHeadDim * 2));
  if (kernel == MemoryKernel::kTensorCores)
    CHECK_CUDA(cudaMalloc(&a.partial, static_cast<size_t>(requests) * kKvHeads *
                                          Attention::kMaxSplits * kGroup * (kHeadDim + 2) *
                                          sizeof(float)));
  return a;
}

void free_attention(Attention& a) {
  cudaFree(a.q);
  cudaFree(a.k);
  cudaFree(a.v);
  cudaFree(a.out);
  cudaFree(a.partial);
  a = Attention{};
}

float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// The kernel against a float reference on a small case; exits non-zero on a mismatch.
void check_attention(MemoryKernel kernel, int blocks) {
  const int requests = 3, context = 3 * kContextStep;
  Attention a = make_attention(requests, context, kernel);
  a.launch(blocks, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const size_t kv = static_cast<size_t>(requests) * kKvHeads * context * kHeadDim;
  std::vector<__nv_bfloat16> q(requests * kQHeads * kHeadDim), k(kv), v(kv), out(q.size());
  CHECK_CUDA(cudaMemcpy(q.data(), a.q, q.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(k.data(), a.k, kv * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(v.data(), a.v, kv * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(out.data(), a.out, out.size() * 2, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int r = 0; r < requests; ++r)
    for (int h = 0; h < kQHeads; ++h) {
      const int kvh = h / kGroup;
      const size_t kvbase = (static_cast<size_t>(r) * kKvHeads + kvh) * context * kHeadDim;
      std::vector<double> scores(context);
      double m = -1e300;
      for (int t = 0; t < context; ++t) {
        double s = 0;
        for (int d = 0; d < kHeadDim; ++d)
          s += to_float(q[(r * kQHeads + h) * kHeadDim + d]) *
               to_float(k[kvbase + size_t(t) * kHeadDim + d]);
        scores[t] = s / std::sqrt(double(kHeadDim));
        m = std::max(m, scores[t]);
      }
      double total = 0;
      for (double& s : scores) total += (s = std::exp(s - m));
      for (int d = 0; d < kHeadDim; ++d) {
        double value = 0;
        for (int t = 0; t < context; ++t)
          value += scores[t] * to_float(v[kvbase + size_t(t) * kHeadDim + d]);
        worst = std::max(worst,
                         std::abs(value / total - to_float(out[(r * kQHeads + h) * kHeadDim + d])));
      }
    }
  free_attention(a);
  std::printf("{\"check\":\"%s vs float reference\",\"max_abs_error\":%.5f}\n", kernel_name(kernel),
              worst);
  if (!(worst < 0.02)) {
    std::fprintf(stderr, "%s is wrong: max abs error %.5f\n", kernel_name(kernel), worst);
    std::exit(1);
  }
}

// ---------------------------------------------------------------------------------------------
// The layer's GEMMs, y[M, N] = x[M, K] W[N, K]^T (PyTorch's linear layout). In cuBLASLt's
// column-major terms: C (N x M) = A^T B with A = W seen as K x N and B = x seen as K x M.
struct Gemm {
  int n = 0, k = 0;
  __nv_bfloat16* weight = nullptr;
};

class LayerGemms {
 public:
  LayerGemms(cublasLtHandle_t handle, int tokens) : handle_(handle), tokens_(tokens) {
    const int shapes[4][2] = {{(kQHeads + 2 * kKvHeads) * kHeadDim, kHidden},
                              {kHidden, kHidden},
                              {2 * kIntermediate, kHidden},
                              {kHidden, kIntermediate}};
    for (int i = 0; i < 4; ++i) {
      gemms_[i].n = shapes[i][0];
      gemms_[i].k = shapes[i][1];
      gemms_[i].weight = device_random(size_t(gemms_[i].n) * gemms_[i].k, 10 + i, 0.02f);
    }
    input_ = device_random(size_t(tokens) * kIntermediate, 20, 1.f);
    CHECK_CUDA(cudaMalloc(&output_, size_t(tokens) * 2 * kIntermediate * 2));
    CHECK_CUDA(cudaMalloc(&workspace_, kWorkspace));
  }
  ~LayerGemms() {
    for (Gemm& g : gemms_) cudaFree(g.weight);
    cudaFree(input_);
    cudaFree(output_);
    cudaFree(workspace_);
  }

  double flops() const {
    double f = 0;
    for (const Gemm& g : gemms_) f += 2.0 * tokens_ * g.n * g.k;
    return f;
  }

  // The four GEMMs with cuBLASLt's heuristics told to expect `sm_target` SMs (0 = all).
  void launch(int sm_target, cudaStream_t stream) {
    for (const Gemm& g : gemms_) run(g, sm_target, stream);
  }

 private:
  static constexpr size_t kWorkspace = 64ull << 20;

  void run(const Gemm& g, int sm_target, cudaStream_t stream) {
    cublasLtMatmulDesc_t desc;
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                sizeof(transpose)));
    CHECK_CUBLAS(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
    const int32_t target = sm_target;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target,
                                                sizeof(target)));
    cublasLtMatrixLayout_t a, b, c;
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, g.k, g.n, g.k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, g.k, tokens_, g.k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, g.n, tokens_, g.n));
    cublasLtMatmulPreference_t preference;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace, sizeof(kWorkspace)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, desc, a, b, c, c, preference, 1,
                                                &heuristic, &found));
    if (found == 0) {
      std::fprintf(stderr, "cuBLASLt found no algorithm for %d x %d x %d\n", tokens_, g.n, g.k);
      std::exit(1);
    }
    const float alpha = 1.f, beta = 0.f;
    CHECK_CUBLAS(cublasLtMatmul(handle_, desc, &alpha, g.weight, a, input_, b, &beta, output_, c,
                                output_, c, &heuristic.algo, workspace_, kWorkspace, stream));
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(desc);
  }

  cublasLtHandle_t handle_;
  int tokens_;
  Gemm gemms_[4];
  __nv_bfloat16* input_ = nullptr;
  __nv_bfloat16* output_ = nullptr;
  void* workspace_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// A hard split of the SMs (CUDA green contexts): the memory part's stream runs on `memory_sms`
// SMs and the GEMMs' on the rest, so neither kernel's blocks can land on the other's SMs.
struct GreenSplit {
  int memory_sms = 0, gemm_sms = 0;
  CUgreenCtx memory_ctx = nullptr, gemm_ctx = nullptr;
  cudaStream_t memory = nullptr, gemm = nullptr;
};

bool cu_ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* text = nullptr;
  cuGetErrorString(r, &text);
  std::fprintf(stderr, "%s: %s\n", what, text ? text : "?");
  return false;
}

bool make_green_split(int memory_sms, GreenSplit& split) {
  CUdevice device;
  CUdevResource all, group, rest;
  if (!cu_ok(cuDeviceGet(&device, 0), "cuDeviceGet") ||
      !cu_ok(cuDeviceGetDevResource(device, &all, CU_DEV_RESOURCE_TYPE_SM),
             "cuDeviceGetDevResource"))
    return false;
  unsigned groups = 1;
  if (!cu_ok(cuDevSmResourceSplitByCount(&group, &groups, &all, &rest, 0, memory_sms),
             "cuDevSmResourceSplitByCount") ||
      groups != 1)
    return false;
  CUdevResourceDesc memory_desc, gemm_desc;
  CUstream memory_stream, gemm_stream;
  if (!cu_ok(cuDevResourceGenerateDesc(&memory_desc, &group, 1), "cuDevResourceGenerateDesc") ||
      !cu_ok(cuDevResourceGenerateDesc(&gemm_desc, &rest, 1), "cuDevResourceGenerateDesc") ||
      !cu_ok(cuGreenCtxCreate(&split.memory_ctx, memory_desc, device, CU_GREEN_CTX_DEFAULT_STREAM),
             "cuGreenCtxCreate") ||
      !cu_ok(cuGreenCtxCreate(&split.gemm_ctx, gemm_desc, device, CU_GREEN_CTX_DEFAULT_STREAM),
             "cuGreenCtxCreate") ||
      !cu_ok(cuGreenCtxStreamCreate(&memory_stream, split.memory_ctx, CU_STREAM_NON_BLOCKING, 0),
             "cuGreenCtxStreamCreate") ||
      !cu_ok(cuGreenCtxStreamCreate(&gemm_stream, split.gemm_ctx, CU_STREAM_NON_BLOCKING, 0),
             "cuGreenCtxStreamCreate"))
    return false;
  split.memory = memory_stream;
  split.gemm = gemm_stream;
  split.memory_sms = static_cast<int>(group.sm.smCount);
  split.gemm_sms = static_cast<int>(rest.sm.smCount);
  return true;
}

void free_green_split(GreenSplit& split) {
  cuStreamDestroy(split.memory);
  cuStreamDestroy(split.gemm);
  cuGreenCtxDestroy(split.memory_ctx);
  cuGreenCtxDestroy(split.gemm_ctx);
  split = GreenSplit{};
}

struct Streams {
  cudaStream_t gemm, attention;
  cudaEvent_t start, stop, fork, join;
};

// Median milliseconds of one repetition over `trials` timed runs of `reps` repetitions each.
template <typename Body>
double median_ms(Streams& s, int reps, int trials, Body body) {
  body();  // warm-up (and heuristic choice)
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> samples;
  for (int trial = 0; trial < trials; ++trial) {
    CHECK_CUDA(cudaEventRecord(s.start, s.gemm));
    for (int r = 0; r < reps; ++r) body();
    CHECK_CUDA(cudaEventRecord(s.stop, s.gemm));
    CHECK_CUDA(cudaEventSynchronize(s.stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, s.start, s.stop));
    samples.push_back(ms / reps);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// One overlapped repetition: both parts start together and the repetition ends when both have.
void overlapped_pair(Streams& s, LayerGemms& gemms, const Attention& attention, int gemm_sms,
                     int attention_blocks) {
  CHECK_CUDA(cudaEventRecord(s.fork, s.gemm));
  CHECK_CUDA(cudaStreamWaitEvent(s.attention, s.fork));
  gemms.launch(gemm_sms, s.gemm);
  attention.launch(attention_blocks, s.attention);
  CHECK_CUDA(cudaEventRecord(s.join, s.attention));
  CHECK_CUDA(cudaStreamWaitEvent(s.gemm, s.join));
}

// The fastest overlapped pair over the SM splits tried: its time, and the memory part's SMs
// (-1 when no split could be made).
struct BestPair {
  double ms = 1e30;
  int memory_sms = -1;
};

const int kAttentionSmShares[] = {0, 8, 16, 24, 32, 40, 48, 64, 80, 96};
constexpr int kReps = 10, kTrials = 5;

// Plain streams: the memory part's grid sized to a share of the SMs and cuBLASLt told to expect
// the rest. Share 0: both kernels on the whole device, as plain streams launch them.
BestPair best_on_streams(Streams& s, LayerGemms& gemms, const Attention& attention, int sms,
                         int blocks_per_sm, double ratio) {
  const char* kernel = kernel_name(attention.kernel);
  BestPair best;
  for (int share : kAttentionSmShares) {
    const int gemm_sms = share == 0 ? 0 : sms - share;
    const int blocks = (share == 0 ? sms : share) * blocks_per_sm;
    const double ms = median_ms(s, kReps, kTrials,
                                [&] { overlapped_pair(s, gemms, attention, gemm_sms, blocks); });
    const double gemm_alone = median_ms(s, 3, 3, [&] { gemms.launch(gemm_sms, s.gemm); });
    const double memory_alone = median_ms(s, 3, 3, [&] { attention.launch(blocks, s.gemm); });
    std::printf(
        "{\"kernel\":\"%s\",\"ratio\":%.2f,\"attention_sms\":%d,"
        "\"overlapped_ms\":%.4f,\"gemm_alone_ms\":%.4f,\"memory_alone_ms\":%.4f}\n",
        kernel, ratio, share, ms, gemm_alone, memory_alone);
    if (ms < best.ms) best = {ms, share};
  }
  return best;
}

// Green-context splits: each part's stream runs on its own SMs only.
BestPair best_on_green_splits(Streams& s, LayerGemms& gemms, const Attention& attention,
                              int blocks_per_sm, double ratio) {
  const char* kernel = kernel_name(attention.kernel);
  BestPair best;
  for (int share : kAttentionSmShares) {
    GreenSplit split;
    if (share == 0 || !make_green_split(share, split)) continue;
    Streams g = s;
    g.gemm = split.gemm;
    g.attention = split.memory;
    const int blocks = split.memory_sms * blocks_per_sm;
    const double ms = median_ms(
        g, kReps, kTrials, [&] { overlapped_pair(g, gemms, attention, split.gemm_sms, blocks); });
    const double gemm_alone = median_ms(g, 3, 3, [&] { gemms.launch(split.gemm_sms, g.gemm); });
    Streams m = s;
    m.gemm = split.memory;
    const double memory_alone = median_ms(m, 3, 3, [&] { attention.launch(blocks, m.gemm); });
    std::printf(
        "{\"kernel\":\"%s\",\"ratio\":%.2f,\"green_memory_sms\":%d,"
        "\"green_gemm_sms\":%d,\"overlapped_ms\":%.4f,\"gemm_alone_ms\":%.4f,"
        "\"memory_alone_ms\":%.4f}\n",
        kernel, ratio, split.memory_sms, split.gemm_sms, ms, gemm_alone, memory_alone);
    if (ms < best.ms) best = {ms, split.memory_sms};
    CHECK_CUDA(cudaDeviceSynchronize());
    free_green_split(split);
  }
  return best;
}

// The interference of each ratio, and their least-squares fit and spread.
struct InterferenceFit {
  std::vector<double> values;
  double numerator = 0, denominator = 0;

  double add(double overlapped_ms, double longer_ms, double shorter_ms) {
    values.push_back((overlapped_ms - longer_ms) / shorter_ms);
    numerator += (overlapped_ms - longer_ms) * shorter_ms;
    denominator += shorter_ms * shorter_ms;
    return values.back();
  }
  void print(const char* kernel, const char* fit) const {
    if (values.empty()) return;
    std::vector<double> sorted = values;
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "{\"kernel\":\"%s\",\"fit\":\"%s\",\"least_squares\":%.3f,\"median\":%.3f,"
        "\"min\":%.3f,\"max\":%.3f}\n",
        kernel, fit, numerator / denominator, sorted[sorted.size() / 2], sorted.front(),
        sorted.back());
  }
};

// The alone times, the overlapped pairs over SM splits, and the fitted interference for one
// memory-part kernel.
void measure(Streams& s, LayerGemms& gemms, double gemm_ms, int sms, int requests,
             MemoryKernel memory, bool green) {
  const char* kernel = kernel_name(memory);
  const int sm_blocks = blocks_per_sm(memory);
  // Bandwidth on a reference size, then contexts that make memory part / GEMMs these ratios.
  double bytes_per_ms = 0;
  {
    Attention probe = make_attention(requests, 2048, memory);
    const double ms = median_ms(s, kReps, kTrials, [&] { probe.launch(sms * sm_blocks, s.gemm); });
    bytes_per_ms = probe.kv_bytes() / ms;
    std::printf(
        "{\"kernel\":\"%s\",\"blocks_per_sm\":%d,\"context\":2048,\"ms\":%.4f,"
        "\"gb_per_s\":%.1f,\"of_peak\":%.3f}\n",
        kernel, sm_blocks, ms, bytes_per_ms / 1e6, bytes_per_ms * 1e3 / peak_bytes_per_second);
    free_attention(probe);
  }

  InterferenceFit fit;
  for (double ratio : {0.25, 0.5, 1.0, 2.0, 4.0}) {
    const double want_bytes = ratio * gemm_ms * bytes_per_ms;
    int context = static_cast<int>(want_bytes / (requests * double(kKvHeads) * kHeadDim * 4));
    context = std::max(kContextStep, context / kContextStep * kContextStep);
    Attention attention = make_attention(requests, context, memory);
    const double attention_ms =
        median_ms(s, kReps, kTrials, [&] { attention.launch(sms * sm_blocks, s.gemm); });
    const BestPair best = green ? best_on_green_splits(s, gemms, attention, sm_blocks, ratio)
                                : best_on_streams(s, gemms, attention, sms, sm_blocks, ratio);
    free_attention(attention);
    if (best.memory_sms < 0) continue;
    const double longer = std::max(gemm_ms, attention_ms);
    const double shorter = std::min(gemm_ms, attention_ms);
    const double interference = fit.add(best.ms, longer, shorter);
    const double gain = (gemm_ms + attention_ms) / best.ms;
    if (green) {
      std::printf(
          "{\"kernel\":\"%s\",\"ratio\":%.2f,\"green_best_overlapped_ms\":%.4f,"
          "\"green_best_memory_sms\":%d,\"green_interference\":%.3f,"
          "\"green_gain_over_sequential\":%.3f}\n",
          kernel, ratio, best.ms, best.memory_sms, interference, gain);
    } else {
      std::printf(
          "{\"kernel\":\"%s\",\"ratio\":%.2f,\"context\":%d,\"gemm_ms\":%.4f,"
          "\"memory_ms\":%.4f,\"sequential_ms\":%.4f,\"best_overlapped_ms\":%.4f,"
          "\"best_attention_sms\":%d,\"interference\":%.3f,"
          "\"gain_over_sequential\":%.3f}\n",
          kernel, ratio, context, gemm_ms, attention_ms, gemm_ms + attention_ms, best.ms,
          best.memory_sms, interference, gain);
    }
  }
  fit.print(kernel, green ? "green_overlap_interference" : "overlap_interference");
}

}  // namespace

int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int requests = argc > 2 ? std::atoi(argv[2]) : 256;
  // "green": split the SMs with green contexts; otherwise limit grids on plain streams.
  const bool green = argc > 3 && std::string(argv[3]) == "green";
  // Which memory kernels to measure: a comma-separated list of their names (default: all).
  const std::string kernels = argc > 4 ? "," + std::string(argv[4]) + "," : "";
  auto wanted = [&](const char* name) {
    return kernels.empty() || kernels.find("," + std::string(name) + ",") != std::string::npos;
  };
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  if (std::string(prop.name).find("H200") != std::string::npos) peak_bytes_per_second = 4800e9;
  std::printf("{\"device\":\"%s\",\"sms\":%d,\"gemm_tokens\":%d,\"requests\":%d}\n", prop.name, sms,
              tokens, requests);
  for (MemoryKernel kernel : {MemoryKernel::kCudaCores, MemoryKernel::kTensorCores})
    check_attention(kernel, sms * 2);

  cublasLtHandle_t handle;
  CHECK_CUBLAS(cublasLtCreate(&handle));
  Streams s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s.gemm, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s.attention, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&s.start, &s.stop, &s.fork, &s.join}) CHECK_CUDA(cudaEventCreate(e));
  {
    LayerGemms gemms(handle, tokens);
    const double gemm_ms = median_ms(s, 10, 5, [&] { gemms.launch(0, s.gemm); });
    std::printf("{\"part\":\"gemm\",\"ms\":%.4f,\"tflops\":%.1f,\"of_peak\":%.3f}\n", gemm_ms,
                gemms.flops() / gemm_ms / 1e9, gemms.flops() / gemm_ms / 1e-3 / kPeakFlops);
    for (MemoryKernel memory :
         {MemoryKernel::kCudaCores, MemoryKernel::kTensorCores, MemoryKernel::kStream})
      if (wanted(kernel_name(memory))) measure(s, gemms, gemm_ms, sms, requests, memory, green);
  }
  cublasLtDestroy(handle);
  return 0;
}
