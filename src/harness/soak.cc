#include "harness/soak.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "harness/load_generator.h"

namespace blend::online {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Clock::time_point after(Clock::time_point t0, double seconds) {
  return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// VmRSS of `pid` in MiB; -1 when it cannot be read (the process is gone).
double rss_mib(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  return -1;
}

std::vector<MetricSample> scrape(httplib::Client& c) {
  auto r = c.Get("/metrics");
  if (!r || r->status != 200)
    throw Error("GET /metrics failed" +
                (r ? ": HTTP " + std::to_string(r->status) : ": " + httplib::to_string(r.error())));
  return parse_metrics(r->body);
}

double median_of(std::vector<double> v) {
  return percentile(std::move(v), 0.5);
}

}  // namespace

json to_json(const SoakOptions& o, const SoakReport& r) {
  json rss = json::array();
  for (const auto& [t, mib] : r.rss_mib) rss.push_back({t, mib});
  return {{"clients", o.clients},
          {"duration_s", o.duration_seconds},
          {"hang_up_fraction", o.hang_up_fraction},
          {"be_batch_requests", o.be_batch_requests},
          {"requests", r.requests},
          {"completed", r.completed},
          {"hung_up", r.hung_up},
          {"failed", r.failed},
          {"failures", r.failures},
          {"output_tokens", r.output_tokens},
          {"ttft_p50_s", r.ttft_p50},
          {"ttft_p99_s", r.ttft_p99},
          {"max_open_streams", r.max_open},
          {"be_jobs", r.be_jobs},
          {"be_requests", r.be_requests},
          {"hostile_attempts", r.hostile.attempts},
          {"hostile_unexpected", r.hostile.unexpected},
          {"hostile_completions", r.hostile.completions},
          {"rss_warm_mib", r.rss_warm_mib},
          {"rss_end_mib", r.rss_end_mib},
          {"rss_max_mib", r.rss_max_mib},
          {"rss_mib", rss},
          {"healthy", r.healthy},
          {"server_finished_rt", r.server_finished},
          {"server_cancelled_rt", r.server_cancelled},
          {"server_running_at_end", r.server_running},
          {"server_kv_used_bytes_at_end", r.server_kv_used_bytes},
          {"seconds", r.seconds},
          {"ok", r.ok},
          {"problems", r.problems}};
}

namespace {

// The soak's verdict: RSS growth after warm-up, and every account the clients and the server
// keep that must agree; each disagreement is a problem in the report.
void judge(SoakReport& report, const SoakOptions& o, const std::string& be_error) {
  // RSS: the median of the second tenth (after warm-up) against the median of the last tenth.
  std::vector<double> warm, last;
  for (const auto& [t, mib] : report.rss_mib) {
    if (t >= 0.1 * o.duration_seconds && t < 0.2 * o.duration_seconds) warm.push_back(mib);
    if (t >= 0.9 * o.duration_seconds && t <= o.duration_seconds) last.push_back(mib);
    report.rss_max_mib = std::max(report.rss_max_mib, mib);
  }
  report.rss_warm_mib = median_of(warm);
  report.rss_end_mib = median_of(last);

  auto problem = [&](const std::string& what) { report.problems.push_back(what); };
  if (report.failed > 0) problem(std::to_string(report.failed) + " requests failed");
  if (!be_error.empty()) problem("BE load: " + be_error);
  for (const auto& [what, count] : report.hostile.unexpected)
    problem(std::to_string(count) + " hostile requests answered wrongly (" + what + ")");
  if (!report.healthy) problem("GET /health did not answer 200 at the end");
  if (report.server_running != 0) problem("requests still running at the end");
  if (report.server_kv_used_bytes != 0) problem("KV pages still held by requests at the end");
  // Every stream the clients saw finish was counted finished by the server; every stream they
  // hung up on was finished (it may have ended before the server noticed) or cancelled. The
  // hostile schema requests that were answered are finished requests too.
  const int64_t finished = report.completed + report.hostile.completions;
  if (report.server_finished < static_cast<double>(finished) ||
      report.server_finished + report.server_cancelled !=
          static_cast<double>(finished + report.hung_up))
    problem("the server's finished + cancelled RT requests (" +
            std::to_string(static_cast<int64_t>(report.server_finished)) + " + " +
            std::to_string(static_cast<int64_t>(report.server_cancelled)) +
            ") do not account for the clients' completed + hung-up ones (" +
            std::to_string(finished) + " + " + std::to_string(report.hung_up) + ")");
  if (!warm.empty() && !last.empty() &&
      report.rss_end_mib > report.rss_warm_mib * (1 + o.rss_growth_limit))
    problem("RSS grew from " + std::to_string(std::lround(report.rss_warm_mib)) + " MiB after " +
            "warm-up to " + std::to_string(std::lround(report.rss_end_mib)) +
            " MiB at the end (more than the limit of " +
            std::to_string(std::lround(100 * o.rss_growth_limit)) + "%)");
  report.ok = report.problems.empty();
}

}  // namespace

SoakReport run_soak(const SoakOptions& o) {
  if (o.clients < 1) throw Error("the soak needs at least 1 client");
  if (!(o.duration_seconds > 0)) throw Error("the duration must be > 0 seconds");
  if (!(o.hang_up_fraction >= 0 && o.hang_up_fraction <= 1))
    throw Error("the hang-up fraction must be in [0, 1]");
  if (o.prompt_min < 1 || o.prompt_max < o.prompt_min || o.output_min < 1 ||
      o.output_max < o.output_min)
    throw Error("bad prompt or output length ranges");
  if (o.be_batch_requests < 0) throw Error("the BE batch size must be >= 0");
  if (o.max_token_id <= 100) throw Error("max_token_id must be > 100");
  if (o.hostile_clients < 0) throw Error("the hostile client count must be >= 0");
  check_loopback(o.host);

  httplib::Client control(o.host, o.port);
  control.set_connection_timeout(5, 0);
  control.set_read_timeout(30, 0);
  const std::string model = served_model(o.host, o.port, o.model);
  const std::vector<MetricSample> before = scrape(control);
  const std::string rt = "class=\"rt\"";

  SoakReport report;
  std::mutex mu;  // guards report's counters and `ttfts` from the client threads
  std::vector<double> ttfts;
  std::atomic<int32_t> open{0};
  const Clock::time_point start = Clock::now();
  const Clock::time_point window_end = after(start, o.duration_seconds);
  const Clock::time_point deadline = after(window_end, o.drain_timeout_seconds);

  // BE: the load generator's Batch API loop, with no RT arrivals of its own.
  LoadReport be;
  std::string be_error;
  std::thread be_thread;
  if (o.be_batch_requests > 0) {
    be_thread = std::thread([&] {
      LoadOptions lo;
      lo.host = o.host;
      lo.port = o.port;
      lo.model = model;
      lo.duration_seconds = o.duration_seconds;
      lo.rt_rate = 0;
      lo.be_batch_requests = o.be_batch_requests;
      lo.be_prompt_min = o.prompt_min;
      lo.be_prompt_max = o.prompt_max;
      lo.be_output_min = o.output_min;
      lo.be_output_max = o.output_max;
      lo.max_token_id = o.max_token_id;
      lo.seed = o.seed ^ 0x5bd1e995ULL;
      try {
        be = run_load(lo);
      } catch (const Error& e) {
        be_error = e.what();
      }
    });
  }

  std::thread hostile_thread;
  if (o.hostile_clients > 0) {
    hostile_thread = std::thread([&] {
      HostileOptions h;
      h.host = o.host;
      h.port = o.port;
      h.model = model;
      h.clients = o.hostile_clients;
      h.max_body_bytes = o.max_body_bytes;
      h.head_timeout_s = o.head_timeout_s;
      h.schema_values = o.schema_values;
      h.seed = o.seed;
      report.hostile = run_hostile(h, window_end);  // only this thread writes it until joined
    });
  }

  std::atomic<bool> sampling{true};
  std::thread sampler;
  if (o.server_pid > 0) {
    sampler = std::thread([&] {
      while (sampling.load()) {
        const double mib = rss_mib(o.server_pid);
        if (mib >= 0) {
          std::lock_guard lock(mu);
          report.rss_mib.emplace_back(since(start), mib);
        }
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    });
  }

  std::vector<std::thread> clients;
  clients.reserve(static_cast<size_t>(o.clients));
  for (int32_t k = 0; k < o.clients; ++k) {
    clients.emplace_back([&, k] {
      std::mt19937_64 rng(o.seed * 1000003ULL + static_cast<uint64_t>(k));
      std::uniform_int_distribution<int32_t> prompt_len(o.prompt_min, o.prompt_max);
      std::uniform_int_distribution<int32_t> output_len(o.output_min, o.output_max);
      std::uniform_int_distribution<int32_t> token(100, o.max_token_id - 1);
      std::uniform_int_distribution<int32_t> events(1, 4);
      std::bernoulli_distribution hang_up(o.hang_up_fraction);
      while (Clock::now() < window_end) {
        json prompt = json::array();
        for (int32_t i = prompt_len(rng); i > 0; --i) prompt.push_back(token(rng));
        const std::string body = json{{"model", model},
                                      {"prompt", std::move(prompt)},
                                      {"max_tokens", output_len(rng)},
                                      {"temperature", 0},
                                      {"ignore_eos", true},
                                      {"stream", true},
                                      {"stream_options", {{"include_usage", true}}}}
                                     .dump();
        const int32_t give_up_after = hang_up(rng) ? events(rng) : 0;
        const int32_t now_open = ++open;
        const StreamOutcome out = stream_completion(o.host, o.port, body, deadline, give_up_after);
        --open;
        std::lock_guard lock(mu);
        report.max_open = std::max(report.max_open, now_open);
        ++report.requests;
        if (out.finished) {
          ++report.completed;
          report.output_tokens += out.output_tokens;
          ttfts.push_back(out.ttft);
        } else if (out.hung_up) {
          ++report.hung_up;
        } else {
          ++report.failed;
          ++report.failures[out.error.substr(0, 120)];
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  if (be_thread.joinable()) be_thread.join();
  if (hostile_thread.joinable()) hostile_thread.join();

  // The server's account, once it has settled: hung-up streams are cancelled between steps,
  // and the BE job still running at the window's end was cancelled by the BE loop.
  std::vector<MetricSample> end;
  const Clock::time_point settle = after(Clock::now(), 30);
  do {
    end = scrape(control);
    if (metric_sum(end, "blend:num_requests_running") == 0 &&
        metric_sum(end, "blend:kv_cache_used_bytes") == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (Clock::now() < settle);
  {
    auto h = control.Get("/health");
    report.healthy = h && h->status == 200;
  }
  sampling = false;
  if (sampler.joinable()) sampler.join();
  report.seconds = since(start);

  report.server_finished = metric_sum(end, "blend:request_success_total", rt) -
                           metric_sum(before, "blend:request_success_total", rt);
  report.server_cancelled = metric_sum(end, "blend:request_cancelled_total", rt) -
                            metric_sum(before, "blend:request_cancelled_total", rt);
  report.server_running = metric_sum(end, "blend:num_requests_running");
  report.server_kv_used_bytes = metric_sum(end, "blend:kv_cache_used_bytes");
  report.be_jobs = be.be_jobs;
  report.be_requests = be.be_requests;
  report.ttft_p50 = percentile(ttfts, 0.5);
  report.ttft_p99 = percentile(ttfts, 0.99);

  judge(report, o, be_error);
  return report;
}

}  // namespace blend::online
