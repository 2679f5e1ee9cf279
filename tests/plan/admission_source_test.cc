// The admission source on hand-built batches, driven as an engine loop drives it: every request
// handed out exactly once, in the plan's order, within the stream's memory; the sampling pass
// first and alone; the way out that hands out the rest.
#include "plan/admission_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cost/cost_model.h"

namespace blend::plan {
namespace {

CostModel llama8b_a100() {
  return CostModel(*find_model_shape_preset("llama-3-8b"), *find_hardware_preset("a100-80g"));
}

// `groups` prompt prefixes of 64 tokens, `per_group` requests each, listed round-robin over the
// groups (file order interleaves them); request i belongs to group i % groups.
std::vector<SourceRequest> interleaved(int groups, int per_group, double output, bool known) {
  std::vector<SourceRequest> out;
  for (int i = 0; i < groups * per_group; ++i) {
    const int g = i % groups;
    SourceRequest r;
    r.request.id = "r" + std::to_string(i);
    for (int k = 0; k < 64; ++k) r.request.prompt.push_back(1000 * (g + 1) + k);
    for (int k = 0; k < 8; ++k) r.request.prompt.push_back(50000 + 10 * i + k);
    r.request.output_tokens = output;
    r.request.output_known = known;
    r.max_output = output;
    out.push_back(std::move(r));
  }
  return out;
}

// Runs `source` to the end as an engine loop would: a request admitted before step k ends in
// step k + `steps - 1` with `length` tokens, reported after that step. Returns the order requests
// were handed out in.
std::vector<int32_t> drain(AdmissionSource& source, int steps = 3, double length = 16) {
  std::vector<int32_t> order;
  std::vector<std::pair<int, int32_t>> running;  // (last step, request)
  for (int step = 0; step < 100000 && (!source.exhausted() || source.in_flight() > 0); ++step) {
    for (int32_t r : source.admit()) {
      order.push_back(r);
      running.emplace_back(step + steps - 1, r);
    }
    std::erase_if(running, [&](const std::pair<int, int32_t>& e) {
      if (e.first > step) return false;
      source.on_finished(e.second, length);
      return true;
    });
  }
  return order;
}

TEST(AdmissionSource, DfsHandsOutEveryRequestOnceGroupByGroup) {
  const CostModel cost = llama8b_a100();
  AdmissionSource source(interleaved(3, 4, 16, true), cost,
                         {.policy = Policy::kDfs, .kv_memory_bytes = 1e12});
  EXPECT_FALSE(source.sampling());
  ASSERT_NE(source.plan(), nullptr);
  const std::vector<int32_t> first = source.admit();
  ASSERT_EQ(first.size(), 12u) << "memory for all: everything at once";
  EXPECT_TRUE(source.exhausted());
  EXPECT_EQ(source.in_flight(), 12);
  // DFS of the prefix tree: each group's requests together, groups in order of arrival.
  for (size_t k = 0; k < first.size(); ++k) EXPECT_EQ(first[k] % 3, static_cast<int32_t>(k / 4));
  EXPECT_TRUE(source.admit().empty());
  for (int32_t r : first) source.on_finished(r, 16.0);
  EXPECT_EQ(source.in_flight(), 0);
  EXPECT_GT(source.sharing_optimal(), 0.5);
}

TEST(AdmissionSource, TheStreamAdmitsWithinItsMemoryAndMoreAsRequestsEnd) {
  const CostModel cost = llama8b_a100();
  // Room for the reservations of about three requests: (72 + 8) tokens each.
  const double one = (72 + 16 / 2.0) * cost.kv_bytes_per_token_per_device();
  AdmissionSource source(interleaved(2, 5, 16, true), cost,
                         {.policy = Policy::kDfs, .kv_memory_bytes = 3.5 * one});
  // DFS: group 0 (the even requests), then group 1.
  const std::vector<int32_t> first = source.admit();
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_TRUE(source.admit().empty()) << "no room until one ends";
  source.on_finished(first[0], 16.0);
  EXPECT_EQ(source.admit(), std::vector<int32_t>{6});
  std::vector<int32_t> order = {0, 2, 4, 6};
  source.on_finished(2, 16.0);
  source.on_finished(4, 16.0);
  source.on_finished(6, 16.0);
  const std::vector<int32_t> rest = drain(source);
  order.insert(order.end(), rest.begin(), rest.end());
  EXPECT_EQ(order, (std::vector<int32_t>{0, 2, 4, 6, 8, 1, 3, 5, 7, 9}));
}

TEST(AdmissionSource, FcfsHandsEverythingToTheEngineInTheGivenOrder) {
  // fcfs is the engine's own admission (its scheduler's FCFS with peak-memory estimates), as in
  // `blend batch --policy fcfs`: no reservations, however little memory there is.
  const CostModel cost = llama8b_a100();
  const double one = (72 + 16 / 2.0) * cost.kv_bytes_per_token_per_device();
  AdmissionSource source(interleaved(2, 5, 16, true), cost,
                         {.policy = Policy::kFcfs, .kv_memory_bytes = 3.5 * one});
  std::vector<int32_t> expected(10);
  for (int32_t i = 0; i < 10; ++i) expected[static_cast<size_t>(i)] = i;
  EXPECT_EQ(source.admit(), expected);
  EXPECT_TRUE(source.exhausted());
}

// --baselines-paced: a baseline's step budget follows capacity pacing's rule over the work left
// (capacity x dense tokens / token-steps, at most dense / longest output, at least a token per
// running request), here with exact arithmetic (granularity 1): 100 requests of 72 distinct
// prompt tokens and 100 known output tokens, 1,000 tokens of KV.
TEST(AdmissionSource, PacedBaselinesTakeTheBudgetRuleFromTheWorkLeft) {
  const CostModel cost = llama8b_a100();
  const double memory = 1000 * cost.kv_bytes_per_token_per_device();
  auto source_with = [&](bool paced, bool step_budget) {
    PlannerKnobs knobs{.pacing = {.granularity = 1, .step_budget = step_budget},
                       .baselines_paced = paced};
    return std::make_unique<AdmissionSource>(
        interleaved(100, 1, 100, true), cost,
        SourceOptions{.policy = Policy::kFcfs, .kv_memory_bytes = memory, .planner = knobs});
  };
  auto source = source_with(true, true);
  ASSERT_EQ(source->admit().size(), 100u);  // fcfs hands out everything at once
  // Step 0, nothing started when paced: dense 100 x 172, token-steps 100 x (72 x 100 + 100^2/2):
  // floor(1000 x 17,200 / 1,220,000) = 14 (the longest output allows 172).
  EXPECT_EQ(source->step_token_budget(), 14);
  for (int32_t r = 0; r < 100; ++r) source->on_progress(r, 50);
  source->admit();
  // Halfway: 5,000 dense tokens over 735,000 token-steps gives 6, but 100 requests decode.
  EXPECT_EQ(source->step_token_budget(), 100);
  for (int32_t r = 0; r < 96; ++r) source->on_finished(r, 100);
  source->admit();
  // Four left: 200 / 29,400 x 1,000 = 6, the longest output's 50 steps allow 4.
  EXPECT_EQ(source->step_token_budget(), 4);
  // Unpaced, or with the budget rule dropped (--pacing-without budget): the engine's own.
  auto unpaced = source_with(false, true);
  unpaced->admit();
  EXPECT_EQ(unpaced->step_token_budget(), std::nullopt);
  auto no_rule = source_with(true, false);
  no_rule->admit();
  EXPECT_EQ(no_rule->step_token_budget(), 2048);
}

TEST(AdmissionSource, TheDualScannerHandsOutEveryRequestExactlyOnce) {
  const CostModel cost = llama8b_a100();
  std::vector<SourceRequest> requests = interleaved(4, 30, 200, true);
  for (size_t i = 0; i < requests.size(); i += 3) {  // some compute-heavy ones
    requests[i].request.output_tokens = 4;
    requests[i].max_output = 4;
  }
  AdmissionSource source(std::move(requests), cost,
                         {.policy = Policy::kBlend, .kv_memory_bytes = 2e8});
  std::vector<int32_t> order = source.admit();
  EXPECT_GT(order.size(), 0u);
  EXPECT_LT(order.size(), 60u) << "the memory holds a part of the batch";
  for (int32_t r : order) source.on_finished(r, 100.0);
  const std::vector<int32_t> rest = drain(source, 5);
  order.insert(order.end(), rest.begin(), rest.end());
  EXPECT_EQ(order.size(), 120u);
  EXPECT_EQ(std::set<int32_t>(order.begin(), order.end()).size(), 120u);
  EXPECT_TRUE(source.exhausted());
  EXPECT_EQ(source.in_flight(), 0);
  EXPECT_TRUE(source.step_token_budget().has_value()) << "capacity pacing sets a step budget";
}

TEST(AdmissionSource, TheSamplingPassRunsFirstAndAloneThenEstimatesTheRest) {
  const CostModel cost = llama8b_a100();
  // Unknown lengths (the callers assume 100); max_tokens 50 caps every estimate.
  std::vector<SourceRequest> requests = interleaved(2, 10, 100, false);
  for (SourceRequest& r : requests) r.max_output = 50;
  AdmissionSource source(
      std::move(requests), cost,
      {.policy = Policy::kDfs, .kv_memory_bytes = 1e12, .sample_fraction = 0.2, .sample_seed = 3});
  EXPECT_TRUE(source.sampling());
  EXPECT_EQ(source.plan(), nullptr);
  const std::vector<int32_t> sampled = source.admit();
  ASSERT_EQ(sampled.size(), 4u);
  EXPECT_EQ(source.sampled_requests(), 4);
  for (int32_t r : sampled) EXPECT_FALSE(source.streamed(r));
  EXPECT_TRUE(source.admit().empty()) << "nothing else while the samples run";
  for (size_t k = 0; k + 1 < sampled.size(); ++k) source.on_finished(sampled[k], 30.0);
  EXPECT_TRUE(source.admit().empty()) << "one sample still runs";
  source.on_finished(sampled.back(), 30.0);
  const std::vector<int32_t> rest = source.admit();
  EXPECT_FALSE(source.sampling());
  ASSERT_NE(source.plan(), nullptr);
  EXPECT_EQ(rest.size(), 16u);
  for (int32_t r : rest) {
    EXPECT_TRUE(source.streamed(r));
    EXPECT_EQ(std::count(sampled.begin(), sampled.end(), r), 0);
  }
  // The samples' 30 tokens stand for the others' (not the assumed 100, nor the cap of 50).
  EXPECT_DOUBLE_EQ(source.plan()->root.output_tokens, 16 * 30.0);
  EXPECT_TRUE(source.exhausted());
}

TEST(AdmissionSource, AdmitRestHandsOutWhatIsLeftAndStops) {
  const CostModel cost = llama8b_a100();
  const double one = (72 + 16 / 2.0) * cost.kv_bytes_per_token_per_device();
  AdmissionSource source(interleaved(2, 3, 16, true), cost,
                         {.policy = Policy::kDfs, .kv_memory_bytes = 1.5 * one});
  const std::vector<int32_t> first = source.admit();
  ASSERT_EQ(first, std::vector<int32_t>{0});
  const std::vector<int32_t> rest = source.admit_rest();
  EXPECT_EQ(rest, (std::vector<int32_t>{1, 2, 3, 4, 5}));  // the rest in the given order
  EXPECT_TRUE(source.exhausted());
  EXPECT_EQ(source.in_flight(), 6);
  EXPECT_FALSE(source.step_token_budget().has_value());
  for (int32_t r = 0; r < 6; ++r) source.on_finished(r, 16.0);
  EXPECT_TRUE(source.admit().empty());
  EXPECT_EQ(source.in_flight(), 0);
}

}  // namespace
}  // namespace blend::plan
