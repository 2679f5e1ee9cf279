#include "sched/hybrid_policy.h"

#include <gtest/gtest.h>

namespace blend {
namespace {

// 10 ms per decode token, nothing else: easy arithmetic.
IterationCostModel per_token_cost() {
  IterationCostModel m;
  m.decode_per_token = 0.010;
  m.prefill_per_token = 0.001;
  m.swap_per_page = 0.004;
  return m;
}

HybridCandidate rt(double deadline, int64_t pages = 0) {
  HybridCandidate c;
  c.cls = RequestClass::kRealtime;
  c.deadline = deadline;
  c.pages_needed = pages;
  return c;
}

HybridCandidate be(int64_t checkpointed, int64_t pages = 0) {
  HybridCandidate c;
  c.checkpointed_pages = checkpointed;
  c.pages_needed = pages;
  return c;
}

TEST(IterationCostModel, SwapsOverlapTheForwardPass) {
  const IterationCostModel m = per_token_cost();
  EXPECT_DOUBLE_EQ(m.iteration_seconds(100, 2, 0, 0), 0.1 + 0.02);
  EXPECT_DOUBLE_EQ(m.iteration_seconds(0, 1, 0, 5), 0.02);  // swap 20 ms > forward 10 ms
  EXPECT_DOUBLE_EQ(m.iteration_seconds(0, 3, 0, 5), 0.03);  // forward 30 ms > swap 20 ms
}

TEST(HybridPolicy, MostUrgentRealTimeFirstWhileTheIterationFitsItsDeadline) {
  HybridPolicy p({.initial_batch = 8, .batch_step = 4, .max_batch = 64}, per_token_cost());
  // Deadlines (now = 0): 35 ms is the tightest, so at most 3 decode tokens (30 ms) fit.
  const std::vector<HybridCandidate> rts = {rt(0.100), rt(0.035), rt(0.500), rt(0.050), rt(0.060)};
  const HybridSelection s = p.select(rts, {}, 0.0, 100);
  EXPECT_EQ(s.rt, (std::vector<size_t>{1, 3, 4}));
  EXPECT_TRUE(s.rt_at_risk);
  EXPECT_NEAR(s.estimated_seconds, 0.03, 1e-12);
  EXPECT_EQ(p.batch_size(), 8);  // reset on risk
}

TEST(HybridPolicy, BestEffortFillsTheBatchFewestCheckpointedPagesFirst) {
  HybridPolicy p({.initial_batch = 4, .batch_step = 4, .max_batch = 64}, per_token_cost());
  // 50 ms of slack: enough for a batch of 4 (40 ms), too little to wait for the next one.
  const std::vector<HybridCandidate> rts = {rt(0.05)};
  const std::vector<HybridCandidate> bes = {be(3), be(0), be(9), be(1), be(0)};
  const HybridSelection s = p.select(rts, bes, 0.0, 100);
  EXPECT_EQ(s.rt, std::vector<size_t>{0});
  EXPECT_EQ(s.be, (std::vector<size_t>{1, 4, 3}));  // 3 more fill a batch of 4
  EXPECT_FALSE(s.rt_at_risk);
  EXPECT_EQ(p.batch_size(), 8);  // grew by one step
}

TEST(HybridPolicy, BestEffortReplacesTheLeastUrgentRealTimeThatCanWait) {
  HybridPolicy p({.initial_batch = 2, .batch_step = 0, .max_batch = 2}, per_token_cost());
  p.observe_iteration(0.010);
  // Batch of 2: both RT fit; the relaxed one (1 s left) can wait an iteration, the urgent one
  // (25 ms left) cannot, so one BE request takes the relaxed one's place.
  const std::vector<HybridCandidate> rts = {rt(1.0), rt(0.025)};
  const std::vector<HybridCandidate> bes = {be(0), be(0)};
  const HybridSelection s = p.select(rts, bes, 0.0, 100);
  EXPECT_EQ(s.rt, std::vector<size_t>{1});
  EXPECT_EQ(s.be, std::vector<size_t>{0});

  // When the least urgent RT request has no slack left either, nothing is replaced.
  const std::vector<HybridCandidate> tight = {rt(0.030), rt(0.025)};
  const HybridSelection t = p.select(tight, bes, 0.0, 100);
  EXPECT_EQ(t.rt.size(), 2u);
  EXPECT_TRUE(t.be.empty());
}

TEST(HybridPolicy, KvPagesLimitTheBatch) {
  HybridPolicy p({.initial_batch = 8, .batch_step = 4, .max_batch = 64}, per_token_cost());
  const std::vector<HybridCandidate> rts = {rt(1.0, 3), rt(2.0, 3)};
  const std::vector<HybridCandidate> bes = {be(0, 2), be(0, 1)};
  const HybridSelection s = p.select(rts, bes, 0.0, 7);
  EXPECT_EQ(s.rt, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(s.be, std::vector<size_t>{1});  // 6 + 2 > 7, 6 + 1 fits
}

TEST(HybridPolicy, RealTimeShortOfAPageDoesNotHoldBackTheOthers) {
  HybridPolicy p({.initial_batch = 8, .batch_step = 4, .max_batch = 64}, per_token_cost());
  // The most urgent needs 3 pages and 2 are free; the next two need none and 2.
  const std::vector<HybridCandidate> rts = {rt(1.0, 3), rt(2.0, 0), rt(3.0, 2)};
  const HybridSelection s = p.select(rts, {}, 0.0, 2);
  EXPECT_EQ(s.rt, (std::vector<size_t>{1, 2}));
}

// Alg. 1 as published (HybridOptions::preempt_be_pages): pages BE sequences hold count as room
// for RT requests, not for BE ones.
TEST(HybridPolicy, BestEffortPagesAreRoomForRealTimeOnly) {
  HybridPolicy p({.initial_batch = 8, .batch_step = 4, .max_batch = 64}, per_token_cost());
  const std::vector<HybridCandidate> rts = {rt(1.0, 3), rt(2.0, 3)};
  const std::vector<HybridCandidate> bes = {be(0, 1)};
  // 1 free page: neither RT request fits; the BE one does.
  HybridSelection s = p.select(rts, bes, 0.0, 1);
  EXPECT_TRUE(s.rt.empty());
  EXPECT_EQ(s.be, std::vector<size_t>{0});
  // With 4 BE pages to take, the first RT request (3 pages) fits in 1 + 4; the second would
  // need 6 > 5 and waits; the BE request finds no free page left.
  s = p.select(rts, bes, 0.0, 1, 4);
  EXPECT_EQ(s.rt, std::vector<size_t>{0});
  EXPECT_TRUE(s.be.empty());
}

TEST(HybridPolicy, BatchSizeGrowsWithoutRiskAndHalvesOnRisk) {
  HybridPolicy p({.initial_batch = 4, .batch_step = 4, .max_batch = 12}, per_token_cost());
  const std::vector<HybridCandidate> relaxed = {rt(10.0)};
  p.select(relaxed, {}, 0.0, 100);
  EXPECT_EQ(p.batch_size(), 8);
  p.select(relaxed, {}, 0.0, 100);
  EXPECT_EQ(p.batch_size(), 12);
  p.select(relaxed, {}, 0.0, 100);
  EXPECT_EQ(p.batch_size(), 12);  // capped
  // Each alone makes its 15 ms deadline (10 ms); the second behind the first does not.
  const std::vector<HybridCandidate> tight = {rt(0.015), rt(0.015)};
  const HybridSelection s = p.select(tight, {}, 0.0, 100);
  EXPECT_EQ(s.rt, std::vector<size_t>{0});
  EXPECT_TRUE(s.rt_at_risk);
  EXPECT_EQ(p.batch_size(), 6);  // 12 halved
  p.select(tight, {}, 0.0, 100);
  p.select(tight, {}, 0.0, 100);
  EXPECT_EQ(p.batch_size(), 4);  // never below the initial size
}

// A deadline closer than an iteration of the request alone (targets the hardware cannot meet)
// is lost whatever the batch; like a past one it sets no limit and is no risk, so the batch
// keeps its size and fills. Honouring it ran one request per step.
TEST(HybridPolicy, UnattainableDeadlinesDoNotShrinkTheBatch) {
  HybridPolicy p({.initial_batch = 4, .batch_step = 4, .max_batch = 64}, per_token_cost());
  // 10 ms per decode token; every deadline 5 ms away.
  const std::vector<HybridCandidate> rts = {rt(0.005), rt(0.005), rt(0.005), rt(0.005)};
  const std::vector<HybridCandidate> bes = {be(0), be(0), be(0), be(0)};
  const HybridSelection s = p.select(rts, bes, 0.0, 100);
  EXPECT_EQ(s.rt, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_TRUE(s.be.empty());  // the batch of 4 is full
  EXPECT_FALSE(s.rt_at_risk);
  EXPECT_EQ(p.batch_size(), 8);  // grew

  // A reachable deadline behind them still limits the iteration: 4 unattainable ones (40 ms)
  // and one due in 55 ms fit; a BE request would push the iteration past 55 ms.
  const std::vector<HybridCandidate> mixed = {rt(0.005), rt(0.005), rt(0.005), rt(0.005),
                                              rt(0.055)};
  const HybridSelection m = p.select(mixed, bes, 0.0, 100);
  EXPECT_EQ(m.rt.size(), 5u);
  EXPECT_TRUE(m.be.empty());
  EXPECT_FALSE(m.rt_at_risk);
}

// A prompt whose whole prefill (100 tokens, 100 ms) cannot end before its TTFT deadline (50 ms
// away) has lost it as surely as a late one, and yields to the decodes behind it.
TEST(HybridPolicy, APromptThatCannotMeetItsFirstTokenYields) {
  HybridPolicy p({.initial_batch = 2, .batch_step = 0, .max_batch = 2}, per_token_cost());
  HybridCandidate prompt = rt(0.050);
  prompt.first_token = prompt.prefill = true;
  prompt.tokens = 100;
  const std::vector<HybridCandidate> rts = {prompt, rt(0.5), rt(0.6)};
  const HybridSelection s = p.select(rts, {}, 0.0, 100);
  EXPECT_EQ(s.rt, (std::vector<size_t>{1, 2}));

  // With 150 ms to go it can make it, and runs first.
  HybridCandidate reachable = prompt;
  reachable.deadline = 0.150;
  const std::vector<HybridCandidate> in_time = {reachable, rt(0.5), rt(0.6)};
  EXPECT_EQ(p.select(in_time, {}, 0.0, 100).rt.front(), 0u);
}

// A request already past its deadline runs first but sets no time limit: the batch fills with
// what can still make its own deadline, and nothing counts as a new risk.
TEST(HybridPolicy, LateRequestsRunFirstWithoutShrinkingTheBatch) {
  HybridPolicy p({.initial_batch = 8, .batch_step = 4, .max_batch = 64}, per_token_cost());
  const std::vector<HybridCandidate> rts = {rt(-0.5), rt(10.0), rt(10.0)};
  const std::vector<HybridCandidate> bes = {be(0), be(0)};
  const HybridSelection s = p.select(rts, bes, 0.0, 100);
  EXPECT_EQ(s.rt, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(s.be, (std::vector<size_t>{0, 1}));
  EXPECT_FALSE(s.rt_at_risk);
  EXPECT_EQ(p.batch_size(), 12);
}

// A request whose first token is already late cannot meet its TTFT target any more; it goes
// behind those that still can (EDF's domino effect under overload), while a decode past its
// token deadline keeps its place in front. When the batch has room the late one still runs.
TEST(HybridPolicy, AMissedFirstTokenYieldsToRequestsThatCanStillMeetTheirs) {
  HybridPolicy p({.initial_batch = 2, .batch_step = 4, .max_batch = 2}, per_token_cost());
  HybridCandidate missed = rt(-0.5), waiting = rt(0.3), decoding_late = rt(-0.2);
  missed.first_token = waiting.first_token = true;
  missed.ttft_slo = waiting.ttft_slo = 1.0;  // 0.5 s late: less than one more target
  std::vector<HybridCandidate> rts = {missed, waiting};
  EXPECT_EQ(p.select(rts, {}, 0.0, 100).rt, (std::vector<size_t>{1, 0}));
  rts = {missed, waiting, decoding_late};
  EXPECT_EQ(p.select(rts, {}, 0.0, 100).rt, (std::vector<size_t>{2, 1}));
  rts = {missed, rt(0.4)};  // a decode with time left: the missed first token still runs
  EXPECT_EQ(p.select(rts, {}, 0.0, 100).rt, (std::vector<size_t>{1, 0}));
}

// ... for ever by default; with overdue_after_slos = 1, once a prompt is a whole TTFT target
// past its deadline it is overdue and runs first, so sustained overload cannot starve it.
TEST(HybridPolicy, AMissedFirstTokenIsOverdueOneTargetLaterAndRunsFirst) {
  HybridPolicy p({.initial_batch = 2, .batch_step = 4, .max_batch = 2, .overdue_after_slos = 1},
                 per_token_cost());
  HybridCandidate overdue = rt(-0.5), fresh1 = rt(0.3), fresh2 = rt(0.35);
  overdue.first_token = fresh1.first_token = fresh2.first_token = true;
  overdue.ttft_slo = 0.4;  // late by 0.5 >= 0.4
  fresh1.ttft_slo = fresh2.ttft_slo = 0.4;
  const std::vector<HybridCandidate> rts = {fresh1, fresh2, overdue};
  EXPECT_EQ(p.select(rts, {}, 0.0, 100).rt, (std::vector<size_t>{2, 0}));
  // Without a known target the old rule holds: it yields.
  HybridCandidate unknown = overdue;
  unknown.ttft_slo = 0;
  const std::vector<HybridCandidate> rts2 = {fresh1, fresh2, unknown};
  EXPECT_EQ(p.select(rts2, {}, 0.0, 100).rt, (std::vector<size_t>{0, 1}));
  // Nor by default (overdue_after_slos = 0), however late.
  HybridPolicy by_default({.initial_batch = 2, .batch_step = 4, .max_batch = 2}, per_token_cost());
  EXPECT_EQ(by_default.select(rts, {}, 0.0, 100).rt, (std::vector<size_t>{0, 1}));
}

}  // namespace
}  // namespace blend
