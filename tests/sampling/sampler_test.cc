#include "sampling/sampler.h"

#include <cmath>
#include <map>

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

}  // namespace
}  // namespace blend
