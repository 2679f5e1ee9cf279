// IterationFit — BROS's iteration cost model (§4.1) fitted online from the engine's own steps,
// for a server started without a `blend profile` file. Without a model every iteration is
// estimated at 0 s: no RT request is ever at risk, no prompt is chunked to meet a deadline and
// the adaptive batch never backs off, so the hybrid policy degrades to deadline ordering.
//
// The fit is BROS's: linear per phase, prefill time from its tokens, decode time from its tokens
// and total context, each phase with its own base, plus a line of swap time by checkpointed
// pages. It is refitted by nonnegative least squares over a window of the latest steps, so it
// follows a machine whose speed changes (other work on a shared host).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

#include "sched/hybrid_policy.h"

namespace blend {

// One measured step.
struct IterationSample {
  int64_t prefill_tokens = 0, decode_tokens = 0, decode_context = 0;
  double seconds = 0;  // the step's wall time less its swaps: forward pass and host work
  int64_t swap_pages = 0;
  double swap_seconds = 0;  // checkpointing, copying and restoring pages before the forward
};

class IterationFit {
 public:
  // Steps with a forward pass needed before a fit is trusted, and the window refitted over.
  static constexpr size_t kMinSteps = 16;
  explicit IterationFit(size_t window = 1024) : window_(window) {}

  void add(const IterationSample& s);
  bool ready() const { return steps_.size() >= kMinSteps; }
  // The fit over the window (all zero before ready()). A phase the window never saw keeps
  // zero coefficients; a column no step varies (prefill and decode always together) shares
  // its base with the other phase's.
  IterationCostModel fit() const;

 private:
  size_t window_;
  std::deque<IterationSample> steps_;  // with a forward pass
  std::deque<IterationSample> swaps_;  // with pages swapped in
};

}  // namespace blend
