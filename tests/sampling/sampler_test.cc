#include "sampling/sampler.h"

#include "sampling/plain_draw.h"

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include <gtest/gtest.h>

namespace blend {
namespace {

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

TEST(Sampler, GreedyTakesArgmaxAndLowestIdOnTies) {
  const std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(sample_token(logits, greedy(), 1, 0).token, 1);
  SamplingParams topk1;
  topk1.top_k = 1;
  EXPECT_EQ(sample_token(logits, topk1, 1, 0).token, 1);
}

TEST(Sampler, SameSeedAndStepSameToken) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  SamplingParams p;
  p.temperature = 1.5f;
  for (int step = 0; step < 20; ++step)
    EXPECT_EQ(sample_token(logits, p, 42, step).token, sample_token(logits, p, 42, step).token);
  int differ = 0;
  for (int step = 0; step < 20; ++step)
    differ += sample_token(logits, p, 42, step).token != sample_token(logits, p, 43, step).token;
  EXPECT_GT(differ, 10);
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -30.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  std::map<TokenId, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[sample_token(logits, p, 9, i).token];
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  EXPECT_NEAR(counts[0] / double(n), 1 / z, 0.01);
  EXPECT_NEAR(counts[1] / double(n), std::exp(1.0) / z, 0.01);
  EXPECT_NEAR(counts[2] / double(n), std::exp(2.0) / z, 0.01);
  EXPECT_EQ(counts[3], 0);
  // Temperature 0.5 sharpens: p2/p1 = e^2.
  p.temperature = 0.5f;
  counts.clear();
  for (int i = 0; i < n; ++i) ++counts[sample_token(logits, p, 9, i).token];
  EXPECT_NEAR(counts[2] / double(counts[1]), std::exp(2.0), 0.6);
}

TEST(Sampler, TopKTopPAndMinPRestrictTheSupport) {
  const std::vector<float> logits = {5.0f, 4.9f, 4.8f, 0.0f, -1.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  for (int i = 0; i < 500; ++i) EXPECT_LT(sample_token(logits, p, 1, i).token, 2);
  p = {};
  p.top_p = 0.3f;  // the top token alone holds ~35% of the mass
  for (int i = 0; i < 500; ++i) EXPECT_EQ(sample_token(logits, p, 1, i).token, 0);
  p = {};
  p.min_p = 0.5f;  // tokens 0..2 are within a factor 2 of the top; 3 and 4 are not
  std::map<TokenId, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits, p, 3, i).token];
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.count(3), 0u);
}

TEST(Sampler, TopPOverALargeVocabulary) {
  // Flat logits over 5000 tokens: top_p = 0.5 must keep about half of them (beyond the first
  // 1024 the sampler sorts further).
  std::vector<float> logits(5000, 0.0f);
  SamplingParams p;
  p.top_p = 0.5f;
  TokenId max_seen = 0;
  for (int i = 0; i < 3000; ++i) max_seen = std::max(max_seen, sample_token(logits, p, 5, i).token);
  EXPECT_GT(max_seen, 2000);
  EXPECT_LT(max_seen, 2600);
}

TEST(Sampler, Logprobs) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  SamplingParams p = greedy();
  p.logprobs = 2;
  const SampledToken t = sample_token(logits, p, 0, 0);
  EXPECT_EQ(t.token, 2);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(t.logprob, 3.0 - lse, 1e-6);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].token, 2);
  EXPECT_EQ(t.top[1].token, 1);
  EXPECT_NEAR(t.top[1].logprob, 2.0 - lse, 1e-6);
}

// A broken model's NaN row used to reach `ids.back()` on an empty candidate list whenever a
// filter was on (issue 26): every filter must survive any logits.
TEST(Sampler, SurvivesNanAndInfiniteLogits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  SamplingParams filtered;
  filtered.temperature = 0.7f;
  filtered.top_p = 0.9f;
  filtered.top_k = 5;
  filtered.min_p = 0.1f;
  const std::vector<float> all_nan(64, nan);
  for (const SamplingParams& p : {filtered, greedy(), SamplingParams{}}) {
    const SampledToken t = sample_token(all_nan, p, 1, 0);
    EXPECT_TRUE(t.invalid);
    EXPECT_EQ(t.token, 0);
  }
  // NaN entries count as -inf: the finite ones decide.
  std::vector<float> some_nan(64, nan);
  some_nan[7] = 2.0f;
  some_nan[9] = 1.0f;
  for (const SamplingParams& p : {filtered, greedy()}) {
    const SampledToken t = sample_token(some_nan, p, 1, 0);
    EXPECT_FALSE(t.invalid);
    EXPECT_TRUE(t.token == 7 || t.token == 9) << t.token;
  }
  std::vector<float> with_inf(64, 0.0f);
  with_inf[11] = inf;
  EXPECT_EQ(sample_token(with_inf, filtered, 1, 0).token, 11);
  EXPECT_EQ(sample_token(with_inf, greedy(), 1, 0).token, 11);
  const std::vector<float> all_minus_inf(64, -inf);
  EXPECT_TRUE(sample_token(all_minus_inf, filtered, 1, 0).invalid);
}

// The row scan runs eight lanes at a time and then a tail: a NaN or +inf is found in every lane
// and in the tail, and -inf (a forbidden token) is not mistaken for one.
TEST(Sampler, FindsNanAndInfinityInEveryLaneAndTheTail) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (size_t at = 0; at < 37; ++at) {  // 4 groups of 8 and a tail of 5
    std::vector<float> row(37, 0.5f);
    row[(at + 3) % 37] = 1.0f;  // the best finite logit
    row[at] = inf;
    EXPECT_EQ(sample_token(row, greedy(), 1, 0).token, static_cast<TokenId>(at)) << at;
    row[at] = -nan;  // a NaN with the sign bit set is a NaN too
    EXPECT_EQ(sample_token(row, greedy(), 1, 0).token, static_cast<TokenId>((at + 3) % 37)) << at;
    row[at] = -inf;
    SamplingParams warm;
    warm.temperature = 1.0f;
    for (uint64_t seed = 0; seed < 8; ++seed)
      EXPECT_NE(sample_token(row, warm, seed, 0).token, static_cast<TokenId>(at)) << at;
  }
}

// temperature 1e-40 passed the [0, 2] check and then sampled from NaN weights (always the last
// id): tiny temperatures are greedy.
TEST(Sampler, TinyTemperatureIsGreedy) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  const TokenId best = sample_token(logits, greedy(), 1, 0).token;
  SamplingParams p;
  p.temperature = 1e-40f;
  for (int step = 0; step < 10; ++step) EXPECT_EQ(sample_token(logits, p, 3, step).token, best);
}

TEST(Sampler, LogitBiasAddsToTheRawLogits) {
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f};
  SamplingParams p = greedy();
  p.logit_bias = {{2, 4.5f}};  // 1 + 4.5 > 5
  EXPECT_EQ(sample_token(logits, p, 1, 0).token, 2);
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(sample_token(logits, p, 1, 0).token, 2);
  p.logprobs = 0;
  p.logit_bias = {{0, 5.0f}};  // ties 0 and 1 at 5: the lowest id, each with log(1/2) and a bit
  const SampledToken t = sample_token(logits, p, 1, 0);
  EXPECT_EQ(t.token, 0);
  EXPECT_NEAR(t.logprob, 5.0 - std::log(2 * std::exp(5.0) + std::exp(1.0)), 1e-5);
}

TEST(Sampler, PenaltiesFollowOpenAiAndVllm) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.0f, -1.0f};
  const std::vector<TokenId> prompt = {3};
  const std::vector<TokenId> output = {0, 0, 1};
  const TokenHistory history{prompt, output};
  SamplingParams p = greedy();
  p.logprobs = 0;
  EXPECT_EQ(sample_token(logits, p, 1, 3, history).token, 0);  // no penalty: no change
  // Frequency: token 0 generated twice, token 1 once.
  p.frequency_penalty = 0.3f;
  SampledToken t = sample_token(logits, p, 1, 3, history);
  EXPECT_EQ(t.token, 0);       // 1.4 against 1.2 and 1.0
  p.frequency_penalty = 0.6f;  // 0.8, 0.9, 1.0: token 2 (never generated) wins
  EXPECT_EQ(sample_token(logits, p, 1, 3, history).token, 2);
  p.frequency_penalty = 0;
  p.presence_penalty = 0.6f;  // once per token present: 1.4, 0.9, 1.0
  t = sample_token(logits, p, 1, 3, history);
  EXPECT_EQ(t.token, 0);
  EXPECT_NEAR(t.logprob,
              1.4 - std::log(std::exp(1.4) + std::exp(0.9) + std::exp(1.0) + std::exp(-1.0)), 1e-5);
  p.presence_penalty = 0;
  // Repetition over prompt and output: 2 / 4 = 0.5, 1.5 / 4, 1.0 untouched, -1 * 4.
  p.repetition_penalty = 4.0f;
  t = sample_token(logits, p, 1, 3, history);
  EXPECT_EQ(t.token, 2);
  EXPECT_NEAR(t.logprob,
              1.0 - std::log(std::exp(0.5) + std::exp(0.375) + std::exp(1.0) + std::exp(-4.0)),
              1e-5);
}
}  // namespace
}  // namespace blend

namespace blend {
namespace {

// Structured output's mask: only allowed tokens are ever drawn, greedy takes the best allowed
// one, and an all-refusing mask is reported as an invalid row.
TEST(SamplerMaskTest, OnlyAllowedTokensAreSampled) {
  std::vector<float> logits(200);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 17) * 0.3f;
  std::vector<uint64_t> mask(4, 0);
  for (TokenId t : {3, 70, 130}) mask[static_cast<size_t>(t) / 64] |= uint64_t{1} << (t % 64);
  SamplingParams p;
  p.temperature = 1.0f;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const TokenId t = sample_token(logits, p, seed, 0, {}, mask.data()).token;
    EXPECT_TRUE(t == 3 || t == 70 || t == 130) << t;
  }
  p.temperature = 0.0f;
  // Logits: 3 -> 0.9, 70 -> 0.6 (70 % 17 = 2), 130 -> 3.6 (130 % 17 = 11).
  EXPECT_EQ(sample_token(logits, p, 1, 0, {}, mask.data()).token, 130);
  std::vector<uint64_t> none(4, 0);
  EXPECT_TRUE(sample_token(logits, p, 1, 0, {}, none.data()).invalid);
}

// The mask is applied a 64-token word at a time (all-allowed words copied, all-refused words
// filled): every kind of word, and a partial last one, must give exactly the draw of the
// logits with the refused tokens set to -inf by hand.
TEST(SamplerMaskTest, MaskedDrawEqualsDrawOfMaskedLogits) {
  std::vector<float> logits(300);  // 4 full words and a 44-token tail
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 7) % 23) * 0.2f;
  std::vector<uint64_t> mask = {~uint64_t{0}, 0, 0x00ff00f0f0f0f00fULL, ~uint64_t{0},
                                0x00000f0f0f0f0f0fULL};
  std::vector<float> by_hand = logits;
  for (size_t i = 0; i < by_hand.size(); ++i)
    if (!((mask[i / 64] >> (i % 64)) & 1)) by_hand[i] = -std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.temperature = 0.8f;
  p.logprobs = 3;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    const SampledToken a = sample_token(logits, p, seed, 0, {}, mask.data());
    const SampledToken b = sample_token(by_hand, p, seed, 0, {});
    ASSERT_EQ(a.token, b.token) << seed;
    EXPECT_TRUE((mask[static_cast<size_t>(a.token) / 64] >> (a.token % 64)) & 1);
    EXPECT_EQ(a.logprob, b.logprob);
    ASSERT_EQ(a.top.size(), b.top.size());
    for (size_t i = 0; i < a.top.size(); ++i) EXPECT_EQ(a.top[i].token, b.top[i].token);
  }
}

}  // namespace
}  // namespace blend

// The GPU's draw (sampling/plain_draw.h, run by backend/cuda/draw.cu) must give the token the
// host sampler gives. Here its pieces, composed serially, against sample_token itself.
namespace blend {
namespace {

bool cpu_has_fma() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// A row of `vocab` logits with a long low tail and a few high ones, as a model's rows look.
std::vector<float> model_like_row(int64_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> noise(-4.0f, 3.0f);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& x : row) x = noise(rng);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  for (int k = 0; k < 6; ++k) row[static_cast<size_t>(pick(rng))] = 8.0f + static_cast<float>(k);
  return row;
}

TEST(PlainDraw, WeightsAreTheSamplersBitForBit) {
  if (!cpu_has_fma()) GTEST_SKIP() << "the host rounds without FMA here (plain_draw.h)";
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> logit(-120.0f, 40.0f);
  std::vector<float> row(4099);
  for (float& x : row) x = logit(rng);
  row[17] = 40.0f;
  row[18] = -std::numeric_limits<float>::infinity();  // weighs exactly 0 on both
  std::vector<float> host(row.size());
  for (const float inv_t : {0.05f, 0.5f, 1.0f, 1.0f / 0.7f, 3.0f, 100.0f}) {
    temperature_weights(row, 40.0f, inv_t, host);
    int64_t differ = 0;
    for (size_t i = 0; i < row.size(); ++i)
      differ += host[i] != draw_weight(row[i], 40.0f, inv_t) ? 1 : 0;
    EXPECT_EQ(differ, 0) << "inv_t " << inv_t;
    EXPECT_EQ(host[18], 0.0f);
  }
}

TEST(PlainDraw, TheComposedDrawIsTheSamplersToken) {
  if (!cpu_has_fma()) GTEST_SKIP() << "the host rounds without FMA here (plain_draw.h)";
  std::mt19937 rng(11);
  int64_t rows = 0, distinct = 0;
  std::map<TokenId, int> seen;
  // Vocabularies with and without a tail block or a partial group of eight.
  for (const int64_t vocab :
       {int64_t{1}, int64_t{7}, int64_t{300}, int64_t{4093}, int64_t{32000}}) {
    for (int r = 0; r < 40; ++r) {
      const std::vector<float> row = model_like_row(vocab, rng);
      float max = row[0];
      for (float x : row) max = std::max(max, x);
      SamplingParams params;
      params.temperature = r % 2 ? 1.0f : 0.6f + 0.1f * static_cast<float>(r % 7);
      const float inv_t = 1.0f / params.temperature;
      const uint64_t seed = 1000 + static_cast<uint64_t>(r);
      const int64_t step = r * 3;
      const int64_t blocks = (vocab + kDrawBlock - 1) / kDrawBlock;
      std::vector<float> sums(static_cast<size_t>(blocks));
      for (int64_t b = 0; b < blocks; ++b) {
        float lanes[kDrawLanes];
        for (int j = 0; j < kDrawLanes; ++j)
          lanes[j] = draw_lane_sum(row.data(), vocab, b, j, max, inv_t);
        sums[static_cast<size_t>(b)] = draw_block_sum(lanes);
      }
      const int64_t drawn = draw_pick(row.data(), vocab, sums.data(), blocks, max, inv_t,
                                      sampling_uniform(seed, step));
      const SampledToken host = sample_token(row, params, seed, step);
      ASSERT_FALSE(host.invalid);
      EXPECT_EQ(drawn, host.token) << "vocab " << vocab << " row " << r;
      ++rows;
      distinct += seen[host.token]++ == 0 ? 1 : 0;
    }
  }
  EXPECT_EQ(rows, 200);
  EXPECT_GT(distinct, 100);  // the draws spread over many tokens, not the argmax alone
}

}  // namespace
}  // namespace blend

// A masked row is drawn over its allowed tokens only (sampler.cc sample_masked_sparse); the token
// must be the dense draw's over the row with every refused logit at -inf, for narrow and wide
// masks, greedy and at temperatures, with and without a refused NaN.
namespace blend {
namespace {

TEST(SamplerMaskTest, TheSparseDrawIsTheDenseDrawsToken) {
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 4.0f);
  constexpr size_t kVocab = 5003;  // a partial last block and group of eight
  int64_t rows = 0, off_argmax = 0;
  for (int r = 0; r < 300; ++r) {
    std::vector<float> logits(kVocab);
    for (float& x : logits) x = noise(rng);
    // 1 to ~600 allowed tokens, clustered or spread.
    std::vector<uint64_t> mask((kVocab + 63) / 64, 0);
    const int allowed = 1 + (r * 37) % 600;
    std::uniform_int_distribution<size_t> pick(0, kVocab - 1);
    const size_t base = pick(rng);
    for (int k = 0; k < allowed; ++k) {
      const size_t t = r % 2 ? pick(rng) : (base + static_cast<size_t>(k)) % kVocab;
      mask[t / 64] |= uint64_t{1} << (t % 64);
    }
    if (r % 5 == 0) {  // a refused NaN and +inf: not the sampler's business
      for (size_t t = 0; t < kVocab; ++t)
        if (!((mask[t / 64] >> (t % 64)) & 1)) {
          logits[t] = r % 10 ? std::numeric_limits<float>::quiet_NaN()
                             : std::numeric_limits<float>::infinity();
          break;
        }
    }
    std::vector<float> dense = logits;
    for (size_t t = 0; t < kVocab; ++t)
      if (!((mask[t / 64] >> (t % 64)) & 1)) dense[t] = -std::numeric_limits<float>::infinity();
    SamplingParams p;
    p.temperature = r % 7 == 0 ? 0.0f : 0.3f + 0.2f * static_cast<float>(r % 6);
    const uint64_t seed = 500 + static_cast<uint64_t>(r);
    const SampledToken sparse = sample_token(logits, p, seed, r, {}, mask.data());
    const SampledToken reference = sample_token(dense, p, seed, r);
    ASSERT_FALSE(reference.invalid);
    EXPECT_EQ(sparse.token, reference.token) << "row " << r;
    EXPECT_TRUE((mask[static_cast<size_t>(sparse.token) / 64] >> (sparse.token % 64)) & 1);
    ++rows;
    const auto argmax = std::max_element(dense.begin(), dense.end()) - dense.begin();
    off_argmax += sparse.token != argmax ? 1 : 0;
  }
  EXPECT_EQ(rows, 300);
  EXPECT_GT(off_argmax, 50);  // real draws, not argmaxes
}

}  // namespace
}  // namespace blend

// The top-k / top-p / min-p cuts are defined once (sampling/cut_select.h) so that the GPU keeps
// the tokens the host keeps. Here the sampler against that definition computed by sorting: the
// kept set is the most-likely prefix by (logit, then id) under each budget, and the draw over
// it is the plain draw over a row where every other token is -inf.
#include "sampling/cut_select.h"

namespace blend {
namespace {

// The tokens the cuts keep, by their definition: candidates of weight >= min_p (and > 0), ranked
// by logit then id; top-k keeps the first k; top-p the first tokens whose fixed-point weight
// before them is below top_p x the candidates' total.
std::vector<bool> kept_by_definition(const std::vector<float>& row, const SamplingParams& p) {
  float max = -std::numeric_limits<float>::infinity();
  for (float x : row) max = std::max(max, x);
  const float inv_t = 1.0f / p.temperature;
  std::vector<TokenId> ranked;
  std::vector<float> w(row.size());
  for (size_t i = 0; i < row.size(); ++i) {
    w[i] = draw_weight(row[i], max, inv_t);
    if (w[i] >= std::min(p.min_p, 1.0f) && w[i] > 0.0f) ranked.push_back(static_cast<TokenId>(i));
  }
  std::sort(ranked.begin(), ranked.end(), [&](TokenId a, TokenId b) {
    const float la = row[static_cast<size_t>(a)], lb = row[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  });
  if (p.top_k > 0 && ranked.size() > static_cast<size_t>(p.top_k))
    ranked.resize(static_cast<size_t>(p.top_k));
  if (p.top_p < 1.0f) {
    uint64_t total = 0;
    for (TokenId t : ranked) total += fixed_mass(w[static_cast<size_t>(t)]);
    const uint64_t budget = top_p_budget(p.top_p, total);
    uint64_t before = 0;
    size_t n = 0;
    while (n < ranked.size() && before < budget) before += fixed_mass(w[ranked[n++]]);
    ranked.resize(n);
  }
  std::vector<bool> kept(row.size(), false);
  for (TokenId t : ranked) kept[static_cast<size_t>(t)] = true;
  return kept;
}

TEST(SamplerCuts, TheDrawIsThePlainDrawOverTheRankedPrefix) {
  std::mt19937 rng(21);
  int64_t rows = 0, cut_rows = 0, ties_at_the_cut = 0;
  for (const size_t vocab : {size_t{5}, size_t{300}, size_t{4093}, size_t{40000}}) {
    for (int r = 0; r < 60; ++r) {
      std::vector<float> row = model_like_row(static_cast<int64_t>(vocab), std::ref(rng));
      // Coarse logits tie often (the cut must break ties by id), with -0, +0 and -inf among them.
      if (r % 3 == 0)
        for (float& x : row) x = static_cast<float>(rng() % 6);
      if (r % 5 == 0) {
        row[0] = -0.0f;
        row[vocab / 2] = 0.0f;
        row[vocab - 1] = -std::numeric_limits<float>::infinity();
      }
      SamplingParams p;
      p.temperature = 0.5f + 0.25f * static_cast<float>(r % 4);
      p.top_k = r % 4 == 1 ? 0 : 1 + r % 60;
      p.top_p = r % 3 == 2 ? 1.0f : 0.3f + 0.1f * static_cast<float>(r % 7);
      p.min_p = r % 5 == 3 ? 0.02f : 0.0f;
      if (p.top_k == 1) p.top_k = 2;  // top_k 1 is greedy, not a cut
      const std::vector<bool> kept = kept_by_definition(row, p);
      std::vector<float> masked = row;
      size_t kept_count = 0;
      for (size_t i = 0; i < vocab; ++i) {
        if (!kept[i]) masked[i] = -std::numeric_limits<float>::infinity();
        kept_count += kept[i] ? 1 : 0;
      }
      ASSERT_GT(kept_count, 0u);
      cut_rows += kept_count < vocab ? 1 : 0;
      SamplingParams plain;
      plain.temperature = p.temperature;
      for (int64_t step = 0; step < 8; ++step) {
        const uint64_t seed = 900 + static_cast<uint64_t>(r);
        const SampledToken got = sample_token(row, p, seed, step);
        ASSERT_FALSE(got.invalid);
        ASSERT_TRUE(kept[static_cast<size_t>(got.token)])
            << "vocab " << vocab << " row " << r << " token " << got.token;
        EXPECT_EQ(got.token, sample_token(masked, plain, seed, step).token)
            << "vocab " << vocab << " row " << r << " step " << step;
      }
      // A tie at the cut: a dropped token with the logit of a kept one.
      float lowest_kept = std::numeric_limits<float>::infinity();
      for (size_t i = 0; i < vocab; ++i)
        if (kept[i]) lowest_kept = std::min(lowest_kept, row[i]);
      for (size_t i = 0; i < vocab; ++i)
        if (!kept[i] && row[i] == lowest_kept) {
          ++ties_at_the_cut;
          break;
        }
      ++rows;
    }
  }
  EXPECT_EQ(rows, 240);
  EXPECT_GT(cut_rows, 150);        // the cuts cut
  EXPECT_GT(ties_at_the_cut, 10);  // and ties at the cut were broken by id
}

}  // namespace
}  // namespace blend
