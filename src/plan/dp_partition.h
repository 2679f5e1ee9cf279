// Data-parallel partition of an offline batch (BlendServe §5.5): the batch's global
// resource-aware prefix tree is planned once (plan/planner.h: density annotation, layer sort,
// node splitting), and its order is cut into `parts` request partitions, one per data-parallel
// replica, the way the dual scanner walks it (§5.3): a left cursor eats the compute-intensive
// end of the order, a right cursor the memory-intensive end, and each partition takes from
// whichever side brings its compute density back to the root's. A partition is closed once it
// holds its share of the predicted work ((1-s) T_comp + T_mem over the batch, divided equally)
// and the next one starts where the cursors stopped. Compute is priced per request with its
// cached prefix taken out (additive, unlike the node formula; see dp_partition.cc). Every partition
// is therefore two contiguous runs of the planned order, i.e. subtrees of the global tree, and only
// the paths cut between two partitions are computed twice: the sharing loss is reported against
// s_o.
//
// Requests whose decode alone would outlast a part's share (kLongDecodeShare) are dealt out
// first, longest first to the part with the least of them, so no part inherits all of them (the
// critical path of its run).
//
// What it promises: every request lands in exactly one partition; partitions keep the global
// plan's order; with fewer requests than parts the surplus partitions are empty.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "cost/cost_model.h"
#include "plan/planner.h"
#include "plan/prefix_tree.h"

namespace blend::plan {

struct DpPartition {
  std::vector<std::vector<int32_t>> parts;  // request indices per part, in the plan's order
  std::vector<DemandStats> stats;           // per part, its sharing counted within the part
  DemandStats root;                         // the whole batch (sharing: s_o)
  double root_density = 0;                  // rho of the whole batch, which each part follows
  double sharing_optimal = 0;               // s_o of the whole batch
  // 1 - (sum of the parts' unique prompt tokens) / prompt tokens: the s_o the parts reach
  // together when each runs on its own replica.
  double sharing_partitioned = 0;
  // Prompt tokens computed twice because a shared path was cut, as a fraction of all prompt
  // tokens, and that loss as a fraction of s_o (§5.5: "marginal").
  double sharing_loss() const { return sharing_optimal - sharing_partitioned; }
  double sharing_loss_of_optimal() const {
    return sharing_optimal > 0 ? sharing_loss() / sharing_optimal : 0;
  }
  // The predicted work of each part, compute + memory seconds, a request's compute counting
  // only the prompt tokens it does not share with its neighbour in the part (what the cut
  // balances).
  std::vector<double> work_seconds;
  double work(size_t part) const { return work_seconds[part]; }
  // The two halves of that work in each part's two runs (its dealt long decodes left out), and
  // the root's compute per memory second priced the same way: what each part keeps.
  std::vector<double> compute_seconds, memory_seconds;
  double root_compute_per_memory = 0;
  // Largest part's work over the mean part's (1 = perfectly balanced).
  double imbalance() const;
};

// A request decoding for more than this share of the steps a part needs (its dense tokens at
// `step_tokens` a step) is dealt out apart from its subtree (dp_partition.cc: long decodes are
// each part's critical path).
inline constexpr double kLongDecodeShare = 0.25;
// ... and more than this many times the batch's mean output: an outlier, whose subtree can
// spare it (in a small batch every decode is long against the steps, and none should move).
inline constexpr double kLongDecodeOutlier = 8;
// At most this many per part (the longest): common long decodes stay in their subtrees.
inline constexpr size_t kMaxDealtPerPart = 32;

// Cuts `requests` into `parts` partitions (parts >= 1; throws blend::Error otherwise).
// `step_tokens`: the engine's token budget of one step. `shares`: each part's share of the
// predicted work (empty: equal; else `parts` positive numbers, normalised here), for a re-cut
// that gives a replica predicted to run slow less (rebalance_shares).
DpPartition partition_data_parallel(const std::vector<PlanRequest>& requests, const CostModel& cost,
                                    int32_t parts, int32_t step_tokens = 2048,
                                    const std::vector<double>& shares = {});

// Shares for a re-cut from a first partition's predicted work and its replicas' simulated (or
// measured) seconds: each part's share in proportion to its rate, work / seconds, so that at
// those rates every part would take as long. A part with no time keeps its work's share.
std::vector<double> rebalance_shares(const std::vector<double>& work_seconds,
                                     const std::vector<double>& replica_seconds);

// A partition re-cut by its replicas' times: the first cut takes equal shares, each of `recuts`
// more takes rebalance_shares of the last cut's work and `replica_seconds(last cut)` (a
// simulation of each part on its own replica), and the cut whose slowest replica is fastest is
// kept. The predicted work says nothing of how well each part's own plan runs; the replica
// times do.
struct DpCuts {
  DpPartition partition;             // the kept cut
  std::vector<double> rank_seconds;  // its replicas' seconds
  std::vector<double> cut_seconds;   // every cut's slowest replica, in order
  size_t kept = 0;                   // which cut was kept (0: the first)
};
DpCuts cut_data_parallel(
    const std::vector<PlanRequest>& requests, const CostModel& cost, int32_t parts,
    int32_t step_tokens, int32_t recuts,
    const std::function<std::vector<double>(const DpPartition&)>& replica_seconds);

}  // namespace blend::plan
