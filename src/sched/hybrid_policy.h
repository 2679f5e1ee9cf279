// HybridPolicy — BROS's iteration-level choice of which real-time (RT) and best-effort (BE)
// requests run next (BROS §4, Alg. 1), as a pure function of queues, clocks and a cost model,
// so it can be tested on hand-made queues and driven by the engine or the simulator alike.
//
//  - Iteration cost (§4.1): linear fits per phase — prefill time from its tokens, decode time
//    from its tokens and total context — plus the time to swap checkpointed pages back in.
//    Swaps run asynchronously beside the forward pass, so an iteration takes the larger of the
//    two, not their sum.
//  - Priority packing (§4.2): RT requests in ascending order of the time left to their current
//    token's deadline (TTFT for the first token, TPOT after) join while the estimated iteration
//    still ends before the most urgent deadline it can still meet (a deadline that has passed,
//    or that not even an iteration of that request alone meets, limits nothing: targets the
//    hardware cannot reach must not shrink every step). A request whose first token's deadline is
//    lost goes behind the rest: nothing saves its TTFT, and running it first would make the ones
//    behind it late too (EDF's domino effect under overload; measured past the knee in
//    docs/BENCHMARKS.md, BROS section). Then BE requests, fewest checkpointed pages
//    first, fill the batch, or take the place of the least urgent RT request when that one can
//    still make its deadline one iteration later (constraint (6) with the moving-average
//    iteration latency).
//  - Adaptive batch size (§4.2, TCP-like): start small, grow by a step after every iteration
//    in which no RT request was at risk, reset to the start value when one was.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/sequence.h"

namespace blend {

class CostModel;

// BROS §4.1 cost model: seconds of one iteration.
struct IterationCostModel {
  double prefill_base = 0, prefill_per_token = 0;
  double decode_base = 0, decode_per_token = 0, decode_per_context_token = 0;
  double swap_base = 0, swap_per_page = 0;

  double forward_seconds(int64_t prefill_tokens, int64_t decode_tokens,
                         int64_t decode_context) const;
  double swap_seconds(int64_t pages) const;
  // Forward and swap overlap: the iteration lasts as long as the longer of the two.
  double iteration_seconds(int64_t prefill_tokens, int64_t decode_tokens, int64_t decode_context,
                           int64_t swap_pages) const;
};

// The iteration model the cost model implies (for the simulator, where nothing can be
// profiled): lines through the cost model's sequential step time at two sizes of each phase,
// and the swap line of `page_tokens`-token pages over the hardware's host link (no fixed cost;
// free when the link's rate is unknown).
IterationCostModel iteration_model_of(const CostModel& cost, int32_t page_tokens = 16);

// One request that could take part in the next iteration.
struct HybridCandidate {
  RequestClass cls = RequestClass::kBestEffort;
  double deadline = 0;             // RT: when its next token is due (seconds, same clock as `now`)
  bool prefill = false;            // its next work is (a chunk of) its prompt
  bool first_token = false;        // RT: `deadline` is its TTFT deadline (nothing generated yet)
  double ttft_slo = 0;             // RT first token: its TTFT target (0: unknown, never overdue)
  int32_t tokens = 1;              // tokens it would compute in this iteration
  int64_t context = 0;             // tokens already in its KV cache (decode cost)
  int64_t pages_needed = 0;        // new KV pages this iteration would take
  int64_t checkpointed_pages = 0;  // pages to swap back in before it can run
};

struct HybridOptions {
  // The start (and the floor the batch halves down to on a predicted violation). BROS starts
  // small (8); on the simulator (docs/BENCHMARKS.md, BROS section) a small start cost 10-50% of
  // the TTFT attainment and BE throughput at high load (Llama-3-70B at 10 RT/s: 42% and 2.8
  // req/s from 8, 90% and 5.8 req/s from 256), so the default starts at the running-set size.
  int32_t initial_batch = 256;
  int32_t batch_step = 4;  // growth after an iteration with no RT request at risk
  // Its own ceiling; the scheduler lowers it to its running set's size (--max-running), so by
  // default the running set is the ceiling.
  int32_t max_batch = std::numeric_limits<int32_t>::max();
  // A prompt that missed its TTFT deadline yields to those that can still meet theirs; with
  // this > 0 it does so only until it is this many TTFT targets late, then runs first (bounds
  // the wait under sustained overload; 0 = yields for ever, BROS's attainment-first order).
  // Off by default: on the paper-scale simulator it cuts TTFT attainment near capacity (OPT-13B
  // at 6 RT/s: 0.83 -> 0.18) while it bounds a closed-loop soak's tail (p99 62 s -> 3 s);
  // docs/BENCHMARKS.md.
  double overdue_after_slos = 0;
  // Alg. 1 as BROS publishes it: the pages of running BE sequences count as room for an RT
  // request (it then shares a BE page, FindPreemptBlock, or drops a BE sequence, §5.2).
  // kAuto: on when a dropped sequence's KV swaps out to a host tier (SchedulerOptions::
  // drops_swap_out), off when it would be recomputed. Measured on the simulator's tuning seeds
  // (2 and 3; docs/BENCHMARKS.md "A dropped BE request swaps out"): with recomputed drops it
  // cost 4-33% of the BE throughput for at most 2.8 points of TTFT attainment; with swapped
  // ones -0.1 to +5 points of attainment for -0.4% to -2.6% of BE below the knee, +2.6% to +8%
  // at it.
  enum class PreemptBePages { kAuto, kOn, kOff };
  PreemptBePages preempt_be_pages = PreemptBePages::kAuto;
};

struct HybridSelection {
  std::vector<size_t> rt;  // indices into the RT candidates, most urgent first
  std::vector<size_t> be;  // indices into the BE candidates, in the order chosen
  // Tokens granted to each selected candidate (parallel to rt / be): its `tokens`, or for a
  // prefill a shorter chunk that still fits the iteration's time limit.
  std::vector<int32_t> rt_tokens, be_tokens;
  double estimated_seconds = 0;
  bool rt_at_risk = false;  // some RT request could not be placed within its deadline
};

class HybridPolicy {
 public:
  HybridPolicy(HybridOptions options, IterationCostModel cost);

  // Alg. 1. `free_pages` counts the empty KV pages; a candidate needing more than are left is
  // passed over for this iteration, and the ones behind it are still considered. RT candidates
  // may also take `be_pages`, the pages BE sequences hold that they could share or free (the
  // caller passes 0 unless HybridOptions::preempt_be_pages). Updates the adaptive batch size.
  HybridSelection select(std::span<const HybridCandidate> rt, std::span<const HybridCandidate> be,
                         double now, int64_t free_pages, int64_t be_pages = 0);
  // Feeds the measured latency of the iteration just run into the moving average.
  void observe_iteration(double seconds);

  // The iteration model in use, and a newer one (sched/iteration_fit refits it while serving).
  const IterationCostModel& cost() const { return cost_; }
  void set_cost(const IterationCostModel& cost) { cost_ = cost; }

  int32_t batch_size() const { return batch_size_; }
  double mean_iteration_seconds() const { return mean_iteration_; }

 private:
  struct Load {
    int64_t prefill_tokens = 0, decode_tokens = 0, decode_context = 0, swap_pages = 0;
    int64_t pages = 0;
    int32_t requests = 0;
    void add(const HybridCandidate& c, int sign = 1);
  };
  double seconds(const Load& l) const;
  // The longest prefill chunk of `c` (at least kMinChunk tokens) that keeps `load` within
  // `limit` seconds; 0 when none does.
  int32_t chunk_that_fits(const Load& load, const HybridCandidate& c, double limit) const;

  HybridOptions options_;
  IterationCostModel cost_;
  int32_t batch_size_;
  double mean_iteration_ = 0;
};

}  // namespace blend
