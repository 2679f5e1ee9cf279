// The planner on hand-built batches: trie shape, sharing, layer sort, the split threshold of
// Alg. 2, output-length estimation and the dual scanner's memory partition (BlendServe Fig. 6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>
#include <set>

#include "cost/cost_model.h"
#include "plan/admission.h"
#include "plan/planner.h"
#include "plan/prefix_tree.h"

namespace blend::plan {
namespace {

CostModel llama8b_a100() {
  return CostModel(*find_model_shape_preset("llama-3-8b"), *find_hardware_preset("a100-80g"));
}

PlanRequest req(std::string id, std::vector<TokenId> prompt, double output = 16) {
  PlanRequest r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.output_tokens = output;
  return r;
}

std::vector<TokenId> tokens(TokenId first, int count) {
  std::vector<TokenId> t(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The prompt spelled by the path from the root to a request's leaf.
std::vector<TokenId> path_tokens(const PrefixTree& tree, int32_t request) {
  std::vector<int32_t> path;
  for (int32_t n = tree.leaf_of(request); n != PrefixTree::kRoot; n = tree.node(n).parent)
    path.push_back(n);
  std::vector<TokenId> out;
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    const auto seg = tree.segment(*it);
    out.insert(out.end(), seg.begin(), seg.end());
  }
  return out;
}

TEST(PrefixTree, HandBuiltShapeAndDfsOrder) {
  const std::vector<PlanRequest> rs = {req("a", {1, 2, 3, 4}), req("b", {1, 2, 3, 5}),
                                       req("c", {1, 2, 9}),    req("d", {7}),
                                       req("e", {1, 2, 3, 4}), req("f", {1, 2})};
  const PrefixTree tree(rs);
  EXPECT_EQ(tree.total_prompt_tokens(), 18);
  EXPECT_EQ(tree.unique_prompt_tokens(), 7);  // [1 2] [3] [4] [5] [9] [7]
  EXPECT_DOUBLE_EQ(tree.optimal_sharing_ratio(), 1.0 - 7.0 / 18.0);
  EXPECT_EQ(tree.dfs_order(), (std::vector<int32_t>{0, 4, 1, 2, 5, 3}));
  for (int32_t r = 0; r < 6; ++r)
    EXPECT_EQ(path_tokens(tree, r), rs[static_cast<size_t>(r)].prompt);
}

TEST(PrefixTree, RandomPromptsMatchDistinctPrefixCount) {
  std::mt19937 rng(7);
  std::vector<PlanRequest> rs;
  for (int i = 0; i < 300; ++i) {
    std::vector<TokenId> p(rng() % 12);
    for (TokenId& t : p) t = static_cast<TokenId>(rng() % 3);  // tiny alphabet: much sharing
    rs.push_back(req(std::to_string(i), p));
  }
  const PrefixTree tree(rs);
  std::set<std::vector<TokenId>> prefixes;
  for (const PlanRequest& r : rs)
    for (size_t k = 1; k <= r.prompt.size(); ++k)
      prefixes.insert(
          std::vector<TokenId>(r.prompt.begin(), r.prompt.begin() + static_cast<long>(k)));
  EXPECT_EQ(tree.unique_prompt_tokens(), static_cast<int64_t>(prefixes.size()));
  for (int32_t r = 0; r < 300; ++r)
    EXPECT_EQ(path_tokens(tree, r), rs[static_cast<size_t>(r)].prompt);
  std::vector<int32_t> order = tree.dfs_order();
  std::sort(order.begin(), order.end());
  for (int32_t r = 0; r < 300; ++r) EXPECT_EQ(order[static_cast<size_t>(r)], r);
}

TEST(PrefixTree, ModelsShareNoPrefix) {
  // The random-prompt check above, with each prompt on one of three models: the unique tokens
  // are the distinct (model, prefix) pairs, and every path spells its own prompt.
  std::mt19937 rng(11);
  std::vector<PlanRequest> rs;
  for (int i = 0; i < 300; ++i) {
    std::vector<TokenId> p(1 + rng() % 10);
    for (TokenId& t : p) t = static_cast<TokenId>(rng() % 3);
    rs.push_back(req(std::to_string(i), p));
    rs.back().model = static_cast<ModelId>(rng() % 3);
  }
  const PrefixTree tree(rs);
  std::set<std::pair<ModelId, std::vector<TokenId>>> prefixes;
  for (const PlanRequest& r : rs)
    for (size_t k = 1; k <= r.prompt.size(); ++k)
      prefixes.insert({r.model, std::vector<TokenId>(r.prompt.begin(),
                                                     r.prompt.begin() + static_cast<long>(k))});
  EXPECT_EQ(tree.unique_prompt_tokens(), static_cast<int64_t>(prefixes.size()));
  for (int32_t r = 0; r < 300; ++r)
    EXPECT_EQ(path_tokens(tree, r), rs[static_cast<size_t>(r)].prompt);
  // Below each root child, one model only.
  for (int32_t child : tree.node(PrefixTree::kRoot).children) {
    std::set<ModelId> models;
    for (int32_t n : tree.preorder(child))
      if (tree.node(n).request >= 0)
        models.insert(rs[static_cast<size_t>(tree.node(n).request)].model);
    EXPECT_EQ(models.size(), 1u);
  }
}

TEST(Planner, LayerSortPutsComputeIntensiveGroupFirst) {
  const CostModel cost = llama8b_a100();
  // Memory-intensive group (long outputs) arrives first; compute-intensive second.
  std::vector<PlanRequest> rs;
  for (int i = 0; i < 3; ++i)
    rs.push_back(req("m" + std::to_string(i), concat(tokens(1000, 64), {i}), 4000));
  for (int i = 0; i < 3; ++i)
    rs.push_back(req("c" + std::to_string(i), concat(tokens(5000, 64), {i}), 2));
  PrefixTree tree(rs);
  PlanOptions options;
  const Plan plan = make_plan(tree, cost, options);
  const std::vector<int32_t> order = plan.order();
  ASSERT_EQ(order.size(), 6u);
  for (size_t i = 0; i < 3; ++i) EXPECT_GE(order[i], 3) << "compute-intensive requests lead";
  EXPECT_TRUE(plan.density_monotone);
  for (size_t g = 1; g < plan.groups.size(); ++g)
    EXPECT_GE(plan.groups[g - 1].stats.density(), plan.groups[g].stats.density());
  // The DFS baseline keeps arrival order.
  PrefixTree tree2(rs);
  options.policy = Policy::kDfs;
  EXPECT_EQ(make_plan(tree2, cost, options).order(), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(Planner, SplitThresholdIsDividedAmongChildren) {
  const CostModel cost = llama8b_a100();
  // Prefix A (50 tokens): two tiny-output requests and one huge-output outlier; prefix B
  // (50 tokens): two medium requests. Splitting A costs 50 x 3 = 150 recomputed tokens, and
  // the root hands each of its 2 children t/2, so A splits exactly when t >= 300.
  const std::vector<PlanRequest> rs = {
      req("a0", concat(tokens(100, 50), {1}), 1), req("a1", concat(tokens(100, 50), {2}), 1),
      req("a2", concat(tokens(100, 50), {3}), 20000), req("b0", concat(tokens(900, 50), {1}), 100),
      req("b1", concat(tokens(900, 50), {2}), 100)};
  PlanOptions options;
  options.split_threshold_tokens = 299;
  PrefixTree kept(rs);
  const std::vector<int32_t> whole = make_plan(kept, cost, options).order();
  // A stays whole; the outlier drags its density under B's, so B leads.
  EXPECT_GE(whole.front(), 3);
  options.split_threshold_tokens = 300;
  PrefixTree split(rs);
  const Plan plan = make_plan(split, cost, options);
  const std::vector<int32_t> order = plan.order();
  EXPECT_LE(order.front(), 1) << "tiny-output requests lead once A is split";
  EXPECT_EQ(order.back(), 2) << "the outlier moves to the memory-intensive end";
  EXPECT_GE(plan.split_nodes, 1);
  // Splitting costs sharing: the planned groups recompute part of A's prefix.
  double unique = 0;
  for (const RequestGroup& g : plan.groups) unique += g.stats.unique_tokens;
  EXPECT_GT(unique, static_cast<double>(split.unique_prompt_tokens()));
  EXPECT_LT(plan.planned_sharing_ratio, plan.optimal_sharing_ratio);
  // Left to choose t, the planner keeps 99% of s_o (§5.2).
  PrefixTree chosen(rs);
  const Plan kept99 = make_plan(chosen, cost, PlanOptions{});
  EXPECT_GE(kept99.planned_sharing_ratio, 0.99 * kept99.optimal_sharing_ratio);
  PlanOptions lenient;
  lenient.min_sharing_fraction = 0.5;
  lenient.split_budget = 10;  // t = 10 x the saved tokens
  PrefixTree loose(rs);
  const Plan relocated = make_plan(loose, cost, lenient);
  EXPECT_GE(relocated.planned_sharing_ratio, 0.5 * relocated.optimal_sharing_ratio);
  EXPECT_EQ(relocated.order().back(), 2);
}

TEST(Planner, SharingOfAnOrderDependsOnCacheOnlyWhenLimited) {
  std::vector<PlanRequest> rs;
  for (int i = 0; i < 8; ++i)  // interleaved arrivals of two 100-token prefixes
    rs.push_back(req(std::to_string(i), concat(tokens(i % 2 ? 100 : 1000, 100), {i}), 10));
  const PrefixTree tree(rs);
  std::vector<int32_t> fcfs(8);
  for (int32_t i = 0; i < 8; ++i) fcfs[static_cast<size_t>(i)] = i;
  const std::vector<int32_t> dfs = tree.dfs_order();
  const double unlimited = 1e18;
  EXPECT_DOUBLE_EQ(sharing_ratio_of_order(tree, fcfs, unlimited), tree.optimal_sharing_ratio());
  EXPECT_DOUBLE_EQ(sharing_ratio_of_order(tree, dfs, unlimited), tree.optimal_sharing_ratio());
  const double one_prefix = 110;  // room for one prefix and a suffix
  EXPECT_NEAR(sharing_ratio_of_order(tree, dfs, one_prefix), tree.optimal_sharing_ratio(), 1e-12);
  EXPECT_LT(sharing_ratio_of_order(tree, fcfs, one_prefix), 0.01);
}

TEST(Planner, OutputLengthsFromNearestSampledSubtree) {
  std::vector<PlanRequest> rs = {
      req("a0", concat(tokens(100, 20), {1})), req("a1", concat(tokens(100, 20), {2})),
      req("a2", concat(tokens(100, 20), {3})), req("b0", concat(tokens(500, 20), {1})),
      req("b1", concat(tokens(500, 20), {2})), req("k", concat(tokens(500, 20), {3})),
      req("c0", concat(tokens(900, 20), {1}))};
  rs[5].output_tokens = 7;
  rs[5].output_known = true;
  const PrefixTree tree(rs);
  std::vector<std::optional<double>> sampled(rs.size());
  sampled[0] = 10;
  sampled[2] = 30;
  sampled[6] = 100;
  const std::vector<OutputEstimate> d = estimate_output_lengths(tree, sampled, 256);
  EXPECT_DOUBLE_EQ(d[0].tokens, 10);                         // sampled: its own length
  EXPECT_DOUBLE_EQ(d[1].tokens, 20);                         // siblings' mean
  EXPECT_DOUBLE_EQ(d[3].tokens, 140.0 / 3.0);                // no sampled sibling: the root's mean
  EXPECT_DOUBLE_EQ(d[5].tokens, 7);                          // known length wins
  for (const OutputEstimate& e : d) EXPECT_EQ(e.spread, 0);  // 3 samples: too few for a spread
  const std::vector<OutputEstimate> none =
      estimate_output_lengths(tree, std::vector<std::optional<double>>(rs.size()), 256);
  EXPECT_DOUBLE_EQ(none[1].tokens, 256);  // nothing sampled: the fallback
}

TEST(Planner, EstimatedLengthsCarryTheSpreadOfTheirSamples) {
  // Two families under different prefixes; family "a" has 9 sampled requests (lengths 10..90),
  // family "b" only 2, so b's spread comes from the root's 11 samples.
  std::vector<PlanRequest> rs;
  for (int i = 0; i < 10; ++i)
    rs.push_back(req("a" + std::to_string(i), concat(tokens(100, 20), {i + 1})));
  for (int i = 0; i < 3; ++i)
    rs.push_back(req("b" + std::to_string(i), concat(tokens(500, 20), {i + 1})));
  const PrefixTree tree(rs);
  std::vector<std::optional<double>> sampled(rs.size());
  std::vector<double> a_lengths, all_lengths;
  for (int i = 0; i < 9; ++i) {
    sampled[static_cast<size_t>(i)] = 10.0 * (i + 1);
    a_lengths.push_back(10.0 * (i + 1));
  }
  sampled[10] = 400;
  sampled[11] = 600;
  all_lengths = a_lengths;
  all_lengths.push_back(400);
  all_lengths.push_back(600);
  auto stddev = [](const std::vector<double>& xs) {
    double mean = 0, squares = 0;
    for (double x : xs) mean += x / static_cast<double>(xs.size());
    for (double x : xs) squares += (x - mean) * (x - mean) / static_cast<double>(xs.size());
    return std::sqrt(squares);
  };
  const std::vector<OutputEstimate> d = estimate_output_lengths(tree, sampled, 256);
  EXPECT_DOUBLE_EQ(d[9].tokens, 50);  // the mean of a's samples
  EXPECT_NEAR(d[9].spread, stddev(a_lengths), 1e-9);
  EXPECT_DOUBLE_EQ(d[12].tokens, 500);                   // the mean of b's two samples...
  EXPECT_NEAR(d[12].spread, stddev(all_lengths), 1e-9);  // ...the spread of the root's eleven
}

TEST(DualScanner, MemoryPartitionOfFigure6) {
  // BlendServe Fig. 6: 60 GB, rho(L) = 3.73, rho(R) = 0.096, root 1.27.
  const double kGB = 1e9;
  const MemoryPartition m =
      partition_memory(60 * kGB, 1.27, 3.73, 0.096, 500, 50, 100, 4000, 131072);
  EXPECT_NEAR(m.memory_left / kGB, 19.38, 0.01);
  EXPECT_NEAR(m.memory_right / kGB, 40.62, 0.01);
  EXPECT_NEAR(m.memory_left * 3.73 + m.memory_right * 0.096, 60 * kGB * 1.27, 1e-3 * kGB);
  EXPECT_TRUE(m.note.empty());
  // N = M / ((p + d/2) H_kv L 4), C = N p / d.
  EXPECT_NEAR(m.requests_left, m.memory_left / (525.0 * 131072), 1e-9);
  EXPECT_NEAR(m.prefill_budget_left, m.requests_left * 500 / 50, 1e-9);
  EXPECT_NEAR(m.prefill_budget_right, m.requests_right * 100 / 4000, 1e-9);
  // Root density outside [rho(R), rho(L)]: everything to one side, and said so.
  const MemoryPartition hi = partition_memory(60 * kGB, 5, 3.73, 0.096, 500, 50, 100, 4000, 131072);
  EXPECT_DOUBLE_EQ(hi.memory_left, 60 * kGB);
  EXPECT_DOUBLE_EQ(hi.memory_right, 0);
  EXPECT_FALSE(hi.note.empty());
  const MemoryPartition lo =
      partition_memory(60 * kGB, 0.05, 3.73, 0.096, 500, 50, 100, 4000, 131072);
  EXPECT_DOUBLE_EQ(lo.memory_right, 60 * kGB);
}

TEST(DualScanner, AdmitsFromBothEndsAndEveryRequestOnce) {
  const CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs;
  for (int i = 0; i < 40; ++i)
    rs.push_back(
        req(std::to_string(i), concat(tokens(i % 2 ? 100 : 5000, 200), {i}), i % 2 ? 3000 : 4));
  PrefixTree tree(rs);
  const Plan plan = make_plan(tree, cost, PlanOptions{});
  ASSERT_GE(plan.groups.size(), 2u);
  const double memory = 20 * kv_reservation_bytes(cost, rs[1]);
  DualScanner scanner(plan, rs, cost, memory, 128, PacingOptions{.enabled = false});  // Alg. 3
  const MemoryPartition& first = scanner.partition_history().front();
  EXPECT_NEAR(first.memory_left + first.memory_right, memory, memory * 1e-9);
  EXPECT_GT(first.memory_left, 0);
  EXPECT_GT(first.memory_right, 0);
  std::deque<int32_t> running;
  std::vector<int> seen(rs.size(), 0);
  bool left = false, right = false;
  while (!scanner.exhausted()) {
    if (auto r = scanner.next()) {
      ++seen[static_cast<size_t>(*r)];
      (scanner.last_side() == Side::kLeft ? left : right) = true;
      running.push_back(*r);
    } else {
      ASSERT_FALSE(running.empty()) << "scanner stalled with nothing running";
      scanner.on_finished(running.front());
      running.pop_front();
    }
  }
  EXPECT_TRUE(left && right);
  for (int s : seen) EXPECT_EQ(s, 1);
}

TEST(DualScanner, UnderestimatedRequestMovesToTheRightSide) {
  const CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs;
  for (int i = 0; i < 10; ++i)
    rs.push_back(
        req(std::to_string(i), concat(tokens(i % 2 ? 100 : 5000, 200), {i}), i % 2 ? 3000 : 4));
  PrefixTree tree(rs);
  const Plan plan = make_plan(tree, cost, PlanOptions{});
  DualScanner scanner(plan, rs, cost, 1e12, 128, PacingOptions{.enabled = false});  // Alg. 3
  const std::optional<int32_t> first = scanner.next();
  ASSERT_TRUE(first);
  ASSERT_EQ(scanner.last_side(), Side::kLeft);
  const double left_before = scanner.reserved_bytes(Side::kLeft);
  const double right_before = scanner.reserved_bytes(Side::kRight);
  EXPECT_GT(left_before, 0);
  scanner.on_progress(*first, 2);  // within its estimate: nothing changes
  EXPECT_DOUBLE_EQ(scanner.reserved_bytes(Side::kLeft), left_before);
  scanner.on_progress(*first, 5000);  // far past it
  EXPECT_DOUBLE_EQ(scanner.reserved_bytes(Side::kLeft), 0);
  const double footprint =
      (static_cast<double>(rs[static_cast<size_t>(*first)].prompt.size()) + 5000) *
      cost.kv_bytes_per_token_per_device();
  EXPECT_NEAR(scanner.reserved_bytes(Side::kRight) - right_before, footprint, 1e-6 * footprint);
  scanner.on_finished(*first);
  EXPECT_NEAR(scanner.reserved_bytes(Side::kRight), right_before, 1e-6 * footprint);
}

}  // namespace
}  // namespace blend::plan

namespace blend::plan {
namespace {

// Requests with prompts of their own (no sharing): `n` of (p, d) starting at id `first`.
void add_unique(std::vector<PlanRequest>& rs, int n, int prompt, double output) {
  for (int k = 0; k < n; ++k) {
    const auto i = static_cast<TokenId>(rs.size());
    rs.push_back(req(std::to_string(i), tokens(1'000'000 + i * 10'000, prompt), output));
  }
}

// 2,000 compute-intensive requests (1,000 + 100 tokens) and 4 memory-intensive ones (50 + 2,000),
// planned for Llama-3-8B on an A100.
struct TwoSidedWork {
  CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs = [] {
    std::vector<PlanRequest> out;
    add_unique(out, 2000, 1000, 100);  // compute-intensive
    add_unique(out, 4, 50, 2000);      // memory-intensive (the longest: 2000 steps)
    return out;
  }();
  PrefixTree tree{rs};
  Plan plan = make_plan(tree, cost, PlanOptions{});
  double kv = cost.kv_bytes_per_token_per_device();
};

TEST(CapacityPacing, StepBudgetSpreadsTheDenseTokensOverTheStepsKvAllows) {
  const TwoSidedWork w;
  const double dense = 2000 * 1100.0 + 4 * 2050.0;
  const double steps_right = 4 * (50.0 * 2000 + 2000.0 * 2000 / 2);
  const double steps_all = 2000 * (1000.0 * 100 + 100.0 * 100 / 2) + steps_right;
  std::vector<int32_t> budgets;
  for (const double capacity_tokens : {100'000.0, 1'000'000.0}) {
    DualScanner scanner(w.plan, w.rs, w.cost, capacity_tokens * w.kv, 128, PacingOptions{});
    scanner.on_step(0);
    budgets.push_back(scanner.pacing().step_tokens);
    // b = M D / (token-steps) rounded down to a multiple of 128, at most D / (longest output)
    // rounded up to one.
    const double b = std::min(std::floor(capacity_tokens * dense / steps_all / 128) * 128,
                              std::ceil(dense / 2000 / 128) * 128);
    const double expected = std::clamp(b, 128.0, 2048.0);
    EXPECT_EQ(scanner.pacing().step_tokens, expected) << capacity_tokens;
    ASSERT_TRUE(scanner.step_token_budget());
    EXPECT_EQ(*scanner.step_token_budget(), scanner.pacing().step_tokens);
    EXPECT_NEAR(scanner.pacing().memory_right, steps_right * w.kv * expected / dense,
                1e-9 * scanner.pacing().memory_right);
    EXPECT_TRUE(scanner.memory_intensive(2003));
    EXPECT_FALSE(scanner.memory_intensive(0));
  }
  // By hand: 100K tokens of KV give b = 1,011 -> 896; with 1M the longest request binds
  // (2,208,200 / 2000 = 1,104 -> 1,152), below the capacity's 10,111.
  EXPECT_EQ(budgets, (std::vector<int32_t>{896, 1152}));
  // Without pacing the engine keeps its own budget.
  DualScanner unpaced(w.plan, w.rs, w.cost, 1e6 * w.kv, 128, PacingOptions{.enabled = false});
  unpaced.on_step(0);
  EXPECT_FALSE(unpaced.step_token_budget());
}

TEST(CapacityPacing, AnEstimatedLengthsSpreadLowersTheStepBudget) {
  const TwoSidedWork w;
  auto paced = [&](const std::vector<PlanRequest>& requests) {
    DualScanner scanner(w.plan, requests, w.cost, 100'000 * w.kv, 128, PacingOptions{});
    scanner.on_step(0);
    return scanner.pacing();
  };
  std::vector<PlanRequest> uncertain = w.rs;
  for (size_t i = 0; i < 2000; ++i) uncertain[i].output_spread = 60;
  const Pacing exact = paced(w.rs), spread = paced(uncertain);
  // The token-steps count d + sigma = 160 for the 2,000 uncertain requests (kSpreadHeadroom 1):
  // 2000 (1000 x 160 + 160^2 / 2) + 4 (50 x 2000 + 2000^2 / 2) = 354.0M, so b = 100K x 2,208,200 /
  // 354.0M = 624 -> 512 (896 with the exact lengths' 218.4M). The dense tokens stay the means'.
  EXPECT_EQ(exact.step_tokens, 896);
  EXPECT_EQ(spread.step_tokens, 512);
  EXPECT_DOUBLE_EQ(spread.remaining_dense, exact.remaining_dense);
  EXPECT_NEAR(spread.remaining_occupancy / w.kv, 354.0e6, 1e3);
}

TEST(CapacityPacing, AnAdmittedPromptStaysDenseWorkUntilItsFirstToken) {
  // Long prompts, short outputs: once the stream has admitted requests whose prompts have not
  // run yet, the budget must still count those prompts (it counted their outputs alone, and a
  // Trace#1 run with outputs capped at 8 tokens crawled through its prompts 128-384 tokens a
  // step).
  const CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs;
  add_unique(rs, 300, 1000, 4);
  add_unique(rs, 4, 50, 2000);
  PrefixTree tree(rs);
  const Plan plan = make_plan(tree, cost, PlanOptions{});
  const double kv = cost.kv_bytes_per_token_per_device();
  DualScanner scanner(plan, rs, cost, 1e6 * kv, 128, PacingOptions{});
  scanner.on_step(0);
  const double before = scanner.pacing().remaining_dense;
  EXPECT_DOUBLE_EQ(before, 300 * 1004.0 + 4 * 2050.0);
  std::vector<int32_t> admitted;
  while (const std::optional<int32_t> r = scanner.next()) admitted.push_back(*r);
  ASSERT_GE(admitted.size(), 2u);
  scanner.on_step(1);  // nothing has run: the same work is left
  EXPECT_DOUBLE_EQ(scanner.pacing().remaining_dense, before);
  // A request with a first token has its prompt behind it: its output's rest is left.
  const auto first = static_cast<size_t>(admitted[0]);
  const double prompt = static_cast<double>(rs[first].prompt.size());
  scanner.on_progress(admitted[0], 1);
  scanner.on_step(2);
  EXPECT_DOUBLE_EQ(scanner.pacing().remaining_dense, before - prompt - 1);
}

TEST(CapacityPacing, ASequentialEngineComputesEveryAdmittedPromptAtOnce) {
  // Steps run one after another price a prompt token the same in any step: the budget covers
  // every prompt the stream has admitted and a token for every request decoding, while an
  // overlapped engine keeps the paced budget and the prompts wait (PacingOptions).
  const TwoSidedWork w;
  const PacingOptions wide{.max_step_tokens = 1 << 20};
  PacingOptions sequential = wide;
  sequential.sequential_steps = true;
  DualScanner overlapped_scanner(w.plan, w.rs, w.cost, 1e6 * w.kv, 128, wide);
  DualScanner scanner(w.plan, w.rs, w.cost, 1e6 * w.kv, 128, sequential);
  for (DualScanner* s : {&overlapped_scanner, &scanner}) s->on_step(0);
  // Nothing admitted yet: both pace on the work left (1,152 tokens: the longest request binds).
  EXPECT_EQ(scanner.pacing().step_tokens, 1152);
  EXPECT_EQ(overlapped_scanner.pacing().step_tokens, 1152);
  std::vector<int32_t> admitted;
  while (const std::optional<int32_t> r = scanner.next()) admitted.push_back(*r);
  while (overlapped_scanner.next()) {
  }
  double prompts = 0;
  for (int32_t r : admitted)
    prompts += static_cast<double>(w.rs[static_cast<size_t>(r)].prompt.size());
  ASSERT_GT(prompts, 1152);  // more than one paced step's worth went out
  ASSERT_TRUE(scanner.step_token_budget() && overlapped_scanner.step_token_budget());
  EXPECT_EQ(*scanner.step_token_budget(), std::ceil(prompts / 128) * 128);
  EXPECT_EQ(*overlapped_scanner.step_token_budget(), 1152);
  // Once every admitted request has its first token, each needs one token a step; a request that
  // ends before its first token takes its prompt out of the floor as well.
  for (size_t k = 1; k < admitted.size(); ++k) scanner.on_progress(admitted[k], 1);
  scanner.on_finished(admitted[0]);
  scanner.on_step(1);
  const double decoding = static_cast<double>(admitted.size() - 1);
  const double budget = *scanner.step_token_budget();
  EXPECT_GE(budget, std::ceil(decoding / 128) * 128);
  EXPECT_LT(budget, std::ceil(prompts / 128) * 128);
  EXPECT_EQ(budget,
            std::max<double>(scanner.pacing().step_tokens, std::ceil(decoding / 128) * 128));
}

struct PacedRun {
  int64_t steps = 0;
  double max_right_tokens = 0;  // the memory-intensive requests' real footprint, at its highest
  std::vector<int32_t> admitted;
  bool shorter_before_longer = false;  // a memory-intensive request passed a longer one
  std::vector<int64_t> right_ends;     // the step each memory-intensive request ended at
  std::vector<int32_t> right_ended;    // and which request that was
  size_t max_right_running = 0;        // memory-intensive requests running at once, at most
};

// An engine stand-in: every running request makes one token a step and ends at its output.
PacedRun run_paced(DualScanner& scanner, const std::vector<PlanRequest>& rs) {
  PacedRun out;
  std::vector<double> generated(rs.size(), 0);
  std::vector<int32_t> running;
  std::multiset<double> waiting_right;
  for (size_t i = 0; i < rs.size(); ++i)
    if (scanner.memory_intensive(static_cast<int32_t>(i)))
      waiting_right.insert(rs[i].output_tokens);
  for (; !scanner.exhausted() || !running.empty(); ++out.steps) {
    if (out.steps > 1'000'000) {
      ADD_FAILURE() << "no end";
      break;
    }
    scanner.on_step(out.steps);
    while (auto r = scanner.next()) {
      const auto i = static_cast<size_t>(*r);
      running.push_back(*r);
      out.admitted.push_back(*r);
      if (scanner.memory_intensive(*r)) {
        if (rs[i].output_tokens < *waiting_right.rbegin()) out.shorter_before_longer = true;
        waiting_right.erase(waiting_right.find(rs[i].output_tokens));
      }
    }
    double right_tokens = 0;
    size_t right_running = 0;
    for (int32_t r : running) {
      const auto i = static_cast<size_t>(r);
      scanner.on_progress(r, ++generated[i]);
      if (scanner.memory_intensive(r)) {
        right_tokens += static_cast<double>(rs[i].prompt.size()) + generated[i];
        ++right_running;
      }
    }
    out.max_right_tokens = std::max(out.max_right_tokens, right_tokens);
    out.max_right_running = std::max(out.max_right_running, right_running);
    for (size_t k = running.size(); k-- > 0;) {
      const auto i = static_cast<size_t>(running[k]);
      if (generated[i] < rs[i].output_tokens) continue;
      if (scanner.memory_intensive(running[k])) {
        out.right_ends.push_back(out.steps);
        out.right_ended.push_back(running[k]);
      }
      scanner.on_finished(running[k]);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return out;
}

TEST(CapacityPacing, MemoryIntensiveRequestsStayWithinTheirProjectedPeak) {
  const CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs;
  add_unique(rs, 40, 2000, 8);
  for (int k = 0; k < 8; ++k) add_unique(rs, 1, 50, 1000 + 400 * k);
  PrefixTree tree(rs);
  const Plan plan = make_plan(tree, cost, PlanOptions{});
  const double kv = cost.kv_bytes_per_token_per_device();
  // 8,000 tokens: all eight long requests' average footprints (10,000 tokens) do not fit, and
  // started together they would peak at 19,600.
  const double capacity_tokens = 8000;
  DualScanner scanner(plan, rs, cost, capacity_tokens * kv, 128, PacingOptions{});
  const PacedRun run = run_paced(scanner, rs);
  std::vector<int> seen(rs.size(), 0);
  for (int32_t r : run.admitted) ++seen[static_cast<size_t>(r)];
  for (int s : seen) EXPECT_EQ(s, 1);
  EXPECT_LE(run.max_right_tokens, capacity_tokens);
  EXPECT_GT(run.max_right_tokens, capacity_tokens / 2);  // and it does use the memory
  // The longest memory-intensive request (the critical path) is the first one handed out.
  for (int32_t r : run.admitted)
    if (scanner.memory_intensive(r)) {
      EXPECT_EQ(rs[static_cast<size_t>(r)].output_tokens, 1000 + 400 * 7);
      break;
    }
  // A shorter one fills a gap the longer ones leave before they peak.
  EXPECT_TRUE(run.shorter_before_longer);
}

// The first `count` of `ends`, in order, lie at least half a spacing apart.
void expect_first_ends_apart(std::vector<int64_t> ends, size_t count, double spacing) {
  std::sort(ends.begin(), ends.end());
  ASSERT_GE(ends.size(), count);
  for (size_t k = 1; k < count; ++k)
    EXPECT_GE(static_cast<double>(ends[k] - ends[k - 1]), spacing / 2)
        << "ends " << ends[k - 1] << " and " << ends[k] << ", spacing " << spacing;
}

TEST(CapacityPacing, MemoryIntensiveRequestsEndApart) {
  // Twelve memory-intensive requests of one length. Started together they would grow together
  // and end together, and the KV they fill would swing from their prompts to their peak every
  // wave. Started apart, a new one replaces each that ends and their footprint stays level.
  const CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs;
  add_unique(rs, 600, 1000, 100);
  add_unique(rs, 12, 50, 1000);
  PrefixTree tree(rs);
  const Plan plan = make_plan(tree, cost, PlanOptions{});
  const double kv = cost.kv_bytes_per_token_per_device();
  DualScanner scanner(plan, rs, cost, 40'000 * kv, 128, PacingOptions{});
  scanner.on_step(0);
  const double spacing = scanner.pacing().right_end_spacing;
  EXPECT_GT(spacing, 0);
  const PacedRun run = run_paced(scanner, rs);
  ASSERT_EQ(run.right_ends.size(), 12u);
  EXPECT_GT(run.max_right_running, 1u);  // they do overlap
  // The last few, short of time (d b >= D), may start and end together; the first nine may not
  // (all at once, six of them ended at step 999 and three at 1999).
  expect_first_ends_apart(run.right_ends, 9, spacing);
}

TEST(CapacityPacing, ShortMemoryIntensiveRequestsDoNotSetTheLongOnesSpacing) {
  // The same twelve long requests among 200 short memory-intensive ones. Each request's spacing
  // is its own, d (p + d/2) / M_R, so the short ones (a twelfth of the long ones' spacing)
  // neither crowd the long ones' ends nor shrink their spacing: the long ones still end apart.
  const CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs;
  add_unique(rs, 600, 1000, 100);
  add_unique(rs, 12, 50, 1000);
  add_unique(rs, 200, 4, 300);
  PrefixTree tree(rs);
  const Plan plan = make_plan(tree, cost, PlanOptions{});
  const double kv = cost.kv_bytes_per_token_per_device();
  DualScanner scanner(plan, rs, cost, 40'000 * kv, 128, PacingOptions{});
  for (size_t i = 612; i < rs.size(); ++i)
    ASSERT_TRUE(scanner.memory_intensive(static_cast<int32_t>(i)));
  scanner.on_step(0);
  const double spacing = scanner.pacing().right_end_spacing;  // the longest waiting one's
  EXPECT_GT(spacing, 50);
  const PacedRun run = run_paced(scanner, rs);
  ASSERT_EQ(run.right_ends.size(), 212u);
  std::vector<int64_t> long_ends;
  for (size_t k = 0; k < run.right_ends.size(); ++k)
    if (rs[static_cast<size_t>(run.right_ended[k])].output_tokens == 1000)
      long_ends.push_back(run.right_ends[k]);
  ASSERT_EQ(long_ends.size(), 12u);
  expect_first_ends_apart(long_ends, 9, spacing);
}

// blend@alg3 (Alg. 3 as published): each side admits C = N p / d prompt tokens a step, the rate
// that keeps its N requests running with their ends spread; without the budgets a side fills
// its memory at once.
TEST(DualScanner, Alg3AdmitsEachSideAtItsChunkedPrefillBudget) {
  const CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs;
  add_unique(rs, 3000, 1000, 100);  // compute-intensive
  add_unique(rs, 600, 50, 2000);    // memory-intensive
  PrefixTree tree(rs);
  const Plan plan = make_plan(tree, cost, PlanOptions{.policy = Policy::kBlendAlg3});
  const double memory = 400'000 * cost.kv_bytes_per_token_per_device();
  struct Admitted {
    double left_prompt = 0;
    int right = 0;
    double budget_left = 0, budget_right = 0;
  };
  // Steps `steps` steps of an engine that runs every admitted request a token a step.
  auto run = [&](bool budgets, int steps) {
    DualScanner scanner(plan, rs, cost, memory, 128,
                        PacingOptions{.enabled = false, .prefill_budgets = budgets});
    Admitted a;
    std::vector<std::pair<int32_t, double>> running;  // (request, tokens left)
    for (int step = 0; step < steps; ++step) {
      scanner.on_step(step);
      if (step == 0) {
        a.budget_left = scanner.partition().prefill_budget_left;
        a.budget_right = scanner.partition().prefill_budget_right;
      }
      while (auto r = scanner.next()) {
        const auto& q = rs[static_cast<size_t>(*r)];
        if (scanner.last_side() == Side::kLeft)
          a.left_prompt += static_cast<double>(q.prompt.size());
        else
          ++a.right;
        running.emplace_back(*r, q.output_tokens);
      }
      for (size_t k = 0; k < running.size();) {
        if (--running[k].second <= 0) {
          scanner.on_finished(running[k].first);
          running[k] = running.back();
          running.pop_back();
        } else {
          ++k;
        }
      }
    }
    return a;
  };
  const int steps = 400;
  const Admitted alg3 = run(true, steps);
  ASSERT_GT(alg3.budget_left, 200);   // a prompt every few steps...
  ASSERT_GT(alg3.budget_right, 0.2);  // ...and one memory-intensive request every few steps
  ASSERT_LT(alg3.budget_right, 50);
  // What the budgets let in over the steps, give or take one request and two banked steps.
  EXPECT_NEAR(alg3.left_prompt, steps * alg3.budget_left, 1000 + 2 * alg3.budget_left);
  EXPECT_NEAR(alg3.right * 50.0, steps * alg3.budget_right, 50 + 2 * alg3.budget_right);
  // Reservations alone take the right side's whole memory share at the first step.
  const Admitted reservations = run(false, 1);
  EXPECT_GT(reservations.right * 50.0, 20 * alg3.budget_right);
}

}  // namespace
}  // namespace blend::plan
