#include "plan/dp_partition.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace blend::plan {

double DpPartition::work(size_t part) const {
  const DemandStats& s = stats[part];
  return (1 - s.sharing_ratio()) * s.compute_seconds + s.memory_seconds;
}

double DpPartition::imbalance() const {
  if (parts.empty()) return 1;
  double total = 0, largest = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    total += work(k);
    largest = std::max(largest, work(k));
  }
  return total > 0 ? largest / (total / static_cast<double>(parts.size())) : 1;
}

namespace {

size_t common_prefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// A partition being filled: two runs of the plan's order, one from each cursor. Its sharing is
// tracked the cheap way, each request sharing its longest common prefix with the request before
// it in the same run (exact for a depth-first run of the tree); the final stats are exact.
struct Filling {
  double compute = 0, memory = 0, prompt = 0, unique = 0;
  const PlanRequest* last[2] = {nullptr, nullptr};  // the previous request of each run

  void add(const PlanRequest& r, int side, const CostModel& cost) {
    const double p = static_cast<double>(r.prompt.size());
    compute += cost.request_compute_seconds(p, r.output_tokens);
    memory += cost.request_memory_seconds(p, r.output_tokens);
    prompt += p;
    unique +=
        p - (last[side] ? static_cast<double>(common_prefix(last[side]->prompt, r.prompt)) : 0.0);
    last[side] = &r;
  }
  double shared_compute() const { return prompt > 0 ? compute * unique / prompt : compute; }
  double work() const { return shared_compute() + memory; }
};

}  // namespace

DpPartition partition_data_parallel(const std::vector<PlanRequest>& requests, const CostModel& cost,
                                    int32_t parts) {
  if (parts < 1)
    throw Error("data-parallel partition needs at least one part, not " + std::to_string(parts));
  DpPartition out;
  out.parts.resize(static_cast<size_t>(parts));
  out.stats.resize(static_cast<size_t>(parts));
  if (requests.empty()) return out;

  PrefixTree tree(requests);
  const Plan plan = make_plan(tree, cost, {.policy = Policy::kBlend});
  out.root = plan.root;
  out.root_density = plan.root_density;
  out.sharing_optimal = plan.optimal_sharing_ratio;
  const std::vector<int32_t> order = plan.order();
  // Prefix sums over the order, each request sharing its common prefix with the one before
  // it: the unassigned middle [low, high) as one run costs run_work(low, high).
  const size_t n = order.size();
  std::vector<double> cum_compute(n + 1, 0), cum_memory(n + 1, 0), cum_prompt(n + 1, 0),
      cum_unique(n + 1, 0), shared_with_previous(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const PlanRequest& r = requests[static_cast<size_t>(order[i])];
    const double p = static_cast<double>(r.prompt.size());
    if (i > 0)
      shared_with_previous[i] = static_cast<double>(
          common_prefix(requests[static_cast<size_t>(order[i - 1])].prompt, r.prompt));
    cum_compute[i + 1] = cum_compute[i] + cost.request_compute_seconds(p, r.output_tokens);
    cum_memory[i + 1] = cum_memory[i] + cost.request_memory_seconds(p, r.output_tokens);
    cum_prompt[i + 1] = cum_prompt[i] + p;
    cum_unique[i + 1] = cum_unique[i] + p - shared_with_previous[i];
  }
  const auto run_work = [&](size_t a, size_t b) {
    if (a >= b) return 0.0;
    const double compute = cum_compute[b] - cum_compute[a];
    const double prompt = cum_prompt[b] - cum_prompt[a];
    const double unique = cum_unique[b] - cum_unique[a] + shared_with_previous[a];
    return (prompt > 0 ? compute * unique / prompt : compute) + cum_memory[b] - cum_memory[a];
  };

  // The dual scanner's two cursors over the order: [low, high) is still unassigned. Each part
  // takes an equal share of what is left (so estimation error and the cut paths do not pile up
  // on the last part).
  size_t low = 0, high = n;
  for (int32_t k = 0; k < parts && low < high; ++k) {
    std::vector<int32_t>& part = out.parts[static_cast<size_t>(k)];
    std::vector<int32_t> right_run;  // taken from the right end, in reverse order
    Filling f;
    const double target = run_work(low, high) / static_cast<double>(parts - k);
    const bool last = k + 1 == parts;
    while (low < high && (last || f.work() < target)) {
      // Below the root's density the partition lacks compute: take from the left (compute-
      // intensive) end; at or above it, from the right (memory-intensive) end. An empty
      // partition starts on the left.
      const bool left = f.memory <= 0 || f.shared_compute() < plan.root_density * f.memory;
      const int32_t r = left ? order[low++] : order[--high];
      f.add(requests[static_cast<size_t>(r)], left ? 0 : 1, cost);
      (left ? part : right_run).push_back(r);
    }
    // The partition in the global plan's order: its left run, then its right run.
    part.insert(part.end(), right_run.rbegin(), right_run.rend());
  }

  double unique_total = 0;
  for (size_t k = 0; k < out.parts.size(); ++k) {
    if (out.parts[k].empty()) continue;
    std::vector<PlanRequest> sub;
    sub.reserve(out.parts[k].size());
    for (int32_t r : out.parts[k]) sub.push_back(requests[static_cast<size_t>(r)]);
    const PrefixTree part_tree(sub);
    out.stats[k] = annotate_tree(part_tree, cost)[PrefixTree::kRoot];
    unique_total += out.stats[k].unique_tokens;
  }
  out.sharing_partitioned =
      out.root.prompt_tokens > 0 ? 1 - unique_total / out.root.prompt_tokens : 0;
  return out;
}

}  // namespace blend::plan
