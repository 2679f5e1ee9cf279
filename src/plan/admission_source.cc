#include "plan/admission_source.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"

namespace blend::plan {
namespace {

// Picks round(p x n) of the n requests with unknown output lengths (at least one when p > 0),
// reproducibly from `seed`.
std::vector<char> choose_samples(const std::vector<PlanRequest>& requests, double fraction,
                                 uint64_t seed) {
  std::vector<char> chosen(requests.size(), 0);
  if (fraction <= 0) return chosen;
  std::vector<size_t> unknown;
  for (size_t i = 0; i < requests.size(); ++i)
    if (!requests[i].output_known) unknown.push_back(i);
  if (unknown.empty()) return chosen;
  const auto want = std::clamp<size_t>(
      static_cast<size_t>(std::llround(fraction * static_cast<double>(unknown.size()))), 1,
      unknown.size());
  std::mt19937_64 rng(seed);
  std::shuffle(unknown.begin(), unknown.end(), rng);
  for (size_t k = 0; k < want; ++k) chosen[unknown[k]] = 1;
  return chosen;
}

}  // namespace

AdmissionSource::AdmissionSource(std::vector<SourceRequest> requests, const CostModel& cost,
                                 SourceOptions options)
    : cost_(cost), options_(options) {
  requests_.reserve(requests.size());
  max_output_.reserve(requests.size());
  for (SourceRequest& r : requests) {
    requests_.push_back(std::move(r.request));
    max_output_.push_back(r.max_output);
  }
  sampled_ = choose_samples(requests_, options_.sample_fraction, options_.sample_seed);
  handed_.assign(requests_.size(), 0);
  lengths_.resize(requests_.size());
  num_sampled_ = std::count(sampled_.begin(), sampled_.end(), 1);
  if (num_sampled_ == 0) make_plan();
}

int32_t AdmissionSource::hand_out(int32_t request) {
  handed_[static_cast<size_t>(request)] = 1;
  ++handed_out_;
  ++in_flight_;
  return request;
}

void drop_pacing_rules(PacingOptions& pacing, const std::vector<std::string>& rules) {
  for (const std::string& rule : rules) {
    if (rule == "budget")
      pacing.step_budget = false;
    else if (rule == "spacing")
      pacing.end_spacing = false;
    else if (rule == "floor")
      pacing.left_floor = false;
    else
      throw Error("--pacing-without takes budget, spacing or floor, not \"" + rule + "\"");
  }
}

PacingOptions scanner_options(Policy policy, PacingOptions pacing) {
  const bool alg3 = policy == Policy::kBlendAlg3;  // the published algorithm
  pacing.enabled = pacing.enabled && !alg3;
  pacing.prefill_budgets = alg3;
  return pacing;
}

void AdmissionSource::make_plan() {
  planned_of_.assign(requests_.size(), -1);
  if (num_sampled_ > 0) {
    // §5.1: the sampled lengths estimate the others' over the prefix tree of all requests.
    double fallback = 0;
    int64_t known = 0;
    for (const std::optional<double>& l : lengths_)
      if (l) {
        fallback += *l;
        ++known;
      }
    const PrefixTree all_tree(requests_);
    sharing_optimal_ = all_tree.optimal_sharing_ratio();
    std::vector<OutputEstimate> estimate;
    if (known > 0)  // else every sample failed: the callers' own estimates stand
      estimate = estimate_output_lengths(all_tree, lengths_, fallback / static_cast<double>(known));
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (sampled_[i]) continue;
      PlanRequest q = requests_[i];
      q.output_spread = 0;
      if (!q.output_known && !estimate.empty()) {
        q.output_tokens = std::min<double>(estimate[i].tokens, max_output_[i]);
        q.output_spread = estimate[i].spread;
      }
      planned_of_[i] = static_cast<int32_t>(planned_.size());
      original_of_.push_back(static_cast<int32_t>(i));
      planned_.push_back(std::move(q));
    }
  } else {
    planned_ = requests_;
    for (size_t i = 0; i < requests_.size(); ++i) {
      planned_of_[i] = static_cast<int32_t>(i);
      original_of_.push_back(static_cast<int32_t>(i));
    }
  }
  if (planned_.empty()) {  // everything was sampled (or there was nothing)
    phase_ = Phase::kDone;
    return;
  }
  tree_ = std::make_unique<PrefixTree>(planned_);
  PlanOptions plan_options;
  plan_options.policy = options_.policy;
  plan_options.split_threshold_tokens = options_.planner.split_threshold_tokens;
  plan_ = std::make_unique<Plan>(plan::make_plan(*tree_, cost_, plan_options));
  if (num_sampled_ == 0) sharing_optimal_ = plan_->optimal_sharing_ratio;
  if (blend_planned(options_.policy)) {
    PacingOptions pacing = scanner_options(options_.policy, options_.planner.pacing);
    pacing.max_step_tokens = options_.max_step_tokens;
    stream_ = std::make_unique<DualScanner>(*plan_, planned_, cost_, options_.kv_memory_bytes, 128,
                                            pacing);
  } else {  // fcfs: no reservations; the engine's scheduler admits, as `blend batch --policy
    // fcfs` (and vLLM, SGLang) do. dfs and random: the plan's order within reservations.
    std::optional<PacingOptions> pacing;
    if (options_.planner.baselines_paced) {
      pacing = options_.planner.pacing;
      pacing->max_step_tokens = options_.max_step_tokens;
    }
    stream_ = std::make_unique<OrderedStream>(*plan_, planned_, cost_,
                                              options_.policy == Policy::kFcfs
                                                  ? std::numeric_limits<double>::infinity()
                                                  : options_.kv_memory_bytes,
                                              pacing, options_.kv_memory_bytes);
  }
  phase_ = Phase::kStreaming;
}

std::vector<int32_t> AdmissionSource::admit() {
  std::vector<int32_t> out;
  if (phase_ == Phase::kSampling) {
    if (!sampling_started_) {
      sampling_started_ = true;
      for (size_t i = 0; i < requests_.size(); ++i)
        if (sampled_[i]) out.push_back(hand_out(static_cast<int32_t>(i)));
      sampled_running_ = num_sampled_;
      return out;
    }
    if (sampled_running_ > 0) return out;
    make_plan();
  }
  if (phase_ != Phase::kStreaming) return out;
  stream_->on_step(step_++);
  while (const std::optional<int32_t> r = stream_->next())
    out.push_back(hand_out(original_of_[static_cast<size_t>(*r)]));
  return out;
}

std::vector<int32_t> AdmissionSource::admit_rest() {
  std::vector<int32_t> out;
  for (size_t i = 0; i < requests_.size(); ++i)
    if (!handed_[i]) out.push_back(hand_out(static_cast<int32_t>(i)));
  phase_ = Phase::kDone;
  return out;
}

std::optional<int32_t> AdmissionSource::step_token_budget() const {
  return phase_ == Phase::kStreaming ? stream_->step_token_budget() : std::nullopt;
}

void AdmissionSource::on_progress(int32_t request, double generated_tokens) {
  if (phase_ != Phase::kStreaming || planned_of_.empty()) return;
  const int32_t p = planned_of_[static_cast<size_t>(request)];
  if (p >= 0) stream_->on_progress(p, generated_tokens);
}

void AdmissionSource::on_finished(int32_t request, std::optional<double> output_tokens) {
  --in_flight_;
  const auto i = static_cast<size_t>(request);
  if (sampled_[i]) {
    lengths_[i] = output_tokens;
    --sampled_running_;
    return;
  }
  if (phase_ == Phase::kStreaming) stream_->on_finished(planned_of_[i]);
}

}  // namespace blend::plan
