#include "sched/hybrid_policy.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "cost/cost_model.h"

namespace blend {

IterationCostModel iteration_model_of(const CostModel& cost, int32_t page_tokens) {
  auto time = [&cost](int64_t prefill, int64_t decode, int64_t context) {
    StepShape s;
    s.prefill_tokens = prefill;
    s.prefill_attention_pairs = prefill * prefill / 2;
    s.decode_tokens = decode;
    s.decode_context_tokens = context;
    s.logit_rows = decode + (prefill > 0 ? 1 : 0);
    return cost.estimate_step(s).sequential();
  };
  IterationCostModel m;
  m.prefill_per_token = (time(2048, 0, 0) - time(256, 0, 0)) / (2048 - 256);
  m.prefill_base = std::max(0.0, time(256, 0, 0) - 256 * m.prefill_per_token);
  m.decode_per_token = (time(0, 256, 256) - time(0, 16, 16)) / (256 - 16);
  m.decode_per_context_token = (time(0, 16, 16 * 4096) - time(0, 16, 16)) / (16 * 4095);
  m.decode_per_token -= m.decode_per_context_token;
  m.decode_base =
      std::max(0.0, time(0, 16, 16) - 16 * (m.decode_per_token + m.decode_per_context_token));
  const double host = cost.hardware().host_bandwidth;
  if (host > 0) m.swap_per_page = page_tokens * cost.kv_bytes_per_token_per_device() / host;
  return m;
}

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

int32_t HybridPolicy::chunk_that_fits(const Load& load, const HybridCandidate& c,
                                      double limit) const {
  constexpr int32_t kMinChunk = 16;  // smaller chunks cost more in per-step overhead than they win
  if (!c.prefill || c.tokens <= kMinChunk) return 0;
  int32_t lo = 0, hi = c.tokens - 1;  // the largest k in [kMinChunk, tokens) that fits
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    HybridCandidate part = c;
    part.tokens = mid;
    Load with = load;
    with.add(part);
    if (seconds(with) <= limit) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo >= kMinChunk ? lo : 0;
}

HybridSelection HybridPolicy::select(std::span<const HybridCandidate> rt,
                                     std::span<const HybridCandidate> be, double now,
                                     int64_t free_pages, int64_t be_pages) {
  HybridSelection sel;
  Load load;
  constexpr double kNever = std::numeric_limits<double>::infinity();

  // RT requests, most urgent first (Alg. 1 lines 3-15). The iteration must end before the
  // earliest deadline it can still meet. A deadline is lost when it has passed or when not even
  // an iteration of that request alone meets it; a lost deadline sets no limit (no batch makes
  // it on time, and shrinking the batch for it would make the requests behind it late too:
  // measured on the simulator, that spiral cost more than half of the RT and BE throughput; on
  // hardware slower than the targets, a CPU serving GPU-sized TPOT targets, it cut every step
  // to one or two requests). A decode with a lost deadline keeps its place in front. A prompt
  // with a lost TTFT deadline yields to those that can still meet theirs (EDF's domino effect
  // under overload), for ever by default, or until it is HybridOptions::overdue_after_slos
  // targets late.
  std::vector<char> lost(rt.size());
  for (size_t i = 0; i < rt.size(); ++i) {
    Load alone;
    alone.add(rt[i]);
    const double own = rt[i].deadline - now;
    lost[i] = own <= 0 || seconds(alone) > own;
  }
  std::vector<size_t> order(rt.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const double overdue_after = options_.overdue_after_slos;
  auto yields = [&](size_t i) {
    const HybridCandidate& c = rt[i];
    const bool overdue =
        overdue_after > 0 && c.ttft_slo > 0 && now - c.deadline >= overdue_after * c.ttft_slo;
    return c.first_token && lost[i] && !overdue;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool ya = yields(a), yb = yields(b);
    if (ya != yb) return yb;
    return rt[a].deadline < rt[b].deadline;
  });
  double slack = kNever;  // the earliest deadline among the selected ones still to be met
  for (size_t i : order) {
    if (load.requests >= batch_size_) break;
    // One that needs a KV page none is free for waits (pages free up as sequences finish); the
    // less urgent ones behind it that need none still run. Stopping here instead left ~10 RT
    // decodes a step idle with their KV held at the knee (OPT-13B, 5 RT/s on the simulator).
    if (load.pages + rt[i].pages_needed > free_pages + be_pages) continue;
    const double limit = lost[i] ? slack : std::min(slack, rt[i].deadline - now);
    load.add(rt[i]);
    if (seconds(load) > limit) {
      sel.rt_at_risk = true;
      if (!sel.rt.empty()) {  // the most urgent one runs even when it cannot make it
        load.add(rt[i], -1);
        // A prompt that does not fit whole may still start with a chunk that does
        // (chunked prefill, Sarathi): it then waits less for its first token.
        if (const int32_t k = chunk_that_fits(load, rt[i], limit); k > 0) {
          HybridCandidate part = rt[i];
          part.tokens = k;
          load.add(part);
          sel.rt.push_back(i);
          sel.rt_tokens.push_back(k);
        }
        break;
      }
    }
    slack = limit;
    sel.rt.push_back(i);
    sel.rt_tokens.push_back(rt[i].tokens);
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
    const double limit = slack;
    if (load.requests < batch_size_) {
      Load with = load;
      with.add(c);
      if (with.pages <= free_pages && seconds(with) <= limit) {
        load = with;
        sel.be.push_back(j);
        sel.be_tokens.push_back(c.tokens);
      } else if (const int32_t k = chunk_that_fits(load, c, limit);
                 k > 0 && load.pages + c.pages_needed <= free_pages) {
        HybridCandidate part = c;
        part.tokens = k;
        load.add(part);
        sel.be.push_back(j);
        sel.be_tokens.push_back(k);
      }
      continue;
    }
    if (sel.rt.empty()) break;
    const HybridCandidate& least = rt[sel.rt.back()];
    Load swapped = load;
    swapped.add(least, -1);
    swapped.add(c);
    const double wait = std::max(mean_iteration_, seconds(swapped));
    const double new_limit = slack;
    if (least.deadline - now < 2 * wait) break;  // the rest are at least as urgent
    if (swapped.pages > free_pages || seconds(swapped) > new_limit) continue;
    load = swapped;
    sel.rt.pop_back();
    sel.rt_tokens.pop_back();
    sel.be.push_back(j);
    sel.be_tokens.push_back(c.tokens);
  }

  sel.estimated_seconds = seconds(load);
  // Adaptive batch size (§4.2): grow while no RT request is at risk, back off when one is.
  // BROS resets to the initial size; we halve instead (never below it): under sustained load a
  // violation is predicted almost every iteration, and a reset then pins the batch at the
  // initial size and throughput collapses (measured with `blend simulate-serve`, rates 4-8).
  batch_size_ = sel.rt_at_risk
                    ? std::max(options_.initial_batch, batch_size_ / 2)
                    : static_cast<int32_t>(std::min<int64_t>(
                          options_.max_batch, int64_t{batch_size_} + options_.batch_step));
  return sel;
}

}  // namespace blend
