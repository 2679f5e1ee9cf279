// Sampling where the logits are (kernels.h draw_rows): each row's argmax, its temperature draw
// with or without the top-k / top-p / min-p cuts, and its logprobs, computed with the host
// sampler's own arithmetic (sampling/plain_draw.h, sampling/cut_select.h), so a step's rows never
// leave the GPU as vocabulary-wide logits. Without it a temperature-1 step of 164 rows moved
// 84 MB of logits to the host and sampled them there; on a Table 2 trace mix (1,000 requests)
// that was the gap between the cost model (greedy) and the real run.
//
// One block of 256 threads per row:
// (1) the row's maximum, its lowest id holding it (the host sampler's tie rule) and whether it
//     holds a NaN or +inf (then the host decides);
// (2) for logprobs, the temperature-1 weights' block sums and total (the host adds the log), and
//     the n most likely tokens by a rank cut of budget n;
// (3) for a draw, the cuts: min-p by weight, then top-k and top-p as radix selections over the
//     logits' rank keys (cut_select.h: each pass histograms the candidates in shared memory,
//     thread 0 chooses the bin; ties at the last key are kept in id order by a block scan);
// (4) the eight lane sums of every 256-token block of the kept tokens' weights (the dropped ones
//     weigh 0), the block sums, and thread 0's walk to the draw (draw_pick), as the host does.
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "sampling/cut_select.h"
#include "sampling/plain_draw.h"

namespace blend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// What a row's threads share besides the dynamic arrays (lane sums, or a radix pass's bins).
struct RowShared {
  float best[kWarps];
  int32_t id[kWarps];
  unsigned long long u64[kWarps];
  int32_t bad;
  float max;
  int32_t bin;
  uint32_t ties;
  unsigned long long above;
  long long last;
  int32_t top_count;
  int32_t top_id[kMaxDeviceLogprobs];
  float top_logit[kMaxDeviceLogprobs];
};

// Sum over the block; every thread gets it.
__device__ uint64_t block_sum_u64(uint64_t v, RowShared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh.u64[warp] = v;
  __syncthreads();
  uint64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += sh.u64[w];
  __syncthreads();
  return total;
}

// Inclusive scan over the block in thread order; `*total` gets the block's sum.
__device__ uint64_t block_scan_u64(uint64_t v, RowShared& sh, uint64_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) sh.u64[warp] = v;
  __syncthreads();
  uint64_t before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? sh.u64[w] : 0;
    all += sh.u64[w];
  }
  __syncthreads();
  *total = all;
  return before + v;
}

// Weights: every token 1 (top-k's and the top logprobs' rank), or its fixed-point draw weight.
struct Unit {
  __device__ uint64_t operator()(int64_t) const { return 1; }
};

// Every token is a candidate (the top logprobs rank the whole row).
struct AnyToken {
  __device__ bool operator()(int64_t) const { return true; }
};

// A candidate of a cut draw: weight at least the min-p floor (and above 0), and kept by the
// top-k and top-p cuts found so far (the defaults keep every token).
struct CutCandidate {
  const float* row;
  float max, inv_t, floor;
  RankCut top_k, top_p;
  __device__ float weight(int64_t i) const { return draw_weight(row[i], max, inv_t); }
  __device__ bool operator()(int64_t i) const {
    const float w = weight(i);
    if (!(w >= floor && w > 0.0f)) return false;
    const uint32_t key = rank_key(row[i]);
    return rank_kept(top_k, key, i) && rank_kept(top_p, key, i);
  }
};
struct CutMass {
  const CutCandidate* c;
  __device__ uint64_t operator()(int64_t i) const { return fixed_mass(c->weight(i)); }
};
// The draw weight of the tokens a cut draw keeps; 0 for the rest.
struct CutWeight {
  CutCandidate c;
  __device__ float operator()(int64_t i) const { return c(i) ? c.weight(i) : 0.0f; }
};

// The rank cut (cut_select.h) of the candidates under `budget` of weight. `count` and `mass`
// are kRadixBins each in shared memory.
template <class Candidate, class Weight>
__device__ RankCut select_ranked(const float* row, int64_t vocab, const Candidate& candidate,
                                 const Weight& weight, uint64_t budget, uint32_t* count,
                                 unsigned long long* mass, RowShared& sh) {
  uint32_t prefix = 0;
  uint64_t above = 0;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    const int bins = 1 << radix_bits(pass);
    for (int b = threadIdx.x; b < bins; b += kThreads) {
      count[b] = 0;
      mass[b] = 0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      if (!candidate(i)) continue;
      const uint32_t key = rank_key(row[i]);
      if (!radix_matches(key, prefix, pass)) continue;
      const int d = radix_digit(key, pass);
      atomicAdd(&count[d], 1u);
      atomicAdd(&mass[d], static_cast<unsigned long long>(weight(i)));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t a = above;
      const int bin = radix_choose(count, mass, bins, budget, &a);
      sh.bin = bin;
      sh.above = a;
      sh.ties = count[bin];
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(sh.bin) << radix_shift(pass);
    above = sh.above;
  }
  RankCut cut;
  cut.key = prefix;
  if (sh.ties > 1) {  // tied on the key: kept in id order while the weight before stays under
    __syncthreads();
    if (threadIdx.x == 0) sh.last = -1;
    __syncthreads();
    uint64_t carry = above;
    for (int64_t tile = 0; tile < vocab && carry < budget; tile += kThreads) {
      const int64_t i = tile + threadIdx.x;
      const bool tie = i < vocab && candidate(i) && rank_key(row[i]) == prefix;
      const uint64_t f = tie ? weight(i) : 0;
      uint64_t tile_total;
      const uint64_t inclusive = block_scan_u64(f, sh, &tile_total);
      if (tie && carry + (inclusive - f) < budget) atomicMax(&sh.last, static_cast<long long>(i));
      carry += tile_total;
    }
    __syncthreads();
    cut.last_id = sh.last;
  }
  __syncthreads();
  return cut;
}

// The block sums of a row weighing weight(i): `lanes` holds blocks x kDrawLanes lane sums, then
// the blocks' sums.
template <class Weight>
__device__ const float* row_block_sums(const Weight& weight, int64_t vocab, float* lanes) {
  const int64_t blocks = (vocab + kDrawBlock - 1) / kDrawBlock;
  float* sums = lanes + blocks * kDrawLanes;
  for (int64_t p = threadIdx.x; p < blocks * kDrawLanes; p += kThreads)
    lanes[p] = draw_lane_sum(weight, vocab, p / kDrawLanes, static_cast<int>(p % kDrawLanes));
  __syncthreads();
  for (int64_t b = threadIdx.x; b < blocks; b += kThreads)
    sums[b] = draw_block_sum(lanes + b * kDrawLanes);
  __syncthreads();
  return sums;
}

// Counts the candidates over the block.
template <class Candidate>
__device__ uint64_t count_candidates(int64_t vocab, const Candidate& candidate, RowShared& sh) {
  uint64_t n = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) n += candidate(i) ? 1 : 0;
  return block_sum_u64(n, sh);
}

// kFull: rows may ask for cuts or logprobs (the radix bins share the dynamic memory with the
// lane sums); otherwise argmaxes and plain draws only.
template <bool kFull>
__global__ void __launch_bounds__(kThreads)
    draw_kernel(const float* logits, int64_t vocab, const DeviceDraw* params, DrawResult* results,
                int32_t* top_ids, float* top_logits) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ RowShared sh;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const DeviceDraw p = params ? params[blockIdx.x] : DeviceDraw{};
  DrawResult* result = results + blockIdx.x;
  if (threadIdx.x == 0) sh.bad = 0;
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
  if (bad) sh.bad = 1;
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
    sh.best[warp] = best;
    sh.id[warp] = id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w)
      if (sh.best[w] > best || (sh.best[w] == best && sh.id[w] < id)) {
        best = sh.best[w];
        id = sh.id[w];
      }
    // A row of -inf only has no maximum: flagged for the host too.
    if (id == INT32_MAX || !(best > -INFINITY)) sh.bad = 1;
    sh.max = best;
    result->token = id == INT32_MAX ? 0 : id;
    result->flag = sh.bad;
    result->max = best;
  }
  __syncthreads();
  if (sh.bad) return;  // the host decides
  const float max = sh.max;
  int64_t token = result->token;  // the argmax, unless a draw below picks another
  __syncthreads();
  float* lanes = reinterpret_cast<float*>(smem);
  auto* mass = reinterpret_cast<unsigned long long*>(smem);
  auto* count = reinterpret_cast<uint32_t*>(smem + kRadixBins * sizeof(unsigned long long));
  const int64_t blocks = (vocab + kDrawBlock - 1) / kDrawBlock;

  if (kFull && p.logprobs >= 0) {
    const float* sums = row_block_sums(PlainWeight{row, max, 1.0f}, vocab, lanes);
    if (threadIdx.x == 0) result->total = draw_total(sums, blocks);
    __syncthreads();
    const int n = static_cast<int>(p.logprobs < vocab ? p.logprobs : vocab);
    if (n > 0) {
      const RankCut cut =
          select_ranked(row, vocab, AnyToken{}, Unit{}, static_cast<uint64_t>(n), count, mass, sh);
      if (threadIdx.x == 0) sh.top_count = 0;
      __syncthreads();
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
        if (rank_kept(cut, rank_key(row[i]), i)) {
          const int slot = atomicAdd(&sh.top_count, 1);
          if (slot < kMaxDeviceLogprobs) {
            sh.top_id[slot] = static_cast<int32_t>(i);
            sh.top_logit[slot] = row[i];
          }
        }
      __syncthreads();
      if (threadIdx.x == 0) {  // at most 20: sorted by rank, as the host's partial_sort
        const int kept = sh.top_count < kMaxDeviceLogprobs ? sh.top_count : kMaxDeviceLogprobs;
        for (int a = 1; a < kept; ++a)
          for (int b = a; b > 0; --b) {
            const float lb = sh.top_logit[b], la = sh.top_logit[b - 1];
            if (!(lb > la || (lb == la && sh.top_id[b] < sh.top_id[b - 1]))) break;
            sh.top_logit[b] = la;
            sh.top_logit[b - 1] = lb;
            const int32_t t = sh.top_id[b];
            sh.top_id[b] = sh.top_id[b - 1];
            sh.top_id[b - 1] = t;
          }
        for (int j = 0; j < kept; ++j) {
          top_ids[blockIdx.x * kMaxDeviceLogprobs + j] = sh.top_id[j];
          top_logits[blockIdx.x * kMaxDeviceLogprobs + j] = sh.top_logit[j];
        }
        if (sh.top_count != n) result->flag = 1;  // not reached: the keys rank strictly
      }
      __syncthreads();
    }
  }

  const float inv_t = p.inv_temperature;
  if (inv_t != 0.0f) {
    const bool cuts = kFull && (p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f);
    if (!cuts) {
      const PlainWeight weight{row, max, inv_t};
      const float* sums = row_block_sums(weight, vocab, lanes);
      if (threadIdx.x == 0) token = draw_pick(weight, vocab, sums, blocks, p.uniform);
    } else {
      CutCandidate c{row, max, inv_t, p.min_p < 1.0f ? p.min_p : 1.0f, RankCut{}, RankCut{}};
      if (p.top_k > 0 && count_candidates(vocab, c, sh) > static_cast<uint64_t>(p.top_k))
        c.top_k =
            select_ranked(row, vocab, c, Unit{}, static_cast<uint64_t>(p.top_k), count, mass, sh);
      if (p.top_p < 1.0f) {
        const CutMass m{&c};
        uint64_t total = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads) total += c(i) ? m(i) : 0;
        total = block_sum_u64(total, sh);
        c.top_p = select_ranked(row, vocab, c, m, top_p_budget(p.top_p, total), count, mass, sh);
      }
      const CutWeight weight{c};
      const float* sums = row_block_sums(weight, vocab, lanes);
      if (threadIdx.x == 0) token = draw_pick(weight, vocab, sums, blocks, p.uniform);
    }
  }
  if (threadIdx.x == 0) {
    if (token >= vocab) {  // no token of weight: not reached for a row with a maximum
      result->flag = 1;
      token = 0;
    }
    result->token = static_cast<int32_t>(token);
    result->token_logit = row[token];
  }
}

// Dynamic shared memory: the lane and block sums of a row, and for the full kernel the radix
// bins, which reuse it.
size_t shared_bytes(int64_t vocab, bool full) {
  const int64_t blocks = (vocab + kDrawBlock - 1) / kDrawBlock;
  const size_t lanes = static_cast<size_t>(blocks) * (kDrawLanes + 1) * sizeof(float);
  const size_t bins = kRadixBins * (sizeof(unsigned long long) + sizeof(uint32_t));
  return full && bins > lanes ? bins : lanes;
}

}  // namespace

bool draw_fits(int64_t vocab) {
  int device = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess)
    return false;
  // 227 KB on an H100: 1.6M tokens, with the row's static share beside it.
  return shared_bytes(vocab, true) + sizeof(RowShared) <= static_cast<size_t>(optin);
}

void draw_rows(const float* logits, int64_t rows, int64_t vocab, const DeviceDraw* params,
               bool full, DrawResult* results, int32_t* top_ids, float* top_logits,
               cudaStream_t stream) {
  if (rows == 0) return;
  const size_t smem = params ? shared_bytes(vocab, full) : 0;  // argmaxes need none
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024)
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
    kernel<<<static_cast<unsigned>(rows), kThreads, smem, stream>>>(logits, vocab, params, results,
                                                                    top_ids, top_logits);
  };
  if (full && params)
    launch(draw_kernel<true>);
  else
    launch(draw_kernel<false>);
  check_launch("draw_rows");
}

}  // namespace blend::cuda
