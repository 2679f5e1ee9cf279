#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <list>
#include <numeric>
#include <random>

#include "core/error.h"

namespace blend::plan {

double DemandStats::density() const {
  return CostModel::node_density(sharing_ratio(), compute_seconds, memory_seconds);
}

std::vector<DemandStats> annotate_tree(const PrefixTree& tree, const CostModel& cost) {
  std::vector<DemandStats> stats(static_cast<size_t>(tree.size()));
  const std::vector<int32_t> order = tree.preorder();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {  // children before parents
    const int32_t n = *it;
    const PrefixNode& node = tree.node(n);
    DemandStats& s = stats[static_cast<size_t>(n)];
    const double depth = node.depth_tokens;
    if (node.request >= 0) {
      const PlanRequest& r = tree.requests()[static_cast<size_t>(node.request)];
      const double p = static_cast<double>(r.prompt.size());
      const double d = r.output_tokens;
      s.compute_seconds = cost.request_compute_seconds(p, d);
      s.memory_seconds = cost.request_memory_seconds(p, d);
      s.prompt_tokens = p;
      s.output_tokens = d;
      s.requests = 1;
    }
    // The path to this node is computed once for the whole subtree; each child adds what lies
    // below this node on its side.
    s.unique_tokens = depth;
    for (int32_t c : node.children) {
      const DemandStats& cs = stats[static_cast<size_t>(c)];
      s.compute_seconds += cs.compute_seconds;
      s.memory_seconds += cs.memory_seconds;
      s.prompt_tokens += cs.prompt_tokens;
      s.output_tokens += cs.output_tokens;
      s.requests += cs.requests;
      s.unique_tokens += cs.unique_tokens - depth;
    }
  }
  return stats;
}

void layer_sort(PrefixTree& tree, const std::vector<DemandStats>& stats) {
  std::vector<double> density(stats.size());
  for (size_t i = 0; i < stats.size(); ++i) density[i] = stats[i].density();
  for (int32_t n = 0; n < tree.size(); ++n) {
    std::vector<int32_t>& ch = tree.mutable_node(n).children;
    std::stable_sort(ch.begin(), ch.end(), [&](int32_t a, int32_t b) {
      return density[static_cast<size_t>(a)] > density[static_cast<size_t>(b)];
    });
  }
}

Policy parse_policy(const std::string& name) {
  if (name == "blend") return Policy::kBlend;
  if (name == "dfs") return Policy::kDfs;
  if (name == "fcfs") return Policy::kFcfs;
  if (name == "random") return Policy::kRandom;
  if (name == "blend@alg3") return Policy::kBlendAlg3;
  throw Error("--policy must be blend, blend@alg3, dfs, fcfs or random, not \"" + name + "\"");
}

const char* policy_name(Policy policy) {
  switch (policy) {
    case Policy::kBlend:
      return "blend";
    case Policy::kDfs:
      return "dfs";
    case Policy::kFcfs:
      return "fcfs";
    case Policy::kRandom:
      return "random";
    case Policy::kBlendAlg3:
      return "blend@alg3";
  }
  return "?";
}

std::vector<int32_t> Plan::order() const {
  std::vector<int32_t> out;
  for (const RequestGroup& g : groups) out.insert(out.end(), g.requests.begin(), g.requests.end());
  return out;
}

namespace {

std::vector<int32_t> requests_below(const PrefixTree& tree, int32_t node) {
  std::vector<int32_t> out;
  for (int32_t n : tree.preorder(node))
    if (tree.node(n).request >= 0) out.push_back(tree.node(n).request);
  return out;
}

// Alg. 2: the units (subtrees kept whole) in DFS order of the sorted tree.
std::vector<int32_t> split_units(const PrefixTree& tree, double threshold, int64_t* split_nodes) {
  std::vector<int32_t> units;
  struct Visit {
    int32_t node;
    double t;
  };
  std::vector<Visit> stack{{PrefixTree::kRoot, threshold}};
  while (!stack.empty()) {
    const Visit v = stack.back();
    stack.pop_back();
    const PrefixNode& n = tree.node(v.node);
    // A request is always a unit; so is a node over a single request (the trie is compressed,
    // so one child is always a leaf): splitting it would recompute and reorder nothing.
    if (n.children.empty() || (v.node != PrefixTree::kRoot && n.children.size() == 1)) {
      units.push_back(v.node);
      continue;
    }
    const double k = static_cast<double>(n.children.size());
    const double recompute = static_cast<double>(n.depth_tokens) * k;  // prefix_len x |children|
    if (v.node != PrefixTree::kRoot && recompute > v.t) {
      units.push_back(v.node);
      continue;
    }
    if (v.node != PrefixTree::kRoot) ++*split_nodes;
    for (auto it = n.children.rbegin(); it != n.children.rend(); ++it)
      stack.push_back({*it, v.t / k});
  }
  return units;
}

// Alg. 2 with threshold t, the units sorted by density at the root, then App. A.2's merge.
std::vector<RequestGroup> split_and_group(const PrefixTree& tree,
                                          const std::vector<DemandStats>& stats, double threshold,
                                          int64_t* split_nodes, int64_t* units_before_merge) {
  std::vector<int32_t> units = split_units(tree, threshold, split_nodes);
  *units_before_merge = static_cast<int64_t>(units.size());
  std::stable_sort(units.begin(), units.end(), [&](int32_t a, int32_t b) {
    return stats[static_cast<size_t>(a)].density() > stats[static_cast<size_t>(b)].density();
  });

  std::vector<RequestGroup> groups;
  // App. A.2: adjacent units under one parent run together and share its prefix again.
  for (size_t i = 0; i < units.size();) {
    const int32_t parent = tree.node(units[i]).parent;
    RequestGroup g;
    size_t j = i;
    // Units hanging off the root share nothing; merging them would only blur densities.
    const bool shares = tree.node(parent).depth_tokens > 0;
    for (; j < units.size() && (j == i || (shares && tree.node(units[j]).parent == parent)); ++j) {
      const DemandStats& s = stats[static_cast<size_t>(units[j])];
      if (j > i)  // the parent's path is computed once for the merged group
        g.stats.unique_tokens -= static_cast<double>(tree.node(parent).depth_tokens);
      g.stats.compute_seconds += s.compute_seconds;
      g.stats.memory_seconds += s.memory_seconds;
      g.stats.prompt_tokens += s.prompt_tokens;
      g.stats.output_tokens += s.output_tokens;
      g.stats.unique_tokens += s.unique_tokens;
      g.stats.requests += s.requests;
      const std::vector<int32_t> below = requests_below(tree, units[j]);
      g.requests.insert(g.requests.end(), below.begin(), below.end());
    }
    groups.push_back(std::move(g));
    i = j;
  }
  return groups;
}

}  // namespace

Plan make_plan(PrefixTree& tree, const CostModel& cost, const PlanOptions& options) {
  Plan plan;
  plan.policy = options.policy;
  std::vector<DemandStats> stats = annotate_tree(tree, cost);
  plan.root = stats[PrefixTree::kRoot];
  plan.root_density = plan.root.density();
  plan.optimal_sharing_ratio = tree.optimal_sharing_ratio();
  const int32_t n = static_cast<int32_t>(tree.requests().size());

  if (!blend_planned(options.policy)) {
    RequestGroup g;
    g.stats = plan.root;
    if (options.policy == Policy::kDfs) {
      g.requests = tree.dfs_order();
    } else {
      g.requests.resize(static_cast<size_t>(n));
      std::iota(g.requests.begin(), g.requests.end(), 0);
      if (options.policy == Policy::kRandom) {
        std::mt19937_64 rng(options.seed);
        std::shuffle(g.requests.begin(), g.requests.end(), rng);
      }
    }
    plan.groups.push_back(std::move(g));
    plan.planned_sharing_ratio = plan.optimal_sharing_ratio;
    plan.density_monotone = true;
    return plan;
  }

  layer_sort(tree, stats);  // Alg. 1
  const double saved = plan.root.prompt_tokens - plan.root.unique_tokens;
  double threshold = options.split_threshold_tokens.value_or(options.split_budget * saved);
  // With t chosen for the user, keep `min_sharing_fraction` of s_o (§5.2: 99%): halve t until
  // the groups recompute little enough. t = 0 keeps every subtree under the root whole, which
  // loses no sharing, so the loop ends.
  for (int attempt = 0;; ++attempt) {
    plan.split_nodes = 0;
    plan.groups =
        split_and_group(tree, stats, threshold, &plan.split_nodes, &plan.units_before_merge);
    double unique = 0;
    for (const RequestGroup& g : plan.groups) unique += g.stats.unique_tokens;
    plan.planned_sharing_ratio =
        plan.root.prompt_tokens > 0 ? 1 - unique / plan.root.prompt_tokens : 0;
    plan.split_threshold_tokens = threshold;
    if (options.split_threshold_tokens || threshold == 0 ||
        plan.planned_sharing_ratio >=
            options.min_sharing_fraction * plan.optimal_sharing_ratio - 1e-12)
      break;
    threshold = attempt < 30 ? threshold / 2 : 0;
  }
  plan.density_monotone = true;
  for (size_t i = 1; i < plan.groups.size(); ++i)
    if (plan.groups[i].stats.density() > plan.groups[i - 1].stats.density())
      plan.density_monotone = false;
  return plan;
}

double sharing_ratio_of_order(const PrefixTree& tree, const std::vector<int32_t>& order,
                              double cache_tokens) {
  const size_t nodes = static_cast<size_t>(tree.size());
  std::vector<char> cached(nodes, 0);
  std::list<int32_t> lru;  // front = most recent
  std::vector<std::list<int32_t>::iterator> where(nodes);
  double used = 0, total = 0, computed = 0;
  std::vector<int32_t> path;
  for (int32_t r : order) {
    path.clear();
    for (int32_t n = tree.leaf_of(r); n != PrefixTree::kRoot; n = tree.node(n).parent)
      path.push_back(n);  // deepest first
    bool hit = true;
    for (auto it = path.rbegin(); it != path.rend(); ++it) {  // root side first
      const double len = tree.node(*it).segment_length;
      total += len;
      if (!(hit && cached[static_cast<size_t>(*it)])) {
        hit = false;  // below a missing node nothing can be reused
        computed += len;
      }
    }
    for (int32_t n : path) {  // deepest first, so ancestors end up more recent
      const size_t i = static_cast<size_t>(n);
      if (cached[i]) {
        lru.erase(where[i]);
      } else {
        cached[i] = 1;
        used += tree.node(n).segment_length;
      }
      lru.push_front(n);
      where[i] = lru.begin();
    }
    while (used > cache_tokens && !lru.empty()) {
      const int32_t victim = lru.back();
      if (std::find(path.begin(), path.end(), victim) != path.end()) break;  // in use
      lru.pop_back();
      cached[static_cast<size_t>(victim)] = 0;
      used -= tree.node(victim).segment_length;
    }
  }
  return total > 0 ? 1 - computed / total : 0;
}

std::vector<OutputEstimate> estimate_output_lengths(
    const PrefixTree& tree, const std::vector<std::optional<double>>& sampled, double fallback) {
  const std::vector<PlanRequest>& requests = tree.requests();
  if (sampled.size() != requests.size())
    throw Error("estimate_output_lengths: one entry per request expected");
  const auto nodes = static_cast<size_t>(tree.size());
  std::vector<double> sum(nodes, 0), sum_squares(nodes, 0);
  std::vector<int64_t> count(nodes, 0);
  for (size_t r = 0; r < requests.size(); ++r) {
    if (!sampled[r]) continue;
    for (int32_t n = tree.leaf_of(static_cast<int32_t>(r)); n >= 0; n = tree.node(n).parent) {
      const auto i = static_cast<size_t>(n);
      sum[i] += *sampled[r];
      sum_squares[i] += *sampled[r] * *sampled[r];
      ++count[i];
    }
  }
  std::vector<OutputEstimate> out(requests.size(), OutputEstimate{fallback, 0});
  for (size_t r = 0; r < requests.size(); ++r) {
    if (requests[r].output_known) {
      out[r] = {requests[r].output_tokens, 0};
      continue;
    }
    if (sampled[r]) {
      out[r] = {*sampled[r], 0};
      continue;
    }
    bool have_mean = false;
    for (int32_t n = tree.node(tree.leaf_of(static_cast<int32_t>(r))).parent; n >= 0;
         n = tree.node(n).parent) {
      const auto i = static_cast<size_t>(n);
      const auto k = static_cast<double>(count[i]);
      if (!have_mean && count[i] > 0) {
        out[r].tokens = sum[i] / k;
        have_mean = true;
      }
      if (count[i] >= kMinSpreadSamples) {
        const double mean = sum[i] / k;
        out[r].spread = std::sqrt(std::max(0.0, sum_squares[i] / k - mean * mean));
        break;
      }
    }
  }
  return out;
}

}  // namespace blend::plan
