#include "sched/iteration_fit.h"

#include <gtest/gtest.h>

#include <random>

namespace blend {
namespace {

IterationCostModel truth() {
  IterationCostModel m;
  m.prefill_base = 2e-3;
  m.prefill_per_token = 5e-5;
  m.decode_base = 4e-3;
  m.decode_per_token = 3e-4;
  m.decode_per_context_token = 2e-7;
  m.swap_base = 1e-4;
  m.swap_per_page = 2e-5;
  return m;
}

// Steps as a serving engine runs them: prefill only, decode only, and mixed, with swaps in some.
IterationSample step(const IterationCostModel& m, std::mt19937& rng) {
  IterationSample s;
  switch (rng() % 3) {
    case 0:
      s.prefill_tokens = 16 + rng() % 1000;
      break;
    case 1:
      s.decode_tokens = 1 + rng() % 64;
      s.decode_context = s.decode_tokens * (10 + rng() % 2000);
      break;
    default:
      s.prefill_tokens = 16 + rng() % 500;
      s.decode_tokens = 1 + rng() % 64;
      s.decode_context = s.decode_tokens * (10 + rng() % 2000);
  }
  s.seconds = m.forward_seconds(s.prefill_tokens, s.decode_tokens, s.decode_context);
  if (rng() % 4 == 0) {
    s.swap_pages = 1 + rng() % 40;
    s.swap_seconds = m.swap_seconds(s.swap_pages);
  }
  return s;
}

TEST(IterationFit, RecoversTheModelThatTimedTheSteps) {
  const IterationCostModel m = truth();
  std::mt19937 rng(7);
  IterationFit fit;
  for (int i = 0; i < 400; ++i) fit.add(step(m, rng));
  ASSERT_TRUE(fit.ready());
  const IterationCostModel f = fit.fit();
  EXPECT_NEAR(f.prefill_base, m.prefill_base, 0.01 * m.prefill_base);
  EXPECT_NEAR(f.prefill_per_token, m.prefill_per_token, 0.01 * m.prefill_per_token);
  EXPECT_NEAR(f.decode_base, m.decode_base, 0.01 * m.decode_base);
  EXPECT_NEAR(f.decode_per_token, m.decode_per_token, 0.01 * m.decode_per_token);
  EXPECT_NEAR(f.decode_per_context_token, m.decode_per_context_token,
              0.01 * m.decode_per_context_token);
  EXPECT_NEAR(f.swap_base, m.swap_base, 0.02 * m.swap_base);
  EXPECT_NEAR(f.swap_per_page, m.swap_per_page, 0.01 * m.swap_per_page);
}

TEST(IterationFit, NoModelUntilEnoughSteps) {
  const IterationCostModel m = truth();
  std::mt19937 rng(1);
  IterationFit fit;
  for (size_t i = 0; i + 1 < IterationFit::kMinSteps; ++i) fit.add(step(m, rng));
  EXPECT_FALSE(fit.ready());
  EXPECT_EQ(fit.fit().forward_seconds(100, 10, 1000), 0.0);
  IterationSample swap_only;  // restores without a forward pass do not count as steps
  swap_only.swap_pages = 3;
  swap_only.swap_seconds = 1e-3;
  fit.add(swap_only);
  EXPECT_FALSE(fit.ready());
  fit.add(step(m, rng));
  EXPECT_TRUE(fit.ready());
  EXPECT_GT(fit.fit().forward_seconds(100, 10, 1000), 0.0);
}

// Noisy timings (a shared machine) must not produce negative rates: the hybrid policy would
// then think a larger batch is faster.
TEST(IterationFit, NoisyTimingsGiveNoNegativeCoefficient) {
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(0.0, 1e-3);
  IterationFit fit;
  for (int i = 0; i < 300; ++i) {
    IterationSample s;
    s.decode_tokens = 1 + rng() % 8;
    s.decode_context = rng() % 100;  // context barely matters: its rate is within the noise
    s.seconds = 5e-3 + 1e-4 * static_cast<double>(s.decode_tokens) + noise(rng);
    fit.add(s);
  }
  const IterationCostModel f = fit.fit();
  for (double c : {f.prefill_base, f.prefill_per_token, f.decode_base, f.decode_per_token,
                   f.decode_per_context_token, f.swap_base, f.swap_per_page})
    EXPECT_GE(c, 0.0);
  EXPECT_EQ(f.prefill_per_token, 0.0);  // no prefill was seen
  EXPECT_NEAR(f.forward_seconds(0, 4, 50), 5.4e-3, 0.5e-3);
}

// The window forgets: after the machine slows down, the fit follows the new speed.
TEST(IterationFit, FollowsAMachineThatSlowsDown) {
  IterationCostModel slow = truth();
  slow.prefill_per_token *= 2;
  slow.decode_per_token *= 2;
  std::mt19937 rng(5);
  IterationFit fit(/*window=*/128);
  for (int i = 0; i < 500; ++i) fit.add(step(truth(), rng));
  for (int i = 0; i < 128; ++i) fit.add(step(slow, rng));
  const IterationCostModel f = fit.fit();
  EXPECT_NEAR(f.prefill_per_token, slow.prefill_per_token, 0.02 * slow.prefill_per_token);
  EXPECT_NEAR(f.decode_per_token, slow.decode_per_token, 0.02 * slow.decode_per_token);
}

}  // namespace
}  // namespace blend
