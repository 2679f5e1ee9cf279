// Sampling where the logits are (kernels.h draw_rows): each row's argmax, or its plain
// temperature draw computed with the host sampler's own arithmetic (sampling/plain_draw.h), so
// a step's rows never leave the GPU as vocabulary-wide logits. Without it a temperature-1 step
// of 164 rows moved 84 MB of logits to the host and sampled them there; on a Table 2 trace mix
// (1,000 requests) that was the gap between the cost model (greedy) and the real run.
//
// One block of 256 threads per row: (1) the row's maximum, its lowest id holding it (the host
// sampler's tie rule) and whether it holds a NaN or +inf; (2) for a temperature row, the eight lane
// sums of every 256-token block, one (block, lane) pair per thread at a time, then the block sums;
// (3) thread 0 adds the block sums in order and walks to the draw (draw_pick), as the host does.
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "sampling/plain_draw.h"

namespace blend::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    draw_kernel(const float* logits, int64_t vocab, const float* inv_temperatures,
                const double* uniforms, int32_t* tokens, int32_t* flags) {
  extern __shared__ float smem[];  // [blocks][kDrawLanes] lane sums, then [blocks] block sums
  __shared__ float best_s[kThreads / 32];
  __shared__ int32_t id_s[kThreads / 32];
  __shared__ int32_t bad_s;
  __shared__ float max_s;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const float inv_t = inv_temperatures ? inv_temperatures[blockIdx.x] : 0.0f;
  if (threadIdx.x == 0) bad_s = 0;
  __syncthreads();

  float best = -INFINITY;
  int32_t id = INT32_MAX;
  bool bad = false;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = row[i];
    bad |= !(v <= 3.402823466e38f);  // NaN or +inf: the host sampler sanitizes such a row
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
    for (int w = 1; w < kThreads / 32; ++w)
      if (best_s[w] > best || (best_s[w] == best && id_s[w] < id)) {
        best = best_s[w];
        id = id_s[w];
      }
    // A row of -inf only has no maximum: flagged for the host too.
    if (id == INT32_MAX || !(best > -INFINITY)) bad_s = 1;
    max_s = best;
    tokens[blockIdx.x] = id == INT32_MAX ? 0 : id;
    flags[blockIdx.x] = bad_s;
  }
  __syncthreads();
  if (inv_t == 0.0f || bad_s) return;  // greedy (the argmax above), or the host decides

  const float max = max_s;
  const int64_t blocks = (vocab + kDrawBlock - 1) / kDrawBlock;
  float* lanes = smem;
  float* sums = smem + blocks * kDrawLanes;
  for (int64_t p = threadIdx.x; p < blocks * kDrawLanes; p += kThreads)
    lanes[p] =
        draw_lane_sum(row, vocab, p / kDrawLanes, static_cast<int>(p % kDrawLanes), max, inv_t);
  __syncthreads();
  for (int64_t b = threadIdx.x; b < blocks; b += kThreads)
    sums[b] = draw_block_sum(lanes + b * kDrawLanes);
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t pick = draw_pick(row, vocab, sums, blocks, max, inv_t, uniforms[blockIdx.x]);
    tokens[blockIdx.x] = static_cast<int32_t>(pick < vocab ? pick : 0);
    flags[blockIdx.x] = pick < vocab ? 0 : 1;
  }
}

}  // namespace

namespace {

size_t shared_bytes(int64_t vocab) {
  const int64_t blocks = (vocab + kDrawBlock - 1) / kDrawBlock;
  return static_cast<size_t>(blocks) * (kDrawLanes + 1) * sizeof(float);
}

}  // namespace

bool draw_fits(int64_t vocab) {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess)
    return false;
  return shared_bytes(vocab) <= static_cast<size_t>(optin);  // 227 KB on an H100: 1.6M tokens
}

void draw_rows(const float* logits, int64_t rows, int64_t vocab, const float* inv_temperatures,
               const double* uniforms, int32_t* tokens, int32_t* flags, cudaStream_t stream) {
  if (rows == 0) return;
  const size_t smem = inv_temperatures ? shared_bytes(vocab) : 0;  // argmaxes need none
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(draw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  draw_kernel<<<static_cast<unsigned>(rows), kThreads, smem, stream>>>(
      logits, vocab, inv_temperatures, uniforms, tokens, flags);
  check_launch("draw_rows");
}

}  // namespace blend::cuda
