#include "harness/serving_sim.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/sim/sim_backend.h"
#include "core/error.h"
#include "harness/load_generator.h"
#include "harness/synth.h"

namespace blend::online {

namespace {

struct RtTiming {
  double arrival = 0, first = -1, last = 0;
  int64_t tokens = 0;
};

}  // namespace

std::vector<std::pair<int32_t, int32_t>> sharegpt_lengths(const std::string& traces_dir,
                                                          int32_t max_context) {
  const workload::Source s = workload::load_source("sharegpt", traces_dir);
  std::vector<std::pair<int32_t, int32_t>> out;
  for (const auto& l : s.samples)
    if (l.prompt_tokens >= 1 && l.output_tokens >= 1 && l.prompt_tokens <= 1024 &&
        l.prompt_tokens + l.output_tokens <= max_context)
      out.emplace_back(static_cast<int32_t>(l.prompt_tokens),
                       static_cast<int32_t>(l.output_tokens));
  if (out.empty())
    throw Error("no ShareGPT request fits a context of " + std::to_string(max_context));
  return out;
}

ServingReport simulate_serving(Engine& engine, SimBackend& backend, const ServingWorkload& w) {
  if (w.rt_lengths.empty()) throw Error("simulate_serving: no RT request lengths");
  std::mt19937_64 rng(w.seed);
  auto uniform = [&rng](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  // Token ids do not matter to the simulator, but distinct prompts keep the prefix cache from
  // finding sharing that the trace does not have.
  TokenId next_token = 1;
  auto prompt_of = [&next_token](int32_t n) {
    std::vector<TokenId> p(static_cast<size_t>(n));
    for (auto& t : p) t = next_token++ % (1 << 29) + 1;
    return p;
  };
  auto request = [&](std::string id, int32_t prompt, int32_t output, RequestClass cls) {
    GenerationRequest r;
    r.id = std::move(id);
    r.prompt = prompt_of(prompt);
    r.params.max_tokens = output;
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    r.request_class = cls;
    r.ttft_slo = w.ttft_slo;
    r.tpot_slo = w.tpot_slo;
    return r;
  };

  // RT arrivals: Poisson with rate rt_rate over [0, duration).
  std::vector<double> arrivals;
  std::exponential_distribution<double> gap(w.rt_rate);
  for (double t = gap(rng); t < w.duration_seconds; t += gap(rng)) arrivals.push_back(t);
  std::vector<RtTiming> rt(arrivals.size());

  ServingReport report;
  const double t0 = engine.clock_seconds();
  const EngineStats before = engine.stats();
  int64_t be_in_flight = 0, be_jobs = 0;
  bool drained = false;  // the last RT request has finished
  std::vector<SeqId> be_ids;
  auto submit_be_job = [&] {
    for (int32_t i = 0; i < w.be_batch_requests; ++i) {
      const int32_t prompt = uniform(w.be_prompt_min, w.be_prompt_max);
      GenerationRequest r =
          request("be-" + std::to_string(be_jobs) + "-" + std::to_string(i), prompt,
                  uniform(w.be_output_min, w.be_output_max), RequestClass::kBestEffort);
      be_ids.push_back(engine.submit(std::move(r), [&, prompt](GenerationResult&& g) {
        --be_in_flight;
        if (!drained)
          report.be_tokens_until_drained += prompt + static_cast<int64_t>(g.tokens.size());
        if (engine.clock_seconds() - t0 <= w.duration_seconds) {
          ++report.be_requests;
          report.be_tokens += prompt + static_cast<int64_t>(g.tokens.size());
        }
      }));
      ++be_in_flight;
    }
    ++be_jobs;
  };
  if (w.be_batch_requests > 0) submit_be_job();

  size_t next = 0;
  int64_t rt_open = 0;
  while (next < arrivals.size() || rt_open > 0) {
    const double now = engine.clock_seconds() - t0;
    for (; next < arrivals.size() && arrivals[next] <= now; ++next) {
      const auto& [prompt, output] = w.rt_lengths[static_cast<size_t>(rng() % w.rt_lengths.size())];
      GenerationRequest r =
          request("rt-" + std::to_string(next), prompt, output, RequestClass::kRealtime);
      r.arrival_time = t0 + arrivals[next];
      RtTiming& timing = rt[next];
      timing.arrival = arrivals[next];
      engine.submit(
          std::move(r),
          [&engine, &timing, &rt_open, t0](GenerationResult&& g) {
            timing.last = engine.clock_seconds() - t0;
            timing.tokens = static_cast<int64_t>(g.tokens.size());
            if (timing.first < 0) timing.first = timing.last;
            --rt_open;
          },
          [&engine, &timing, t0](const SampledToken&, std::string_view) {
            if (timing.first < 0) timing.first = engine.clock_seconds() - t0;
          });
      ++rt_open;
    }
    if (be_in_flight == 0 && now < w.duration_seconds && w.be_batch_requests > 0) submit_be_job();
    if (engine.has_work()) {
      engine.step();
    } else if (next < arrivals.size()) {
      backend.advance_to(t0 + arrivals[next]);  // idle until the next arrival
    }
  }
  drained = true;
  report.seconds = engine.clock_seconds() - t0;
  report.steps = engine.stats().steps - before.steps;
  if (report.seconds > 0)
    report.be_throughput_until_drained_tokens_per_s =
        static_cast<double>(report.be_tokens_until_drained) / report.seconds;

  std::vector<RtRecord> records;
  for (const RtTiming& t : rt) {
    RtRecord r;
    r.arrival = t.arrival;
    r.ttft = t.first - t.arrival;
    r.e2e = t.last - t.arrival;
    r.output_tokens = t.tokens;
    r.finished = true;
    records.push_back(r);
  }
  const RtSummary s = summarize(records, w.ttft_slo, w.tpot_slo);
  report.rt_requests = s.rt_requests;
  report.rt_normalized_latency_s = s.rt_normalized_latency_s;
  report.ttft_attainment = s.ttft_attainment;
  report.tpot_attainment = s.tpot_attainment;
  report.ttft_p50 = s.ttft_p50;
  report.ttft_p99 = s.ttft_p99;
  report.tpot_p50 = s.tpot_p50;
  report.tpot_p99 = s.tpot_p99;
  report.be_throughput_tokens_per_s = static_cast<double>(report.be_tokens) / w.duration_seconds;
  report.be_requests_per_s = static_cast<double>(report.be_requests) / w.duration_seconds;
  // BE work still queued is abandoned: cancel it so the engine is idle again.
  for (SeqId id : be_ids) engine.cancel(id);
  return report;
}

}  // namespace blend::online
