// AdmissionSource — a batch's requests handed to an engine one step at a time, in a plan's
// order and pace (BlendServe §5): first the output-length sampling pass (§5.1: a fraction of
// the requests whose output length is not known runs first, and their lengths estimate the
// others'), then the plan of the rest and its admission stream (plan/admission.h: the dual
// scanner for blend, the plan's order for fcfs / dfs / random). It knows no engine: whoever
// owns the engine loop drives it, once per step:
//
//   for (int32_t r : source.admit()) submit request r;     // what enters the engine now
//   engine budget = source.step_token_budget() (optional); // the dual scanner's pacing
//   engine.step();        // tokens -> source.on_progress(r, generated so far)
//   ended requests -> source.on_finished(r, output length), after the step
//
// offline/planned_feed's PlannedFeed is that owner for `blend batch` / `blend simulate` and the
// server's Batch API (planned jobs beside real-time traffic) alike.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "plan/admission.h"
#include "plan/planner.h"
#include "plan/prefix_tree.h"

namespace blend::plan {

struct SourceRequest {
  PlanRequest request;  // id, prompt, the caller's output estimate (exact when known)
  // An output length estimated by the sampling pass is capped here (the request's max_tokens).
  double max_output = std::numeric_limits<double>::infinity();
};

// What the experiments vary in the planner (defaults: as `blend batch` runs it).
struct PlannerKnobs {
  PacingOptions pacing;  // blend's capacity pacing; its max_step_tokens is SourceOptions'
  std::optional<double> split_threshold_tokens;  // Alg. 2's t (PlanOptions; unset: 99% of s_o)
  // dfs, random and fcfs take each step's token budget from capacity pacing's rule over the work
  // left (PacedWork, with `pacing`'s switches) instead of the engine's fixed one: the baselines
  // with the one rule of pacing that does not depend on blend's order (issue 27).
  bool baselines_paced = false;
};

// Drops capacity pacing's rules by name, for the ablations (`--pacing-without`): "budget" (the
// engine's fixed step budget), "spacing" (no end spacing of memory-intensive requests), "floor"
// (no floor kept for the compute-intensive side). Throws blend::Error on any other name.
void drop_pacing_rules(PacingOptions& pacing, const std::vector<std::string>& rules);

// The dual scanner's options under a blend-planned policy: blend@alg3 is never paced and admits
// by Alg. 3's prefill budgets; blend keeps `pacing` as given.
PacingOptions scanner_options(Policy policy, PacingOptions pacing);

struct SourceOptions {
  Policy policy = Policy::kBlend;
  double kv_memory_bytes = 0;  // the KV reservations the stream admits against
  PlannerKnobs planner;
  int32_t max_step_tokens = 2048;  // the engine's step budget: the pacing's b never exceeds it
  double sample_fraction = 0;      // §5.1's p; 0 = no sampling pass (the callers' estimates)
  uint64_t sample_seed = 0;        // which requests are sampled
};

class AdmissionSource {
 public:
  // `cost` must outlive the source. Nothing is planned yet when a sampling pass comes first.
  AdmissionSource(std::vector<SourceRequest> requests, const CostModel& cost,
                  SourceOptions options);
  AdmissionSource(const AdmissionSource&) = delete;
  AdmissionSource& operator=(const AdmissionSource&) = delete;

  // Call before every engine step: the requests to start now, in order (indices into the
  // constructor's list). The first call hands out the whole sampling pass; later calls hand
  // out nothing until every sampled request has been reported finished; then the rest is
  // planned and each call is one step of the plan's admission stream (its on_step, then what
  // its next() admits), also after the last request was handed out.
  std::vector<int32_t> admit();
  // Hands out every request not handed out yet, by index, and stops admitting: the way out for
  // a caller that finds the stream admitting nothing while none of its requests runs (the
  // streams never do that; planned_run treats it as an error).
  std::vector<int32_t> admit_rest();
  // The token budget the plan's stream wants for the step admit() prepared (capacity pacing).
  std::optional<int32_t> step_token_budget() const;
  // A started request has produced `generated_tokens` so far (during a step).
  void on_progress(int32_t request, double generated_tokens);
  // A started request ended with `output_tokens` tokens, or none known (it failed): report it
  // after the step, before the next admit().
  void on_finished(int32_t request, std::optional<double> output_tokens);

  size_t size() const { return requests_.size(); }
  size_t handed_out() const { return handed_out_; }
  bool exhausted() const { return handed_out_ == requests_.size(); }  // all handed out
  int64_t in_flight() const { return in_flight_; }              // handed out, not reported finished
  bool sampling() const { return phase_ == Phase::kSampling; }  // no plan yet
  // Whether request r is (or will be) handed out by the plan's stream (not the sampling pass).
  bool streamed(int32_t request) const { return !sampled_[static_cast<size_t>(request)]; }
  int64_t sampled_requests() const { return num_sampled_; }
  const Plan* plan() const { return plan_.get(); }  // null until planned (or nothing to plan)
  // s_o of all the requests (sampled ones included); 0 before it is known.
  double sharing_optimal() const { return sharing_optimal_; }

 private:
  enum class Phase { kSampling, kStreaming, kDone };
  void make_plan();  // the requests not sampled, with the sampling pass's estimates
  int32_t hand_out(int32_t request);

  const CostModel& cost_;
  SourceOptions options_;
  std::vector<PlanRequest> requests_;
  std::vector<double> max_output_;
  std::vector<char> sampled_;
  std::vector<char> handed_;
  std::vector<std::optional<double>> lengths_;  // sampled requests' true output lengths
  int64_t num_sampled_ = 0, sampled_running_ = 0;
  bool sampling_started_ = false;
  Phase phase_ = Phase::kSampling;
  // The plan of the requests not sampled (its own indices) and the way back to ours.
  std::vector<PlanRequest> planned_;
  std::vector<int32_t> original_of_;  // planned index -> request index
  std::vector<int32_t> planned_of_;   // request index -> planned index (-1: sampled)
  std::unique_ptr<PrefixTree> tree_;
  std::unique_ptr<Plan> plan_;
  std::unique_ptr<AdmissionStream> stream_;
  int64_t step_ = 0;
  size_t handed_out_ = 0;
  int64_t in_flight_ = 0;
  double sharing_optimal_ = 0;
};

}  // namespace blend::plan
