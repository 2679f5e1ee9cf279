#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "core/multiversion.h"
#include "sampling/plain_draw.h"

namespace blend {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One branch-free pass over a row: its largest value (NaN skipped), and whether it holds a NaN
// or +inf (a broken model or checkpoint: such rows are sanitised before anything compares or
// exponentiates them).
struct RowScan {
  float max = -std::numeric_limits<float>::infinity();
  bool nan_or_inf = false;
};

// The hot loops below run over whole vocabulary rows for every sampled token (on a small model
// they are a third of a job: docs/BENCHMARKS.md, "Sampling on a 128K vocabulary"), so each is
// written in kLanes independent lanes that every ISA vectorises and compiled per ISA.
constexpr size_t kLanes = 8;

BLEND_MULTIVERSION
bool scan_lanes(const float* l, size_t n, float* max_out) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  Floats8 m = Floats8{} + kNegInf;
  Ints8 bad = {};
  const Ints8 magnitude = Ints8{} + 0x7fffffff, inf = Ints8{} + 0x7f800000;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Floats8 x;
    std::memcpy(&x, l + i, sizeof x);
    const Ints8 greater = x > m;  // all ones where x > m (never for NaN)
    m = (Floats8)(((Ints8)x & greater) | ((Ints8)m & ~greater));
    // NaN (magnitude above +inf's, either sign) or +inf, by the bits.
    const Ints8 u = (Ints8)x;
    bad |= ((u & magnitude) > inf) | (u == inf);
  }
  float best = kNegInf;
  bool any = false;
  for (int j = 0; j < 8; ++j) {
    best = m[j] > best ? m[j] : best;  // max is exact: the lanes' order cannot change it
    any |= bad[j] != 0;
  }
  for (; i < n; ++i) {
    best = l[i] > best ? l[i] : best;
    any |= !(l[i] <= std::numeric_limits<float>::max());
  }
  *max_out = best;
  return any;
}

RowScan scan_row(std::span<const float> logits) {
  RowScan r;
  r.nan_or_inf = scan_lanes(logits.data(), logits.size(), &r.max);
  return r;
}

// w[i] = exp((l[i] - max) * inv_t), every l[i] <= max, by draw_weight (sampling/plain_draw.h:
// a branch-free exp whose multiply-adds are fused by name, so that the loop vectorises and every
// ISA, build and the GPU round alike; a -inf logit weighs exactly 0).
BLEND_MULTIVERSION
void exp_row(const float* l, float* w, size_t n, float max, float inv_t) {
  for (size_t i = 0; i < n; ++i) w[i] = draw_weight(l[i], max, inv_t);
}

// w[k] = draw_weight(l[ids[k]]), as exp_row rounds it.
BLEND_MULTIVERSION
void exp_gather(const float* l, const TokenId* ids, float* w, size_t n, float max, float inv_t) {
  for (size_t k = 0; k < n; ++k) w[k] = draw_weight(l[static_cast<size_t>(ids[k])], max, inv_t);
}

// Sums of w over blocks of kBlock tokens, each block in kLanes lanes added in a fixed order: the
// same bits every time on one machine, whatever else is in the batch.
constexpr size_t kBlock = 256;
BLEND_MULTIVERSION
void block_sums(const float* w, size_t n, float* sums) {
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    float lane[kLanes] = {};
    size_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) lane[j] += w[i + j];
    for (; i < e; ++i) lane[0] += w[i];
    float block = 0;
    for (size_t j = 0; j < kLanes; ++j) block += lane[j];
    sums[b / kBlock] = block;
  }
}

// The row's total weight from its block sums, added in double.
double blocked_total(const float* w, size_t n, std::vector<float>& sums) {
  sums.resize((n + kBlock - 1) / kBlock);
  block_sums(w, n, sums.data());
  double total = 0;
  for (float s : sums) total += s;
  return total;
}

// The lowest id holding `max` (ties go to the lowest id, so greedy decoding is reproducible).
TokenId first_at(std::span<const float> logits, float max) {
  size_t i = 0;
  while (i + 1 < logits.size() && logits[i] != max) ++i;
  return static_cast<TokenId>(i);
}

bool more_likely(std::span<const float> logits, TokenId a, TokenId b) {
  const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
  return la > lb || (la == lb && a < b);
}

bool has_processing(const SamplingParams& p, const uint64_t* allowed) {
  return allowed || !p.logit_bias.empty() || p.presence_penalty != 0.0f ||
         p.frequency_penalty != 0.0f || p.repetition_penalty != 1.0f;
}

// The logits the draw reads: logit_bias added, then the repetition penalty over prompt and
// output tokens (vLLM / HF: positive logits divided by it, negative ones multiplied), then
// OpenAI's frequency and presence penalties over the output tokens; NaN made -inf and +inf the
// largest float. Returns `logits` itself when none of that applies.
std::span<const float> processed_logits(std::span<const float> logits, const SamplingParams& p,
                                        const TokenHistory& history, bool sanitize,
                                        const uint64_t* allowed, std::vector<float>& buf) {
  if (!sanitize && !has_processing(p, allowed)) return logits;
  if (allowed) {
    // Structured output: tokens the grammar does not allow are impossible, before anything
    // else looks at the row (their logprobs are those of the masked distribution). Copy and
    // mask are one pass, a 64-token word at a time: a grammar usually allows either almost
    // nothing (structure) or almost everything (string content), so most words are all-zero
    // (filled, the logits never read) or all-one (copied).
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    buf.resize(logits.size());
    const float* src = logits.data();
    float* dst = buf.data();
    const size_t n = logits.size();
    for (size_t base = 0; base < n; base += 64) {
      const uint64_t bits = allowed[base / 64];
      const size_t count = std::min<size_t>(64, n - base);
      if (bits == 0) {
        std::fill(dst + base, dst + base + count, kNever);
      } else if (bits == ~uint64_t{0}) {
        std::copy(src + base, src + base + count, dst + base);
      } else {
        for (size_t j = 0; j < count; ++j)
          dst[base + j] = ((bits >> j) & 1) ? src[base + j] : kNever;
      }
    }
  } else {
    buf.assign(logits.begin(), logits.end());
  }
  if (sanitize) {
    for (float& x : buf) {
      if (std::isnan(x))
        x = -std::numeric_limits<float>::infinity();
      else if (x > std::numeric_limits<float>::max())
        x = std::numeric_limits<float>::max();
    }
  }
  for (const auto& [token, bias] : p.logit_bias) buf[static_cast<size_t>(token)] += bias;
  thread_local std::vector<TokenId> seen;
  if (p.repetition_penalty != 1.0f) {
    seen.assign(history.prompt.begin(), history.prompt.end());
    seen.insert(seen.end(), history.output.begin(), history.output.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (TokenId t : seen) {
      float& x = buf[static_cast<size_t>(t)];
      x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    seen.assign(history.output.begin(), history.output.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      size_t j = i;
      while (j < seen.size() && seen[j] == seen[i]) ++j;
      buf[static_cast<size_t>(seen[i])] -=
          p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
      i = j;
    }
  }
  return buf;
}

// The unrestricted temperature draw or the argmax of a masked row over its allowed tokens only
// (structured output allows a few dozen of a 128K vocabulary). A disallowed token's logit is
// -inf in the dense path and weighs exactly 0 there: it adds exactly 0 to its lane, its block
// and the total, and is never picked. So the sums, the total and the walk below are the dense
// path's, and so is the token. Nothing when the dense path must run: logprobs, a bias or a
// penalty, a top-k / top-p / min-p cut, a NaN or +inf among the allowed logits, or a mask that
// allows too much to gain from.
std::optional<SampledToken> sample_masked_sparse(std::span<const float> logits,
                                                 const SamplingParams& params, uint64_t seed,
                                                 int64_t step, const uint64_t* allowed) {
  const size_t vocab = logits.size();
  const bool greedy = params.temperature < kGreedyTemperature || params.top_k == 1;
  if (params.logprobs ||
      (!greedy && (params.top_k > 0 || params.min_p > 0.0f || params.top_p < 1.0f)))
    return std::nullopt;
  thread_local std::vector<TokenId> ids;
  ids.clear();
  for (size_t word = 0; word * 64 < vocab; ++word)
    for (uint64_t bits = allowed[word]; bits != 0; bits &= bits - 1) {
      const size_t t = word * 64 + static_cast<size_t>(std::countr_zero(bits));
      if (t < vocab) ids.push_back(static_cast<TokenId>(t));
      if (ids.size() > vocab / 8) return std::nullopt;  // as cheap to go dense
    }
  float max = -std::numeric_limits<float>::infinity();
  for (TokenId t : ids) {
    const float x = logits[static_cast<size_t>(t)];
    if (!(x <= std::numeric_limits<float>::max())) return std::nullopt;  // NaN or +inf
    max = x > max ? x : max;
  }
  SampledToken out;
  if (!(max > -std::numeric_limits<float>::infinity())) {
    out.invalid = true;  // nothing to draw from, as the dense path says
    return out;
  }
  if (greedy) {  // the lowest id holding the maximum
    for (TokenId t : ids)
      if (logits[static_cast<size_t>(t)] == max) {
        out.token = t;
        return out;
      }
  }
  thread_local std::vector<float> w;
  w.resize(ids.size());
  exp_gather(logits.data(), ids.data(), w.data(), ids.size(), max, 1.0f / params.temperature);
  // Each non-empty block's sum, as block_sums adds it: lane j holds the block's tokens j, j + 8,
  // ... (its tail past the last group of eight in lane 0), in id order; lanes added in order.
  struct Block {
    size_t first_id, end_id;  // its allowed tokens: ids[first_id, end_id)
    float sum;
  };
  thread_local std::vector<Block> blocks;
  blocks.clear();
  double total = 0;
  for (size_t k = 0; k < ids.size();) {
    const size_t first = static_cast<size_t>(ids[k]) / kBlock * kBlock;
    const size_t end = std::min(vocab, first + kBlock);
    const size_t whole = first + (end - first) / kLanes * kLanes;
    float lane[kLanes] = {};
    const size_t begin = k;
    for (; k < ids.size() && static_cast<size_t>(ids[k]) < end; ++k) {
      const auto t = static_cast<size_t>(ids[k]);
      lane[t < whole ? (t - first) % kLanes : 0] += w[k];
    }
    float sum = 0;
    for (size_t j = 0; j < kLanes; ++j) sum += lane[j];
    blocks.push_back({begin, k, sum});
    total += sum;
  }
  const double u = sampling_uniform(seed, step) * total;
  double acc = 0;
  for (const Block& b : blocks) {
    if (u >= acc + b.sum) {
      acc += b.sum;
      continue;
    }
    double run = acc;
    for (size_t k = b.first_id; k < b.end_id; ++k) {
      run += w[k];
      if (u < run && w[k] > 0.0f) {
        out.token = ids[k];
        return out;
      }
    }
    for (size_t k = b.end_id; k-- > b.first_id;)
      if (w[k] > 0.0f) {
        out.token = ids[k];
        return out;
      }
  }
  for (size_t k = ids.size(); k-- > 0;)  // u past the total by rounding
    if (w[k] > 0.0f) {
      out.token = ids[k];
      return out;
    }
  return std::nullopt;  // not reached: the maximum weighs 1
}

}  // namespace

double sampling_uniform(uint64_t seed, int64_t step) {
  const uint64_t r = mix(mix(seed) ^ static_cast<uint64_t>(step));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

void temperature_weights(std::span<const float> logits, float max, float inv_t,
                         std::span<float> out) {
  exp_row(logits.data(), out.data(), std::min(logits.size(), out.size()), max, inv_t);
}

SampledToken sample_token(std::span<const float> raw_logits, const SamplingParams& params,
                          uint64_t seed, int64_t step, const TokenHistory& history,
                          const uint64_t* allowed) {
  if (allowed && !has_processing(params, nullptr))  // the mask alone
    if (std::optional<SampledToken> sparse =
            sample_masked_sparse(raw_logits, params, seed, step, allowed))
      return *sparse;
  SampledToken out;
  thread_local std::vector<float> processed;
  RowScan scan = scan_row(raw_logits);
  const std::span<const float> logits =
      processed_logits(raw_logits, params, history, scan.nan_or_inf, allowed, processed);
  if (logits.data() != raw_logits.data()) scan = scan_row(logits);
  const size_t vocab = logits.size();
  if (vocab == 0 || !(scan.max > -std::numeric_limits<float>::infinity())) {
    out.invalid = true;  // nothing to draw from: token 0, and the caller reports it
    return out;
  }
  thread_local std::vector<float> weight;
  thread_local std::vector<TokenId> ids;
  if (params.temperature < kGreedyTemperature || params.top_k == 1) {
    out.token = first_at(logits, scan.max);
  } else {
    // Unnormalised probabilities exp((logit - max) / T) of every token, then the filters
    // restrict the candidate set `ids` (all tokens unless top-k/min-p/top-p cut it).
    const float max_logit = scan.max;
    const float inv_t = 1.0f / params.temperature;
    weight.resize(vocab);
    exp_row(logits.data(), weight.data(), vocab, max_logit, inv_t);
    const bool restrict = params.top_k > 0 || params.min_p > 0.0f || params.top_p < 1.0f;
    ids.clear();
    if (restrict) {
      // min-p first (it is a plain threshold), then top-k by logit.
      const float floor = params.min_p;  // the top token has weight 1
      for (size_t i = 0; i < vocab; ++i)
        if (weight[i] >= floor && weight[i] > 0.0f) ids.push_back(static_cast<TokenId>(i));
      auto by_logit = [&](TokenId a, TokenId b) { return more_likely(logits, a, b); };
      if (params.top_k > 0 && ids.size() > static_cast<size_t>(params.top_k)) {
        std::nth_element(ids.begin(), ids.begin() + params.top_k - 1, ids.end(), by_logit);
        ids.resize(static_cast<size_t>(params.top_k));
      }
      if (params.top_p < 1.0f) {
        // The smallest most-likely set holding top_p of the mass, without sorting the whole
        // vocabulary: bucket the weights by their float bits (monotonic for positive floats),
        // take every bucket above the one where the mass crosses top_p, and sort only that one.
        constexpr int kShift = 19;  // 8 exponent + 4 mantissa bits: 4096 buckets
        thread_local std::vector<double> bucket_mass;
        bucket_mass.assign(size_t{1} << (32 - kShift), 0.0);
        auto bucket = [&](TokenId t) {
          return std::bit_cast<uint32_t>(weight[static_cast<size_t>(t)]) >> kShift;
        };
        double total = 0;
        for (TokenId t : ids) {
          bucket_mass[bucket(t)] += weight[static_cast<size_t>(t)];
          total += weight[static_cast<size_t>(t)];
        }
        const double target = params.top_p * total;
        double above = 0;  // mass of the buckets strictly above the crossing one
        size_t cross = bucket_mass.size();
        while (cross-- > 0) {
          if (above + bucket_mass[cross] >= target) break;
          above += bucket_mass[cross];
        }
        std::vector<TokenId> kept, edge;
        for (TokenId t : ids) {
          const uint32_t b = bucket(t);
          if (b > cross) kept.push_back(t);
          if (b == cross) edge.push_back(t);
        }
        std::sort(edge.begin(), edge.end(), by_logit);
        double cum = above;
        for (TokenId t : edge) {
          if (cum >= target && !kept.empty()) break;
          kept.push_back(t);
          cum += weight[static_cast<size_t>(t)];
        }
        ids = std::move(kept);
      }
    }
    // Inverse-CDF draw in a fixed order (token id order, or the filtered order).
    thread_local std::vector<float> sums;
    double total;
    if (restrict) {
      total = 0;
      for (TokenId t : ids) total += weight[static_cast<size_t>(t)];
    } else {
      total = blocked_total(weight.data(), vocab, sums);
    }
    const double u = sampling_uniform(seed, step) * total;
    if (restrict) {
      double acc = 0;
      out.token = ids.back();
      for (TokenId t : ids) {
        acc += weight[static_cast<size_t>(t)];
        if (u < acc) {
          out.token = t;
          break;
        }
      }
    } else {
      // Skip whole blocks by their sums, then walk the block the draw falls in. Its running sum
      // rounds differently from its lane sum, so the draw may pass its end: then the block's
      // last token with weight (never a token of weight 0, such as one a grammar forbids).
      const float* w = weight.data();
      size_t pick = vocab;
      double acc = 0;
      for (size_t b = 0; b < sums.size() && pick == vocab; ++b) {
        if (u >= acc + sums[b]) {
          acc += sums[b];
          continue;
        }
        const size_t first = b * kBlock, end = std::min(vocab, first + kBlock);
        double run = acc;
        for (size_t i = first; i < end; ++i) {
          run += w[i];
          if (u < run && w[i] > 0.0f) {
            pick = i;
            break;
          }
        }
        for (size_t i = end; pick == vocab && i-- > first;)
          if (w[i] > 0.0f) pick = i;
      }
      for (size_t i = vocab; pick == vocab && i-- > 0;)  // u past the total by rounding
        if (w[i] > 0.0f) pick = i;
      out.token = static_cast<TokenId>(pick);
    }
  }
  if (params.logprobs) {
    // log-softmax of the logits (temperature 1), as OpenAI reports them.
    const float max_logit = scan.max;
    weight.resize(vocab);
    exp_row(logits.data(), weight.data(), vocab, max_logit, 1.0f);
    thread_local std::vector<float> sums;
    const double lse = max_logit + std::log(blocked_total(weight.data(), vocab, sums));
    out.logprob = static_cast<float>(logits[static_cast<size_t>(out.token)] - lse);
    const size_t n = std::min<size_t>(vocab, static_cast<size_t>(std::max(0, *params.logprobs)));
    if (n > 0) {
      ids.resize(vocab);
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
                        [&](TokenId a, TokenId b) { return more_likely(logits, a, b); });
      for (size_t i = 0; i < n; ++i)
        out.top.push_back({ids[i], static_cast<float>(logits[static_cast<size_t>(ids[i])] - lse)});
    }
  }
  return out;
}

}  // namespace blend
