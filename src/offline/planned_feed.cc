#include "offline/planned_feed.h"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "core/error.h"

namespace blend {

namespace {

std::vector<plan::SourceRequest> source_requests(const std::vector<OfflineRequest>& requests) {
  std::vector<plan::SourceRequest> out;
  out.reserve(requests.size());
  std::unordered_set<std::string> ids;
  for (const OfflineRequest& q : requests) {
    const GenerationRequest& g = q.request;
    out.push_back({{g.id, g.prompt, q.output_estimate, q.output_known, 0, g.model},
                   static_cast<double>(g.params.max_tokens)});
    if (!ids.insert(g.id + "\n" + std::to_string(g.index)).second)
      throw Error("duplicate request id " + g.id +
                  (g.index ? " (sample " + std::to_string(g.index) + ")" : ""));
  }
  return out;
}

}  // namespace

std::vector<OfflineRequest> line_samples(const GenerationRequest& line, int32_t n,
                                         double assumed_output) {
  const bool known = line.params.ignore_eos;
  const double max_tokens = line.params.max_tokens;
  std::vector<OfflineRequest> out;
  out.reserve(static_cast<size_t>(std::max(n, 0)));
  for (int32_t i = 0; i < n; ++i) {
    OfflineRequest q{line, known ? max_tokens : std::min(assumed_output, max_tokens), known};
    q.request.index = i;
    out.push_back(std::move(q));
  }
  return out;
}

PlannedFeed::PlannedFeed(std::vector<OfflineRequest> requests, const CostModel& cost,
                         const Engine& engine, const Options& options)
    : requests_(std::move(requests)),
      source_(source_requests(requests_), cost,
              [&] {
                // The §5.1 sampling pass, the plan and its admission stream, paced for how the
                // engine runs a step.
                plan::PlannerKnobs knobs = options.planner;
                knobs.pacing.sequential_steps = !engine.overlaps_compute_and_memory();
                return plan::SourceOptions{.policy = options.policy,
                                           .kv_memory_bytes = options.kv_memory_bytes,
                                           .planner = knobs,
                                           .max_step_tokens = options.max_step_tokens,
                                           .sample_fraction = options.sampling.fraction,
                                           .sample_seed = options.sampling.seed};
              }()),
      generated_(requests_.size(), 0) {}

void PlannedFeed::report_ended() {
  for (const auto& [r, tokens] : ended_) source_.on_finished(r, tokens);
  ended_.clear();
}

size_t PlannedFeed::admit(const Submit& submit, bool all) {
  report_ended();
  const std::vector<int32_t> admitted = all ? source_.admit_rest() : source_.admit();
  for (int32_t r : admitted) {
    Engine::TokenCallback on_token;
    if (source_.streamed(r))  // (the sampling pass's requests do not pace the stream)
      on_token = [this, r](const SampledToken&, std::string_view) {
        source_.on_progress(r, ++generated_[static_cast<size_t>(r)]);
      };
    // Handed out once: the engine takes the request (its prompt) from here. A planned run's
    // requests are best-effort work: the plan, not the SLO classes, orders them.
    GenerationRequest request = std::move(requests_[static_cast<size_t>(r)].request);
    request.request_class = RequestClass::kBestEffort;
    submit(r, std::move(request), std::move(on_token),
           [this, r](std::optional<double> tokens) { ended_.emplace_back(r, tokens); });
  }
  return admitted.size();
}

}  // namespace blend
