#include "sched/hybrid_policy.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace blend {

double IterationCostModel::forward_seconds(int64_t prefill_tokens, int64_t decode_tokens,
                                           int64_t decode_context) const {
  double t = 0;
  if (prefill_tokens > 0)
    t += prefill_base + prefill_per_token * static_cast<double>(prefill_tokens);
  if (decode_tokens > 0)
    t += decode_base + decode_per_token * static_cast<double>(decode_tokens) +
         decode_per_context_token * static_cast<double>(decode_context);
  return t;
}

double IterationCostModel::swap_seconds(int64_t pages) const {
  return pages > 0 ? swap_base + swap_per_page * static_cast<double>(pages) : 0.0;
}

double IterationCostModel::iteration_seconds(int64_t prefill_tokens, int64_t decode_tokens,
                                             int64_t decode_context, int64_t swap_pages) const {
  return std::max(forward_seconds(prefill_tokens, decode_tokens, decode_context),
                  swap_seconds(swap_pages));
}

void HybridPolicy::Load::add(const HybridCandidate& c, int sign) {
  if (c.prefill) {
    prefill_tokens += sign * c.tokens;
  } else {
    decode_tokens += sign * c.tokens;
    decode_context += sign * c.context;
  }
  swap_pages += sign * c.checkpointed_pages;
  pages += sign * c.pages_needed;
  requests += sign;
}

HybridPolicy::HybridPolicy(HybridOptions options, IterationCostModel cost)
    : options_(options), cost_(cost), batch_size_(options.initial_batch) {}

double HybridPolicy::seconds(const Load& l) const {
  return cost_.iteration_seconds(l.prefill_tokens, l.decode_tokens, l.decode_context, l.swap_pages);
}

void HybridPolicy::observe_iteration(double s) {
  mean_iteration_ = mean_iteration_ == 0 ? s : 0.8 * mean_iteration_ + 0.2 * s;
}

HybridSelection HybridPolicy::select(std::span<const HybridCandidate> rt,
                                     std::span<const HybridCandidate> be, double now,
                                     int64_t free_pages) {
  HybridSelection sel;
  Load load;
  constexpr double kNever = std::numeric_limits<double>::infinity();

  // RT requests, most urgent first (Alg. 1 lines 3-15).
  std::vector<size_t> order(rt.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return rt[a].deadline < rt[b].deadline; });
  const double slack = order.empty() ? kNever : rt[order[0]].deadline - now;
  for (size_t i : order) {
    if (load.requests >= batch_size_ || load.pages + rt[i].pages_needed > free_pages) break;
    load.add(rt[i]);
    if (seconds(load) > slack) {
      sel.rt_at_risk = true;
      if (!sel.rt.empty()) {  // the most urgent one runs even when already late
        load.add(rt[i], -1);
        break;
      }
    }
    sel.rt.push_back(i);
  }

  // BE requests, fewest pages to swap in first (lines 17-33): fill the batch, or replace the
  // least urgent RT request if it can still make its deadline one iteration later.
  std::vector<size_t> be_order(be.size());
  std::iota(be_order.begin(), be_order.end(), size_t{0});
  std::stable_sort(be_order.begin(), be_order.end(), [&](size_t a, size_t b) {
    return be[a].checkpointed_pages < be[b].checkpointed_pages;
  });
  for (size_t j : be_order) {
    const HybridCandidate& c = be[j];
    const double limit = sel.rt.empty() ? kNever : slack;
    if (load.requests < batch_size_) {
      Load with = load;
      with.add(c);
      if (with.pages <= free_pages && seconds(with) <= limit) {
        load = with;
        sel.be.push_back(j);
      }
      continue;
    }
    if (sel.rt.empty()) break;
    const HybridCandidate& least = rt[sel.rt.back()];
    Load swapped = load;
    swapped.add(least, -1);
    swapped.add(c);
    const double wait = std::max(mean_iteration_, seconds(swapped));
    const double new_limit = sel.rt.size() == 1 ? kNever : slack;
    if (least.deadline - now < 2 * wait) break;  // the rest are at least as urgent
    if (swapped.pages > free_pages || seconds(swapped) > new_limit) continue;
    load = swapped;
    sel.rt.pop_back();
    sel.be.push_back(j);
  }

  sel.estimated_seconds = seconds(load);
  batch_size_ = sel.rt_at_risk ? options_.initial_batch
                               : std::min(options_.max_batch, batch_size_ + options_.batch_step);
  return sel;
}

}  // namespace blend
