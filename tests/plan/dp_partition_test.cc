// The data-parallel partition (BlendServe §5.5): every request in exactly one part, parts of
// equal predicted work at the root's compute density, and only cut paths lose sharing.
#include "plan/dp_partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "cost/cost_model.h"

namespace blend::plan {
namespace {

CostModel llama8b_a100() {
  return CostModel(*find_model_shape_preset("llama-3-8b"), *find_hardware_preset("a100-80g"));
}

// `families` prompt families of `per_family` requests each: a shared prefix of 200-1000 tokens
// and a 20-100-token own suffix; half the families decode 100-250 tokens (memory-intensive),
// half 10-50 (compute-intensive), so the root density sits between them.
std::vector<PlanRequest> workload(int families, int per_family, uint64_t seed,
                                  double memory_output = 100) {
  std::mt19937_64 rng(seed);
  std::vector<PlanRequest> out;
  TokenId next = 1;
  for (int f = 0; f < families; ++f) {
    std::vector<TokenId> prefix(200 + rng() % 800);
    for (TokenId& t : prefix) t = next++;
    for (int i = 0; i < per_family; ++i) {
      PlanRequest r;
      r.id = std::to_string(f) + "-" + std::to_string(i);
      r.prompt = prefix;
      for (int k = 0, n = 20 + static_cast<int>(rng() % 80); k < n; ++k) r.prompt.push_back(next++);
      r.output_tokens = f % 2 ? memory_output + static_cast<double>(rng() % 150)
                              : 10 + static_cast<double>(rng() % 40);
      r.output_known = true;
      out.push_back(std::move(r));
    }
  }
  // Arrival order mixes the families.
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

TEST(DpPartition, EveryRequestOnceEqualWorkRootDensityLittleSharingLost) {
  const CostModel cost = llama8b_a100();
  const std::vector<PlanRequest> rs = workload(40, 100, 7);
  for (int32_t n : {1, 2, 3, 4, 8}) {
    SCOPED_TRACE(n);
    // 64-token steps: this 4,000-request batch then needs enough steps a part that none of its
    // decodes is long (long decodes: the next test).
    const DpPartition p = partition_data_parallel(rs, cost, n, /*step_tokens=*/64);
    ASSERT_EQ(p.parts.size(), static_cast<size_t>(n));
    std::set<int32_t> seen;
    for (const auto& part : p.parts) {
      EXPECT_FALSE(part.empty());
      for (int32_t r : part) EXPECT_TRUE(seen.insert(r).second) << r;
    }
    EXPECT_EQ(seen.size(), rs.size());
    EXPECT_LT(p.imbalance(), 1.02);  // equal predicted work
    // Each part blends like the root (compute per memory second, priced the partition's way).
    // The last takes what the cursors left between them, which drifts.
    for (size_t k = 0; k < p.parts.size(); ++k)
      EXPECT_NEAR(p.compute_seconds[k] / p.memory_seconds[k] / p.root_compute_per_memory, 1.0,
                  k + 1 < p.parts.size() ? 0.02 : 0.15)
          << k;
    EXPECT_GT(p.sharing_optimal, 0.8);
    EXPECT_GE(p.sharing_loss(), 0);
    // §5.5: marginal loss; a part is two runs, so n parts cut at most 2(n-1) paths.
    EXPECT_LE(p.sharing_loss_of_optimal(), 0.01);
    if (n == 1) {
      EXPECT_EQ(p.sharing_loss(), 0);
    }
  }
}

// A re-cut with unequal shares (rebalance_shares from a first cut's replica times): each
// part's predicted work follows its share, and every request still lands once.
TEST(DpPartition, SharesSetEachPartsWorkAndRebalanceFollowsTheRates) {
  const CostModel cost = llama8b_a100();
  const std::vector<PlanRequest> rs = workload(40, 100, 7);
  const DpPartition p =
      partition_data_parallel(rs, cost, 3, /*step_tokens=*/64, /*shares=*/{1.0, 2.0, 1.0});
  std::set<int32_t> seen;
  for (const auto& part : p.parts)
    for (int32_t r : part) EXPECT_TRUE(seen.insert(r).second) << r;
  EXPECT_EQ(seen.size(), rs.size());
  const double total = p.work(0) + p.work(1) + p.work(2);
  EXPECT_NEAR(p.work(0) / total, 0.25, 0.01);
  EXPECT_NEAR(p.work(1) / total, 0.50, 0.01);
  EXPECT_NEAR(p.work(2) / total, 0.25, 0.02);  // the last takes what is left
  EXPECT_LE(p.sharing_loss_of_optimal(), 0.01);
  // Equal shares cut exactly as no shares.
  const DpPartition equal = partition_data_parallel(rs, cost, 3, 64, {5.0, 5.0, 5.0});
  const DpPartition none = partition_data_parallel(rs, cost, 3, 64);
  EXPECT_EQ(equal.parts, none.parts);
  // A part that took twice as long for its work gets half the rate's share.
  const std::vector<double> shares = rebalance_shares({10, 10, 10}, {100, 200, 100});
  EXPECT_NEAR(shares[1] / shares[0], 0.5, 1e-12);
  EXPECT_NEAR(shares[2] / shares[0], 1.0, 1e-12);
  EXPECT_THROW(partition_data_parallel(rs, cost, 3, 64, {1.0, 2.0}), Error);
  EXPECT_THROW(partition_data_parallel(rs, cost, 2, 64, {1.0, 0.0}), Error);
}

// cut_data_parallel: replica 1 runs its work at half the others' rate. The re-cut gives it less,
// the cut with the fastest slowest replica is kept, and every cut's makespan is reported.
TEST(DpPartition, ReCutsFollowTheReplicaTimesAndKeepTheShortestJob) {
  const CostModel cost = llama8b_a100();
  const std::vector<PlanRequest> rs = workload(40, 100, 7);
  std::vector<double> work_of_calls;  // part 1's share of the work, cut by cut
  const auto replica_seconds = [&](const DpPartition& cut) {
    double total = 0;
    for (size_t k = 0; k < cut.parts.size(); ++k) total += cut.work(k);
    work_of_calls.push_back(cut.work(1) / total);
    std::vector<double> seconds;
    for (size_t k = 0; k < cut.parts.size(); ++k) seconds.push_back(cut.work(k) * (k == 1 ? 2 : 1));
    return seconds;
  };
  const DpCuts cuts = cut_data_parallel(rs, cost, 3, 64, /*recuts=*/2, replica_seconds);
  ASSERT_EQ(cuts.cut_seconds.size(), 3u);
  ASSERT_EQ(work_of_calls.size(), 3u);
  EXPECT_NEAR(work_of_calls[0], 1.0 / 3, 0.02);
  EXPECT_NEAR(work_of_calls[1], 0.2, 0.02);  // rate 1/2: a share of 1/2 / (1 + 1/2 + 1)
  EXPECT_LT(cuts.cut_seconds[1], cuts.cut_seconds[0]);
  EXPECT_GE(cuts.kept, 1u);
  for (double s : cuts.cut_seconds) EXPECT_GE(s, cuts.cut_seconds[cuts.kept]);
  EXPECT_EQ(cuts.rank_seconds, replica_seconds(cuts.partition));
  // No re-cuts: the equal cut, its times asked for once.
  work_of_calls.clear();
  const DpCuts once = cut_data_parallel(rs, cost, 3, 64, 0, replica_seconds);
  EXPECT_EQ(once.cut_seconds.size(), 1u);
  EXPECT_EQ(once.kept, 0u);
  EXPECT_EQ(once.partition.parts, partition_data_parallel(rs, cost, 3, 64).parts);
  EXPECT_THROW(cut_data_parallel(rs, cost, 3, 64, -1, replica_seconds), Error);
}

// A handful of requests decoding far longer than the rest (BlendServe Trace#1's OpenVid
// requests): each is a part's critical path, so they are spread over the parts, not left at the
// memory-intensive end for one part to inherit.
TEST(DpPartition, LongDecodesAreSpreadOverTheParts) {
  const CostModel cost = llama8b_a100();
  std::vector<PlanRequest> rs = workload(20, 100, 3, /*memory_output=*/10);
  for (int i = 0; i < 8; ++i) {
    PlanRequest r;
    r.id = "long-" + std::to_string(i);
    for (int k = 0; k < 300; ++k) r.prompt.push_back(1000000 + i * 1000 + k);
    r.output_tokens = 20000 + 100 * i;
    r.output_known = true;
    rs.push_back(std::move(r));
  }
  for (int32_t n : {2, 4}) {
    const DpPartition p = partition_data_parallel(rs, cost, n);
    for (const auto& part : p.parts) {
      int longs = 0;
      for (int32_t r : part) longs += rs[static_cast<size_t>(r)].output_tokens >= 20000;
      EXPECT_EQ(longs, 8 / n) << n;
    }
    EXPECT_LT(p.imbalance(), 1.02);
  }
}

TEST(DpPartition, MorePartsThanRequestsLeavesSomeEmpty) {
  const CostModel cost = llama8b_a100();
  const std::vector<PlanRequest> rs = workload(1, 3, 1);
  const DpPartition p = partition_data_parallel(rs, cost, 5);
  size_t total = 0, empty = 0;
  for (const auto& part : p.parts) {
    total += part.size();
    empty += part.empty();
  }
  EXPECT_EQ(total, 3u);
  EXPECT_GE(empty, 2u);
  EXPECT_THROW(partition_data_parallel(rs, cost, 0), Error);
  EXPECT_EQ(partition_data_parallel({}, cost, 2).parts.size(), 2u);
}

}  // namespace
}  // namespace blend::plan
