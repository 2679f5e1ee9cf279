#include "plan/dp_partition.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace blend::plan {

double DpPartition::imbalance() const {
  if (parts.empty()) return 1;
  double total = 0, largest = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    total += work_seconds[k];
    largest = std::max(largest, work_seconds[k]);
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

// Compute seconds of request `r` when its first `cached` prompt tokens are already in the
// prefix cache: Comp(p, d) - Comp(l, 0) = (2 (p - l + d) P + 4 (p^2 - l^2) H L) / compute. Additive
// over requests, unlike the node formula (1-s) T_comp, which also discounts decode compute and the
// suffix's attention to the shared prefix: balanced by it, Trace#1's two halves took 1,132 s and
// 928 s on the simulator.
// Memory seconds of request `r` (its KV reads over its life, BlendServe §4.1).
double memory_seconds(const CostModel& cost, const PlanRequest& r) {
  return cost.request_memory_seconds(static_cast<double>(r.prompt.size()), r.output_tokens);
}

double shared_compute(const CostModel& cost, const PlanRequest& r, double cached) {
  return cost.request_compute_seconds(static_cast<double>(r.prompt.size()), r.output_tokens) -
         cost.request_compute_seconds(cached, 0);
}

// Long decodes first (not in §5.5; the simulator showed it): a request of d output tokens
// takes d steps however little runs beside it, and a part needs about (its dense tokens) /
// step_tokens steps, so a decode near that count is the part's critical path. Contiguous runs
// would hand every such request at the memory-intensive end to the first part (Trace#1's 69
// OpenVid requests of ~25K tokens: 1,135 s against 924 s for two halves of equal predicted
// work). The requests decoding more than kLongDecodeShare of a part's steps and
// kLongDecodeOutlier times the mean (the longest kMaxDealtPerPart per part at most) are dealt out
// first, longest first, to the part with the least long decoding so far; the rest keep their
// subtrees.
//
// Marks each dealt request in `dealt` and adds it to its part in `out`; per part, the output
// tokens dealt and their (compute + memory) seconds go to `dealt_output` and `dealt_work`.
void deal_long_decodes(const std::vector<PlanRequest>& requests, const CostModel& cost,
                       const std::vector<int32_t>& full_order, int32_t parts, int32_t step_tokens,
                       DpPartition& out, std::vector<char>& dealt,
                       std::vector<double>& dealt_output, std::vector<double>& dealt_work) {
  const auto output_of = [&](int32_t r) { return requests[static_cast<size_t>(r)].output_tokens; };
  double dense = 0;  // prompt tokens computed (with sharing) + output tokens
  for (size_t i = 0; i < full_order.size(); ++i) {
    const PlanRequest& r = requests[static_cast<size_t>(full_order[i])];
    const double shared =
        i > 0 ? static_cast<double>(common_prefix(
                    requests[static_cast<size_t>(full_order[i - 1])].prompt, r.prompt))
              : 0.0;
    dense += static_cast<double>(r.prompt.size()) - shared + r.output_tokens;
  }
  const double part_steps = dense / parts / std::max<int32_t>(step_tokens, 1);
  std::vector<int32_t> long_requests;
  double mean_output = 0;
  for (int32_t r : full_order) mean_output += output_of(r);
  mean_output /= static_cast<double>(full_order.size());
  for (int32_t r : full_order)
    if (output_of(r) > kLongDecodeShare * part_steps &&
        output_of(r) > kLongDecodeOutlier * mean_output)
      long_requests.push_back(r);
  // Only the longest few per part: when long decodes are common every part's runs hold
  // some, and dealing them all would tear their subtrees apart.
  const size_t most = static_cast<size_t>(parts) * kMaxDealtPerPart;
  if (long_requests.size() > most) {
    std::vector<int32_t> longest = long_requests;
    std::nth_element(longest.begin(), longest.begin() + static_cast<std::ptrdiff_t>(most - 1),
                     longest.end(),
                     [&](int32_t x, int32_t y) { return output_of(x) > output_of(y); });
    const double cut = output_of(longest[most - 1]);
    size_t kept = 0;
    std::erase_if(long_requests, [&](int32_t r) {
      return output_of(r) < cut || (output_of(r) == cut && ++kept > most);
    });
  }
  // Longest first, each to the part with the least long decoding so far.
  std::stable_sort(long_requests.begin(), long_requests.end(),
                   [&](int32_t x, int32_t y) { return output_of(x) > output_of(y); });
  for (int32_t r : long_requests) {
    const size_t k = static_cast<size_t>(
        std::min_element(dealt_output.begin(), dealt_output.end()) - dealt_output.begin());
    out.parts[k].push_back(r);
    dealt[static_cast<size_t>(r)] = 1;
    dealt_output[k] += output_of(r);
    const PlanRequest& q = requests[static_cast<size_t>(r)];
    dealt_work[k] += shared_compute(cost, q, 0) + memory_seconds(cost, q);
  }
}

}  // namespace

std::vector<double> rebalance_shares(const std::vector<double>& work_seconds,
                                     const std::vector<double>& replica_seconds) {
  if (work_seconds.size() != replica_seconds.size())
    throw Error("rebalance_shares: one time per part");
  double total_work = 0, total_time = 0;
  for (size_t k = 0; k < work_seconds.size(); ++k) {
    total_work += work_seconds[k];
    total_time += replica_seconds[k];
  }
  std::vector<double> shares(work_seconds.size());
  for (size_t k = 0; k < shares.size(); ++k) {
    const double rate = replica_seconds[k] > 0 ? work_seconds[k] / replica_seconds[k]
                                               : total_work / std::max(total_time, 1e-300);
    shares[k] = std::max(rate, 1e-300);
  }
  return shares;
}

DpCuts cut_data_parallel(
    const std::vector<PlanRequest>& requests, const CostModel& cost, int32_t parts,
    int32_t step_tokens, int32_t recuts,
    const std::function<std::vector<double>(const DpPartition&)>& replica_seconds) {
  if (recuts < 0) throw Error("data-parallel re-cuts must be 0 or more");
  const auto makespan = [](const std::vector<double>& seconds) {
    return seconds.empty() ? 0.0 : *std::max_element(seconds.begin(), seconds.end());
  };
  const auto times = [&](const DpPartition& cut) {
    std::vector<double> seconds = replica_seconds(cut);
    if (seconds.size() != cut.parts.size()) throw Error("data-parallel re-cut: one time per part");
    return seconds;
  };
  DpCuts best;
  best.partition = partition_data_parallel(requests, cost, parts, step_tokens);
  best.rank_seconds = times(best.partition);
  best.cut_seconds.push_back(makespan(best.rank_seconds));
  DpPartition last = best.partition;
  std::vector<double> last_seconds = best.rank_seconds;
  for (int32_t pass = 0; pass < recuts; ++pass) {
    DpPartition again = partition_data_parallel(requests, cost, parts, step_tokens,
                                                rebalance_shares(last.work_seconds, last_seconds));
    std::vector<double> seconds = times(again);
    best.cut_seconds.push_back(makespan(seconds));
    if (best.cut_seconds.back() < best.cut_seconds[best.kept]) {
      best.kept = best.cut_seconds.size() - 1;
      best.partition = again;
      best.rank_seconds = seconds;
    }
    last = std::move(again);
    last_seconds = std::move(seconds);
  }
  return best;
}

DpPartition partition_data_parallel(const std::vector<PlanRequest>& requests, const CostModel& cost,
                                    int32_t parts, int32_t step_tokens,
                                    const std::vector<double>& shares) {
  if (parts < 1)
    throw Error("data-parallel partition needs at least one part, not " + std::to_string(parts));
  if (!shares.empty() && static_cast<int32_t>(shares.size()) != parts)
    throw Error("data-parallel partition: " + std::to_string(shares.size()) + " shares for " +
                std::to_string(parts) + " parts");
  for (double s : shares)
    if (!(s > 0)) throw Error("data-parallel partition: a part's share must be positive");
  const auto share = [&](int32_t k) {
    return shares.empty() ? 1.0 : shares[static_cast<size_t>(k)];
  };
  DpPartition out;
  out.parts.resize(static_cast<size_t>(parts));
  out.stats.resize(static_cast<size_t>(parts));
  out.work_seconds.assign(static_cast<size_t>(parts), 0);
  out.compute_seconds.assign(static_cast<size_t>(parts), 0);
  out.memory_seconds.assign(static_cast<size_t>(parts), 0);
  if (requests.empty()) return out;

  PrefixTree tree(requests);
  const Plan plan = make_plan(tree, cost, {.policy = Policy::kBlend});
  out.root = plan.root;
  out.root_density = plan.root_density;
  out.sharing_optimal = plan.optimal_sharing_ratio;
  const std::vector<int32_t> full_order = plan.order();
  const auto memory_of = [&](int32_t r) {
    return memory_seconds(cost, requests[static_cast<size_t>(r)]);
  };

  std::vector<char> dealt(requests.size(), 0);
  std::vector<double> dealt_output(static_cast<size_t>(parts), 0), dealt_work(out.work_seconds);
  if (parts > 1)
    deal_long_decodes(requests, cost, full_order, parts, step_tokens, out, dealt, dealt_output,
                      dealt_work);
  std::vector<int32_t> order;  // the rest, in the plan's order
  for (int32_t r : full_order)
    if (!dealt[static_cast<size_t>(r)]) order.push_back(r);

  // Along the order, each request shares its common prefix with its neighbour (exact for a
  // depth-first run of the tree). A run of the order [a, b) costs compute
  // C(a, b) = own(a) + sum over (a, b) of after_previous(i), and memory M(a, b); prefix sums.
  const size_t n = order.size();
  const auto request_at = [&](size_t i) -> const PlanRequest& {
    return requests[static_cast<size_t>(order[i])];
  };
  std::vector<double> shared_with_previous(n + 1, 0);  // [n] = 0: nothing after the end
  std::vector<double> cum_compute(n + 1, 0), cum_memory(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const PlanRequest& r = request_at(i);
    if (i > 0)
      shared_with_previous[i] =
          static_cast<double>(common_prefix(request_at(i - 1).prompt, r.prompt));
    cum_compute[i + 1] = cum_compute[i] + shared_compute(cost, r, shared_with_previous[i]);
    cum_memory[i + 1] = cum_memory[i] + memory_of(order[i]);
  }
  const auto run_compute = [&](size_t a, size_t b) {
    return a >= b ? 0.0
                  : cum_compute[b] - cum_compute[a] +
                        cost.request_compute_seconds(shared_with_previous[a], 0);
  };
  const auto run_memory = [&](size_t a, size_t b) {
    return a >= b ? 0.0 : cum_memory[b] - cum_memory[a];
  };
  // The blend every part keeps: the root's compute per memory second, priced the same way.
  const double root_ratio = run_memory(0, n) > 0 ? run_compute(0, n) / run_memory(0, n) : 0;

  // The dual scanner's two cursors over the order: [low, high) is still unassigned. Each part
  // takes its share of what is left, (compute + memory) seconds with what it was dealt, so the
  // paths its cuts recompute do not pile up on the last part.
  size_t low = 0, high = n;
  for (int32_t k = 0; k < parts; ++k) {
    std::vector<int32_t>& part = out.parts[static_cast<size_t>(k)];
    double still_dealt = 0, still_shares = 0;
    for (int32_t j = k; j < parts; ++j) {
      still_dealt += dealt_work[static_cast<size_t>(j)];
      still_shares += share(j);
    }
    // Without shares the division stays exactly as before they existed (same cuts to the bit).
    const double unassigned = run_compute(low, high) + run_memory(low, high) + still_dealt;
    const double target = (shares.empty() ? unassigned / static_cast<double>(parts - k)
                                          : unassigned * (share(k) / still_shares)) -
                          dealt_work[static_cast<size_t>(k)];
    const bool last = k + 1 == parts;
    const size_t left_begin = low, right_end = high;
    double compute = 0, memory = 0;
    while (low < high && (last || compute + memory < target)) {
      // Short of the root's blend in compute: take from the left (compute-intensive) end;
      // otherwise from the right (memory-intensive) end. An empty part starts on the left.
      const bool left = memory <= 0 || compute < root_ratio * memory;
      if (left)
        ++low;
      else
        --high;
      compute = run_compute(left_begin, low) + run_compute(high, right_end);
      memory = run_memory(left_begin, low) + run_memory(high, right_end);
    }
    out.work_seconds[static_cast<size_t>(k)] =
        compute + memory + dealt_work[static_cast<size_t>(k)];
    out.compute_seconds[static_cast<size_t>(k)] = compute;
    out.memory_seconds[static_cast<size_t>(k)] = memory;
    // The part in the global plan's order: its left run, then its right run.
    part.insert(part.end(), order.begin() + static_cast<std::ptrdiff_t>(left_begin),
                order.begin() + static_cast<std::ptrdiff_t>(low));
    part.insert(part.end(), order.begin() + static_cast<std::ptrdiff_t>(high),
                order.begin() + static_cast<std::ptrdiff_t>(right_end));
    // Dealt requests in their places of the plan's order.
    std::vector<size_t> position(requests.size());
    if (dealt_output[static_cast<size_t>(k)] > 0) {
      for (size_t i = 0; i < full_order.size(); ++i)
        position[static_cast<size_t>(full_order[i])] = i;
      std::sort(part.begin(), part.end(), [&](int32_t x, int32_t y) {
        return position[static_cast<size_t>(x)] < position[static_cast<size_t>(y)];
      });
    }
  }
  out.root_compute_per_memory = root_ratio;

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
