// From a prefix tree to a request order (BlendServe §5.1-§5.2, App. A.1-A.2):
//  1. annotate every node with the compute/memory time of its subtree and its density
//     rho(R) = (1-s) T_comp / T_mem (§5.1), s counting the path to the node once;
//  2. layer-wise sort: children by descending density, compute-intensive left (Alg. 1);
//  3. conditional node splitting (Alg. 2): a node whose split would recompute
//     prefix_length x |children| > t tokens stays whole, otherwise its children are detached
//     and visited with t / |children|; the detached units are sorted by density at the root;
//  4. merge adjacent units with the same parent back into one group, which restores their
//     shared prefix at no cost (App. A.2); units off the root share nothing and stay apart.
// The baselines (fcfs = input order, dfs = tree DFS in arrival order, random) come out as one
// group each, so every policy feeds the same admission streams (plan/admission.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "plan/prefix_tree.h"

namespace blend::plan {

// Totals of a set of requests (a subtree or a group).
struct DemandStats {
  double compute_seconds = 0;  // sum of Comp(r), before sharing
  double memory_seconds = 0;   // sum of Mem(r)
  double prompt_tokens = 0;    // sum of p
  double output_tokens = 0;    // sum of d
  double unique_tokens = 0;    // prompt tokens computed when the set runs on its own
  int64_t requests = 0;

  double sharing_ratio() const { return prompt_tokens > 0 ? 1 - unique_tokens / prompt_tokens : 0; }
  double density() const;  // (1-s) T_comp / T_mem
  double mean_prompt() const {
    return requests ? prompt_tokens / static_cast<double>(requests) : 0;
  }
  double mean_output() const {
    return requests ? output_tokens / static_cast<double>(requests) : 0;
  }
};

// Step 1: stats of every node's subtree (indexed by node id).
std::vector<DemandStats> annotate_tree(const PrefixTree& tree, const CostModel& cost);

// Step 2 (Alg. 1): sorts every node's children by descending density, ties kept stable.
void layer_sort(PrefixTree& tree, const std::vector<DemandStats>& stats);

// kBlendAlg3 ("blend@alg3") is blend's plan admitted by Alg. 3 exactly as published (C_L / C_R
// prefill budgets; plan/admission.h); kBlend admits it with capacity pacing, our extension.
enum class Policy { kBlend, kDfs, kFcfs, kRandom, kBlendAlg3 };
Policy parse_policy(const std::string& name);  // throws blend::Error
const char* policy_name(Policy policy);
// Whether the policy orders requests by BlendServe's plan (sorted, split, dual-scanned).
inline bool blend_planned(Policy policy) {
  return policy == Policy::kBlend || policy == Policy::kBlendAlg3;
}

struct PlanOptions {
  Policy policy = Policy::kBlend;
  // Alg. 2 threshold t in recomputed prompt tokens. Unset: start from `split_budget` of the
  // tokens the optimal order saves and halve t until the groups keep `min_sharing_fraction`
  // of s_o (§5.2 keeps 99%).
  std::optional<double> split_threshold_tokens;
  double split_budget = 0.01;
  double min_sharing_fraction = 0.99;
  uint64_t seed = 0;  // random policy
};

// A run of requests the scanners treat as one node: density and mean lengths of the group.
struct RequestGroup {
  std::vector<int32_t> requests;  // in execution order
  DemandStats stats;
};

struct Plan {
  Policy policy = Policy::kBlend;
  std::vector<RequestGroup> groups;  // blend: descending density; baselines: one group
  DemandStats root;                  // the whole batch under the optimal (DFS) sharing
  double root_density = 0;
  double optimal_sharing_ratio = 0;  // s_o
  double planned_sharing_ratio = 0;  // 1 - (tokens the groups compute) / prompt tokens
  double split_threshold_tokens = 0;
  int64_t split_nodes = 0;  // nodes Alg. 2 broke up
  int64_t units_before_merge = 0;
  bool density_monotone = false;       // §5.4 (C1): group densities non-increasing
  std::vector<int32_t> order() const;  // all requests, group by group
};

// Builds the plan; sorts `tree` in place for the blend policy.
Plan make_plan(PrefixTree& tree, const CostModel& cost, const PlanOptions& options);

// Sharing ratio an execution order reaches with a prefix cache of `cache_tokens` tokens
// (LRU over tree nodes, a node's ancestors kept at least as long as the node); with an
// unlimited cache any order reaches s_o.
double sharing_ratio_of_order(const PrefixTree& tree, const std::vector<int32_t>& order,
                              double cache_tokens);

// Output-length estimation (BlendServe §5.1). `sampled[r]` is request r's true output length
// when it ran in the sampling pass. Each request gets: its known length (output_known), else its
// sampled length, else the mean of the samples in the nearest enclosing subtree that has any
// (siblings first, then further ancestors), else `fallback`. An estimated length also gets the
// spread (standard deviation) of the samples in the nearest enclosing subtree with at least
// kMinSpreadSamples of them (a spread needs more samples than a mean); 0 when none has.
struct OutputEstimate {
  double tokens = 0;
  double spread = 0;
};
inline constexpr int64_t kMinSpreadSamples = 8;
std::vector<OutputEstimate> estimate_output_lengths(
    const PrefixTree& tree, const std::vector<std::optional<double>>& sampled, double fallback);

}  // namespace blend::plan
