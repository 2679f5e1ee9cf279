// A BlendServe plan's admission stream fed to an engine before every step: the one planned
// runner of `blend batch` / `blend simulate` (offline/planned_run) and of the server's Batch
// API (server/batch_routes, planned jobs beside real-time traffic). It knows the engine's
// interface only, no concrete backend.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "cost/cost_model.h"
#include "engine/engine.h"
#include "plan/admission_source.h"

namespace blend {

// One request of an offline run: the engine request whole (so that every field a line set,
// adaptive_blocks included, reaches the engine whatever the order; issue 55) and what the
// planner knows of it. `request.model` keeps the planner's models apart too; (request.id,
// request.index) is unique.
struct OfflineRequest {
  GenerationRequest request;
  double output_estimate = 0;  // what the planner believes (exact when output_known)
  bool output_known = false;
  // The simulator's true output length when it is hidden from the planner and the scheduler:
  // backend/sim's token source samples EOS there (run_planned's `sim_tokens`).
  std::optional<int32_t> simulated_output_tokens;
};

// Output-length sampling (BlendServe §5.1): before planning, a fraction of the requests whose
// output length is not known runs first, in input order; their true lengths estimate the rest
// (estimate_output_lengths: own subtree, then siblings, then ancestors). Their results go to
// the caller like any other: nothing is computed twice.
struct SamplingOptions {
  double fraction = 0;  // p; 0 = no sampling pass (the requests' own estimates are used)
  uint64_t seed = 0;    // which requests are sampled
};

// A batch line's n samples (OpenAI's n) as a planned run's requests: n requests of one prompt
// (the prefix tree shares it), sample i seeded apart (GenerationRequest::index). A line that
// ignores EOS has a known length; the others are assumed `assumed_output` tokens (capped by
// max_tokens) until the sampling pass estimates them. `blend batch` and the server's Batch API
// plan their lines so (issue 55: the server planned one request of n * max_tokens).
std::vector<OfflineRequest> line_samples(const GenerationRequest& line, int32_t n,
                                         double assumed_output);

// A plan's admission stream fed to an engine before every step (plan/admission_source.h): the
// one planned runner of `blend batch` (run_planned) and of the server's Batch API jobs, which
// run it beside real-time traffic. Per step, on the engine's thread:
//
//   feed.report_ended();                      // what ended in the last step
//   feed.admit(submit);                       // what the plan admits now
//   budget = feed.step_token_budget();        // the plan's pacing (nullopt: the engine's own)
//   engine.step();
class PlannedFeed {
 public:
  struct Options {
    plan::Policy policy = plan::Policy::kBlend;
    double kv_memory_bytes = 0;  // the KV reservations the plan admits against
    plan::PlannerKnobs planner;
    int32_t max_step_tokens = 0;  // the engine's own step budget
    SamplingOptions sampling;
  };
  // The owner runs request r (an index into the requests): it submits `request` to the engine,
  // calls `on_token` for each token it produces and `ended` once when it ends, with its output
  // tokens (none: it failed).
  using Ended = std::function<void(std::optional<double> output_tokens)>;
  using Submit = std::function<void(int32_t r, GenerationRequest request,
                                    Engine::TokenCallback on_token, Ended ended)>;

  // `engine` tells how it runs a step (the pacing differs for engines that overlap compute
  // and memory); it is not kept.
  PlannedFeed(std::vector<OfflineRequest> requests, const CostModel& cost, const Engine& engine,
              const Options& options);
  PlannedFeed(const PlannedFeed&) = delete;  // the callbacks it hands out point into it
  PlannedFeed& operator=(const PlannedFeed&) = delete;

  void report_ended();
  // Submits what the plan admits now; returns how many. `all` hands out every request left
  // (an owner's way out when the plan admits nothing while none of its requests runs).
  size_t admit(const Submit& submit, bool all = false);
  std::optional<int32_t> step_token_budget() const { return source_.step_token_budget(); }
  // Nothing runs, nothing ended unreported and the plan admits nothing more: it never will.
  bool stalled() const {
    return ended_.empty() && source_.in_flight() == 0 && !source_.exhausted();
  }
  bool exhausted() const { return source_.exhausted(); }  // every request handed out
  size_t waiting() const { return source_.size() - source_.handed_out(); }
  const plan::AdmissionSource& source() const { return source_; }

 private:
  std::vector<OfflineRequest> requests_;  // each moved out as it is submitted
  plan::AdmissionSource source_;
  std::vector<double> generated_;  // tokens each request has produced
  std::vector<std::pair<int32_t, std::optional<double>>> ended_;  // since report_ended()
};

}  // namespace blend
