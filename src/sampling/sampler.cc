#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "core/multiversion.h"
#include "sampling/cut_select.h"
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
// (std::find, unrolled: the scalar loop's codegen varied with what surrounds it in
// sample_token, ~10% of its instructions; callgrind.)
TokenId first_at(std::span<const float> logits, float max) {
  const auto last = logits.end() - 1;  // the last token when no other holds max
  return static_cast<TokenId>(std::find(logits.begin(), last, max) - logits.begin());
}

bool more_likely(std::span<const float> logits, TokenId a, TokenId b) {
  const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
  return la > lb || (la == lb && a < b);
}

// The total of a row's temperature-1 weights, the log-softmax's denominator as logprobs read it.
double softmax_total(std::span<const float> logits, float max) {
  thread_local std::vector<float> weight, sums;
  weight.resize(logits.size());
  exp_row(logits.data(), weight.data(), logits.size(), max, 1.0f);
  return blocked_total(weight.data(), logits.size(), sums);
}

// The `count` most likely tokens of a row (ties: the lowest id first) and their logprobs.
void most_likely(std::span<const float> logits, int32_t count, float max, double total,
                 std::vector<TopLogprob>& out) {
  const size_t n = std::min<size_t>(logits.size(), static_cast<size_t>(std::max(0, count)));
  if (n == 0) return;
  thread_local std::vector<TokenId> ids;
  ids.resize(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
                    [&](TokenId a, TokenId b) { return more_likely(logits, a, b); });
  for (size_t i = 0; i < n; ++i)
    out.push_back({ids[i], row_logprob(logits[static_cast<size_t>(ids[i])], max, total)});
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

// The dense draw's token (plain_draw.h) over a row whose only tokens of weight are `ids`
// (ascending) with weights w: each non-empty block's sum as block_sums adds it (lane j holds the
// block's tokens j, j + 8, ... and lane 0 its tail past the last group of eight, in id order;
// a token of weight 0 adds exactly 0), the total and the walk as the dense path's. Some w > 0.
TokenId draw_sparse(std::span<const TokenId> ids, std::span<const float> w, size_t vocab,
                    double u01) {
  struct Block {
    size_t first_id, end_id;  // its tokens: ids[first_id, end_id)
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
  const double u = u01 * total;
  double acc = 0;
  for (const Block& b : blocks) {
    if (u >= acc + b.sum) {
      acc += b.sum;
      continue;
    }
    double run = acc;
    for (size_t k = b.first_id; k < b.end_id; ++k) {
      run += w[k];
      if (u < run && w[k] > 0.0f) return ids[k];
    }
    for (size_t k = b.end_id; k-- > b.first_id;)
      if (w[k] > 0.0f) return ids[k];
  }
  for (size_t k = ids.size(); k-- > 0;)  // u past the total by rounding
    if (w[k] > 0.0f) return ids[k];
  return ids.empty() ? 0 : ids.back();  // not reached: some token weighs more than 0
}

// keys[i] = rank_key(logits[i]), compiled per ISA.
BLEND_MULTIVERSION
void rank_keys(const float* logits, uint32_t* keys, size_t n) {
  for (size_t i = 0; i < n; ++i) keys[i] = rank_key(logits[i]);
}

// The candidates `ids` (ascending; keys[t] the rank key of token t) that the cut of
// sampling/cut_select.h keeps: the most-likely prefix, by logit and then id, whose weight before
// each kept token is below `budget` (weight(t) is token t's). Writes them, ascending, to `kept`.
// After the first radix pass only the tokens at or above its chosen bin can be kept: they are
// collected once, and the later passes and the final filter look at them alone.
template <class Weight>
void select_ranked(std::span<const TokenId> ids, const uint32_t* keys, Weight weight,
                   uint64_t budget, std::vector<TokenId>& kept) {
  // A row's logits fall in a few dozen first-pass bins, so one histogram would be a chain of
  // increments of the same few counters; four copies, one per index mod 4, break it.
  constexpr size_t kCopies = 4;
  thread_local std::vector<TokenId> live;
  thread_local std::vector<uint32_t> count, count_copies;
  thread_local std::vector<uint64_t> mass, mass_copies;
  auto key = [&](TokenId t) { return keys[static_cast<size_t>(t)]; };
  uint32_t prefix = 0;
  uint64_t above = 0;
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    const std::span<const TokenId> scan = pass == 0 ? ids : std::span<const TokenId>(live);
    const auto bins = size_t{1} << radix_bits(pass);
    const size_t mask = scan.size() >= 16 * bins ? kCopies - 1 : 0;
    count_copies.assign((mask + 1) * bins, 0);
    mass_copies.assign((mask + 1) * bins, 0);
    for (size_t i = 0; i < scan.size(); ++i) {
      const size_t d = (i & mask) * bins + static_cast<size_t>(radix_digit(key(scan[i]), pass));
      ++count_copies[d];
      mass_copies[d] += weight(scan[i]);
    }
    count.assign(count_copies.begin(), count_copies.begin() + static_cast<ptrdiff_t>(bins));
    mass.assign(mass_copies.begin(), mass_copies.begin() + static_cast<ptrdiff_t>(bins));
    for (size_t c = 1; c <= mask; ++c)
      for (size_t b = 0; b < bins; ++b) {
        count[b] += count_copies[c * bins + b];
        mass[b] += mass_copies[c * bins + b];
      }
    const int bin = radix_choose(count.data(), mass.data(), static_cast<int>(bins), budget, &above);
    prefix |= static_cast<uint32_t>(bin) << radix_shift(pass);
    if (pass == 0) {  // every token the cut can keep, then the bin's tokens among them
      kept.clear();
      for (TokenId t : ids)
        if (radix_digit(key(t), 0) >= bin) kept.push_back(t);
      live.clear();
      for (TokenId t : kept)
        if (radix_digit(key(t), 0) == bin) live.push_back(t);
    } else {
      std::erase_if(live, [&](TokenId t) { return radix_digit(key(t), pass) != bin; });
    }
  }
  RankCut cut{.key = prefix};
  if (live.size() > 1)  // tied on the key, in id order (one token alone there is kept)
    for (TokenId t : live) {
      if (above >= budget) break;
      cut.last_id = t;
      above += weight(t);
    }
  std::erase_if(kept, [&](TokenId t) { return !rank_kept(cut, key(t), t); });
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
  out.token = draw_sparse(ids, w, vocab, sampling_uniform(seed, step));
  return out;
}

}  // namespace

double sampling_uniform(uint64_t seed, int64_t step) {
  const uint64_t r = mix(mix(seed) ^ static_cast<uint64_t>(step));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

DeviceDraw device_draw_of(const SamplingParams& p, uint64_t seed, int64_t step) {
  DeviceDraw d;
  d.logprobs = p.logprobs ? std::max(0, *p.logprobs) : -1;
  if (p.temperature < kGreedyTemperature || p.top_k == 1) return d;  // the argmax
  d.inv_temperature = 1.0f / p.temperature;
  d.uniform = sampling_uniform(seed, step);
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  return d;
}

float row_logprob(float logit, float max, double total) {
  const double lse = max + std::log(total);
  return static_cast<float>(logit - lse);
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
      // The cuts of sampling/cut_select.h, so that the GPU keeps the same tokens: min-p (a
      // threshold on the weight; the top token weighs 1), then top-k and top-p as selections in
      // rank order. The draw is then the dense draw over the kept tokens alone.
      const float floor = std::min(params.min_p, 1.0f);
      for (size_t i = 0; i < vocab; ++i)
        if (weight[i] >= floor && weight[i] > 0.0f) ids.push_back(static_cast<TokenId>(i));
      thread_local std::vector<uint32_t> keys;
      thread_local std::vector<TokenId> cut;
      if (params.top_k > 0 || params.top_p < 1.0f) {
        keys.resize(vocab);
        rank_keys(logits.data(), keys.data(), vocab);
      }
      if (params.top_k > 0 && ids.size() > static_cast<size_t>(params.top_k)) {
        select_ranked(
            ids, keys.data(), [](TokenId) { return uint64_t{1}; },
            static_cast<uint64_t>(params.top_k), cut);
        ids.swap(cut);
      }
      if (params.top_p < 1.0f) {
        auto mass = [&](TokenId t) { return fixed_mass(weight[static_cast<size_t>(t)]); };
        uint64_t total = 0;
        for (TokenId t : ids) total += mass(t);
        select_ranked(ids, keys.data(), mass, top_p_budget(params.top_p, total), cut);
        ids.swap(cut);
      }
      thread_local std::vector<float> kept;
      kept.resize(ids.size());
      for (size_t k = 0; k < ids.size(); ++k) kept[k] = weight[static_cast<size_t>(ids[k])];
      out.token = draw_sparse(ids, kept, vocab, sampling_uniform(seed, step));
    } else {
      // The inverse-CDF draw in token id order: skip whole blocks by their sums, then walk the
      // block the draw falls in. Its running sum
      // rounds differently from its lane sum, so the draw may pass its end: then the block's
      // last token with weight (never a token of weight 0, such as one a grammar forbids).
      thread_local std::vector<float> sums;
      const double u = sampling_uniform(seed, step) * blocked_total(weight.data(), vocab, sums);
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
    const double total = softmax_total(logits, scan.max);
    out.logprob = row_logprob(logits[static_cast<size_t>(out.token)], scan.max, total);
    most_likely(logits, *params.logprobs, scan.max, total, out.top);
  }
  return out;
}

PromptLogprob score_token(std::span<const float> raw_logits, TokenId token, int32_t top) {
  thread_local std::vector<float> processed;
  RowScan scan = scan_row(raw_logits);
  // NaN as -inf and +inf as the largest float, as sample_token reads a broken row.
  const std::span<const float> logits =
      processed_logits(raw_logits, SamplingParams{}, {}, scan.nan_or_inf, nullptr, processed);
  if (logits.data() != raw_logits.data()) scan = scan_row(logits);
  PromptLogprob out;
  out.token = token;
  const double total = softmax_total(logits, scan.max);
  const float logit = logits[static_cast<size_t>(token)];
  out.logprob = row_logprob(logit, scan.max, total);
  out.rank = 1 + static_cast<int32_t>(std::count_if(logits.begin(), logits.end(),
                                                    [&](float l) { return l > logit; }));
  most_likely(logits, top, scan.max, total, out.top);
  return out;
}

}  // namespace blend
