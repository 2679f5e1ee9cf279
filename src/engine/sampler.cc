#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace blend {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

TokenId argmax(std::span<const float> logits) {
  // Ties go to the lowest id, so greedy decoding is reproducible everywhere.
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<TokenId>(best);
}

struct Candidate {
  TokenId token;
  float logit;
};

// log(sum(exp(logits))) computed stably in double.
double log_sum_exp(std::span<const float> logits) {
  float max = -std::numeric_limits<float>::infinity();
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - max));
  return max + std::log(sum);
}

}  // namespace

double sampling_uniform(uint64_t seed, int64_t step) {
  const uint64_t r = mix(mix(seed) ^ static_cast<uint64_t>(step));
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

SampledToken sample_token(std::span<const float> logits, const SamplingParams& params,
                          uint64_t seed, int64_t step) {
  SampledToken out;
  const size_t vocab = logits.size();
  if (params.temperature <= 0.0f || params.top_k == 1) {
    out.token = argmax(logits);
  } else {
    // Candidates, most likely first. top_k bounds how many we need; otherwise sort lazily:
    // the first few hundred tokens nearly always hold the top_p mass.
    std::vector<Candidate> cand(vocab);
    for (size_t i = 0; i < vocab; ++i) cand[i] = {static_cast<TokenId>(i), logits[i]};
    auto by_logit = [](const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
    };
    size_t keep = vocab;
    if (params.top_k > 0) keep = std::min<size_t>(vocab, static_cast<size_t>(params.top_k));
    size_t sorted = std::min<size_t>(keep, 1024);
    std::partial_sort(cand.begin(), cand.begin() + static_cast<ptrdiff_t>(sorted), cand.end(),
                      by_logit);
    const double inv_t = 1.0 / params.temperature;
    const double max_logit = cand[0].logit;
    // Softmax mass of the kept set, computed over all kept candidates.
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += std::exp((cand[i].logit - max_logit) * inv_t);
    auto prob = [&](size_t i) { return std::exp((cand[i].logit - max_logit) * inv_t) / total; };
    // min-p: drop tokens below min_p times the top probability (the top has prob(0)).
    if (params.min_p > 0.0f) {
      const double floor = params.min_p * prob(0);
      size_t n = 1;
      while (n < sorted && prob(n) >= floor) ++n;
      if (n == sorted && sorted < keep) {  // need more of the order
        std::sort(cand.begin() + static_cast<ptrdiff_t>(sorted),
                  cand.begin() + static_cast<ptrdiff_t>(keep), by_logit);
        sorted = keep;
        while (n < keep && prob(n) >= floor) ++n;
      }
      keep = n;
    }
    // top-p: the smallest prefix whose mass reaches top_p.
    if (params.top_p < 1.0f) {
      double cum = 0;
      size_t n = 0;
      while (n < keep) {
        if (n == sorted) {
          std::sort(cand.begin() + static_cast<ptrdiff_t>(sorted),
                    cand.begin() + static_cast<ptrdiff_t>(keep), by_logit);
          sorted = keep;
        }
        cum += prob(n);
        ++n;
        if (cum >= params.top_p) break;
      }
      keep = std::max<size_t>(n, 1);
    }
    if (sorted < keep) {
      std::sort(cand.begin() + static_cast<ptrdiff_t>(sorted),
                cand.begin() + static_cast<ptrdiff_t>(keep), by_logit);
    }
    // Inverse-CDF draw over the kept candidates in their fixed (logit, id) order.
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) mass += prob(i);
    const double u = sampling_uniform(seed, step) * mass;
    double acc = 0;
    out.token = cand[keep - 1].token;
    for (size_t i = 0; i < keep; ++i) {
      acc += prob(i);
      if (u < acc) {
        out.token = cand[i].token;
        break;
      }
    }
  }
  if (params.logprobs) {
    const double lse = log_sum_exp(logits);
    out.logprob = static_cast<float>(logits[static_cast<size_t>(out.token)] - lse);
    const size_t n = std::min<size_t>(vocab, static_cast<size_t>(std::max(0, *params.logprobs)));
    if (n > 0) {
      std::vector<TokenId> ids(vocab);
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(
          ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
          [&](TokenId a, TokenId b) {
            return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
                   (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
          });
      for (size_t i = 0; i < n; ++i)
        out.top.push_back({ids[i], static_cast<float>(logits[static_cast<size_t>(ids[i])] - lse)});
    }
  }
  return out;
}

}  // namespace blend
