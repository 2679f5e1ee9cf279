// Load generator — BROS's online experiment (§7.1) against a real `blend serve` over HTTP, the
// wall-clock counterpart of serving_sim.h (same workload shape, same metric definitions).
//
// What run_load() promises:
//  - RT load: Poisson arrivals at `rt_rate` per second over [0, duration); each is one
//    POST /v1/completions with `stream: true`, a prompt of random token ids, `ignore_eos: true`,
//    `max_tokens` = its output length and the `ttft_slo` / `tpot_slo` extension fields. Lengths
//    are drawn from `rt_lengths` (ShareGPT, see sharegpt_lengths) and multiplied by
//    `length_scale` (at least 1 token each). Every request runs on a client thread of its own;
//    at most `max_rt_requests` are issued and at most `max_in_flight` run at once (an arrival
//    over that cap is recorded as failed, not delayed). None is issued after `duration`.
//  - TTFT is the time from sending the request to the first SSE chunk with non-empty text;
//    e2e the time to the chunk that carries the finish reason; output tokens come from the
//    stream's usage chunk; TPOT = (e2e - TTFT) / (output tokens - 1).
//  - In-flight RT requests get `drain_timeout` seconds after the window; the ones unfinished
//    then, and any that got an HTTP or stream error, are failures.
//  - BE load: Batch API jobs (POST /v1/files, POST /v1/batches, polling GET /v1/batches/{id})
//    of `be_batch_requests` lines each, prompt and output lengths uniform in the given ranges
//    (times `length_scale`), one job at a time, the next submitted as soon as the previous one
//    is done, none after the window. BE throughput counts the BE requests the server finished
//    within the window, partial jobs included, read from the server's /metrics counters
//    (blend:request_success_total, prompt and generation tokens, class "be") at the window's
//    start and end; tokens are prompt + output. The job still running after the RT requests
//    have drained is cancelled.
//  - The scheduler fraction is the change of blend:scheduler_seconds_total over the change of
//    blend:step_seconds_total from the start of the run to its end (BROS Fig. 14).
// Metric definitions (summarize): normalized latency = mean over finished RT requests of
// e2e / output tokens; TTFT (TPOT) attainment = share of all issued RT requests whose TTFT
// (TPOT) met the target, failures counting as misses; percentiles (nearest rank) over finished
// requests.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/serving_sim.h"

namespace blend::online {

// One RT request as the client saw it.
struct RtRecord {
  double arrival = 0;  // seconds since the start of the run, when it was sent
  double ttft = 0;     // seconds (finished requests)
  double e2e = 0;
  int64_t output_tokens = 0;
  bool finished = false;  // false: failed or unfinished (error says why)
  std::string error;
  std::string model;  // the "model" it asked for
};

// The ServingReport of a set of RT records (metric definitions above), with `rt_failed`
// failures. BE fields are left for the caller.
struct RtSummary {
  int64_t rt_requests = 0, rt_failed = 0;
  double rt_normalized_latency_s = 0;
  double ttft_attainment = 0, tpot_attainment = 0;
  double ttft_p50 = 0, ttft_p99 = 0, tpot_p50 = 0, tpot_p99 = 0;
  double ttft_p95 = 0, e2e_p50 = 0, e2e_p95 = 0;
  int64_t output_tokens = 0;  // of the finished requests
};
RtSummary summarize(const std::vector<RtRecord>& records, double ttft_slo, double tpot_slo);
double tpot_of(const RtRecord& r);  // (e2e - ttft) / (tokens - 1); 0 with one token
// Nearest-rank percentile (q in [0, 1]); 0 for an empty list.
double percentile(std::vector<double> values, double q);

struct LoadOptions {
  std::string host = "127.0.0.1";  // loopback only (check_loopback)
  int port = 8000;
  std::string model;  // the "model" field; empty = the first id of GET /v1/models
  // Several models (BlockLLM's tenants): each RT request asks for one of `models`, drawn with
  // probability proportional to 1 / rank^zipf (rank 1 = the first; zipf 0 = uniform) from a
  // stream of its own, so the arrivals and lengths are those of the one-model run. A model
  // named in `model_ports` goes to that port of `host` (a deployment with an engine per
  // model), the others to `port`. BE jobs and the /metrics figures stay on `port`.
  std::vector<std::string> models;
  double zipf = 0;
  std::map<std::string, int> model_ports;
  double duration_seconds = 60;
  double rt_rate = 1;
  std::vector<std::pair<int32_t, int32_t>> rt_lengths;  // (prompt, output) to draw from
  double length_scale = 1;
  int32_t be_batch_requests = 16;  // 0 = no BE load
  int32_t be_prompt_min = 512, be_prompt_max = 1024;
  int32_t be_output_min = 32, be_output_max = 128;
  double ttft_slo = 0.4, tpot_slo = 0.2;
  int32_t max_token_id = 30000;  // prompt ids are drawn from [100, max_token_id)
  int64_t max_rt_requests = 10000;
  int32_t max_in_flight = 48;  // under `blend serve --threads-http` (512 by default)
  double drain_timeout_seconds = 60;
  uint64_t seed = 1;
};

struct LoadReport {
  RtSummary rt;
  std::vector<RtRecord> records;
  int64_t be_jobs = 0;                 // batch jobs submitted
  std::vector<double> be_job_seconds;  // creation to completion of each job done in the window
  int64_t be_requests = 0;             // finished within the window
  int64_t be_tokens = 0;               // their prompt + output tokens
  double be_requests_per_s = 0, be_throughput_tokens_per_s = 0;
  double scheduler_seconds = 0, step_seconds = 0;
  double scheduler_fraction = 0;  // scheduler_seconds / step_seconds (0 without steps)
  int64_t steps = 0;
  double seconds = 0;  // wall time of the run, drain included
  // Output tokens of the finished RT requests over `seconds` (what the deployment served).
  double rt_output_tokens_per_s = 0;
  // Per model, with LoadOptions::models: its requests' summary.
  std::map<std::string, RtSummary> by_model;
};

// One report as a JSON object: policy (the label given), rt_rate, duration_s, length_scale,
// ttft_slo_s, tpot_slo_s, rt_requests, rt_failed, rt_normalized_latency_s, ttft_attainment,
// tpot_attainment, ttft_p50_s, ttft_p99_s, tpot_p50_s, tpot_p99_s, be_jobs, be_requests,
// be_tokens, be_requests_per_s, be_throughput_tokens_per_s, scheduler_seconds, step_seconds,
// steps, scheduler_fraction, seconds.
nlohmann::json to_json(const std::string& policy, const LoadOptions& options,
                       const LoadReport& report);

// One streamed POST /v1/completions as a client sees it (the body asks for `stream` and
// `stream_options.include_usage`): read until [DONE], or until `deadline`. With
// hang_up_after_events > 0 the client closes the connection after that many SSE events, as a
// user who gives up does; such a stream ends `hung_up` (unless it had already finished).
struct StreamOutcome {
  bool finished = false;  // finish reason, usage and [DONE] all seen, no error
  bool hung_up = false;   // the client closed the connection on purpose
  double ttft = 0;        // seconds from sending to the first non-empty text (finished only)
  double e2e = 0;         // ... to the event with the finish reason
  int64_t output_tokens = 0;
  std::string error;  // why it neither finished nor was hung up
};
StreamOutcome stream_completion(const std::string& host, int port, const std::string& body,
                                std::chrono::steady_clock::time_point deadline,
                                int32_t hang_up_after_events = 0);

// `model` when given, else the first model id GET /v1/models lists. Throws blend::Error when no
// server answers at host:port or it lists none: a load run then fails before it starts.
std::string served_model(const std::string& host, int port, const std::string& model);

// One sample line of a Prometheus text exposition (GET /metrics): `name{labels} value`.
struct MetricSample {
  std::string name;
  std::string labels;  // "{...}" as written, or empty
  double value = 0;
};
std::vector<MetricSample> parse_metrics(const std::string& text);
// The sum of the samples named `name` whose labels contain `label` (e.g. "class=\"rt\"";
// empty: all).
double metric_sum(const std::vector<MetricSample>& samples, const std::string& name,
                  const std::string& label = "");

// Throws blend::Error unless `host` is a loopback address (localhost, 127.0.0.0/8, ::1).
void check_loopback(const std::string& host);
// "http://HOST:PORT" (port default 80, no path) -> host, port. Throws blend::Error otherwise.
std::pair<std::string, int> parse_url(const std::string& url);

// Runs the load against the server at options.host:port and measures it (above). Throws
// blend::Error for bad options, a non-loopback host or a server that does not answer.
LoadReport run_load(const LoadOptions& options);

}  // namespace blend::online
