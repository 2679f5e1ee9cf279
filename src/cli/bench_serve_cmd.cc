// `blend bench serve`: BROS's online experiment (§7.1) over HTTP — for each scheduling policy it
// starts the real `blend serve` server in this process (127.0.0.1, a free port, the cpu
// backend), or targets a running one with --url (loopback only), drives it with Poisson RT
// streams and resubmitted Batch API jobs (harness/load_generator) and reports RT latency, SLO
// attainment, BE throughput and the scheduler's share of the step time.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "harness/load_generator.h"
#include "harness/plot.h"
#include "harness/serving_sim.h"
#include "harness/traces.h"
#include "server/server.h"

namespace blend::cli {
namespace {

// SLO defaults for the cpu backend. BROS's 0.4 s / 0.2 s are two to four GPU iterations of a
// 13B model; a small generated model on two CPU cores takes tens of ms per step, so the paper's
// targets keep the same meaning (a few steps) and are kept as they are.
constexpr double kDefaultTtftSlo = 0.4, kDefaultTpotSlo = 0.2;

struct BenchServeArgs {
  std::filesystem::path model;
  std::string policies = "hybrid,fcfs";
  std::string url;
  double duration = 60;
  double rt_rate = 1;
  double length_scale = 1;
  int32_t max_context = 2048;
  std::string traces = workload::default_traces_dir().string();
  std::string profile;
  std::string kv_layout = "auto";
  bool json = false;
  bool policy_given = false;
  std::string plot;                      // PNG of the latency CDFs per class and policy
  std::string models;                    // comma-separated tenants (--models)
  std::vector<std::string> model_ports;  // NAME=PORT (--model-port)
  online::LoadOptions load;
  EngineOptions engine;
};

// `kv_layout` is empty for a server this command did not start (--url).
void print(const std::string& policy, const online::LoadOptions& lo, const online::LoadReport& r,
           bool json, const std::string& kv_layout = "") {
  if (json) {
    nlohmann::json j = online::to_json(policy, lo, r);
    if (!kv_layout.empty()) j["kv_layout"] = kv_layout;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "%-11s rate %5.2f/s: RT %lld req (%lld failed), norm. latency %.4f s/token, TTFT attain "
        "%.1f%% (p50 %.3f p99 %.3f s), TPOT attain %.1f%% (p50 %.4f p99 %.4f s); BE %.2f req/s "
        "%.0f tok/s; scheduler %.2f%% of step time (%lld steps)\n",
        policy.c_str(), lo.rt_rate, static_cast<long long>(r.rt.rt_requests),
        static_cast<long long>(r.rt.rt_failed), r.rt.rt_normalized_latency_s,
        100 * r.rt.ttft_attainment, r.rt.ttft_p50, r.rt.ttft_p99, 100 * r.rt.tpot_attainment,
        r.rt.tpot_p50, r.rt.tpot_p99, r.be_requests_per_s, r.be_throughput_tokens_per_s,
        100 * r.scheduler_fraction, static_cast<long long>(r.steps));
    std::printf("%-11s RT end-to-end p50 %.3f p95 %.3f s, TTFT p95 %.3f s, %.1f output tok/s\n", "",
                r.rt.e2e_p50, r.rt.e2e_p95, r.rt.ttft_p95, r.rt_output_tokens_per_s);
  }
  std::fflush(stdout);
  // Why requests failed, once per distinct reason.
  std::set<std::string> seen;
  for (const auto& rec : r.records)
    if (!rec.finished && seen.insert(rec.error).second && seen.size() <= 5)
      std::fprintf(stderr, "blend bench serve: %s: an RT request failed: %s\n", policy.c_str(),
                   rec.error.c_str());
}

void run(BenchServeArgs& args) {
  online::LoadOptions& lo = args.load;
  if (!(args.duration > 0)) throw Error("--duration must be > 0 seconds");
  if (!(args.rt_rate >= 0)) throw Error("--rt-rate must be >= 0 requests/s");
  if (!(args.length_scale > 0)) throw Error("--length-scale must be > 0");
  if (lo.be_batch_requests < 0) throw Error("--be-batch must be >= 0");
  if (!(lo.ttft_slo > 0) || !(lo.tpot_slo > 0)) throw Error("--ttft-slo/--tpot-slo must be > 0");
  const std::vector<std::string> policies = split_list(args.policies);
  if (policies.empty()) throw Error("--scheduler names no scheduler");
  lo.models = split_list(args.models);
  for (const std::string& mp : args.model_ports) {
    const size_t eq = mp.find('=');
    int port = 0;
    try {
      if (eq != std::string::npos) port = std::stoi(mp.substr(eq + 1));
    } catch (const std::exception&) {
      port = 0;
    }
    if (eq == std::string::npos || eq == 0 || port <= 0)
      throw Error("--model-port " + mp + ": expected NAME=PORT");
    lo.model_ports[mp.substr(0, eq)] = port;
  }
  if (!lo.model_ports.empty() && args.url.empty())
    throw Error("--model-port needs --url: the servers it names are started outside");
  if (!args.url.empty()) {
    if (args.policy_given && policies.size() > 1)
      throw Error("--url targets one running server: give --scheduler at most one label");
    std::tie(lo.host, lo.port) = online::parse_url(args.url);
    online::check_loopback(lo.host);
  } else {
    for (const std::string& p : policies) parse_scheduler_policy(p);
    if (args.model.empty()) throw Error("--model DIR is needed (or --url of a running server)");
    if (!std::filesystem::is_directory(args.model))
      throw Error("--model " + args.model.string() + ": no such model folder");
  }
  lo.duration_seconds = args.duration;
  lo.rt_rate = args.rt_rate;
  lo.length_scale = args.length_scale;
  if (lo.rt_rate > 0) lo.rt_lengths = online::sharegpt_lengths(args.traces, args.max_context);
  std::fprintf(stderr,
               "blend bench serve: SLOs TTFT %.3g s, TPOT %.3g s; RT %.3g req/s for %.3g s, "
               "lengths x%.3g; BE jobs of %d requests\n",
               lo.ttft_slo, lo.tpot_slo, lo.rt_rate, lo.duration_seconds, lo.length_scale,
               lo.be_batch_requests);

  // Latency CDFs per class and policy for --plot: RT TTFT and end-to-end, BE job completion.
  std::vector<CdfSeries> cdfs;
  auto collect = [&](const std::string& policy, const online::LoadReport& r) {
    if (args.plot.empty()) return;
    CdfSeries ttft{policy + " RT TTFT", {}}, e2e{policy + " RT end-to-end", {}};
    for (const auto& rec : r.records)
      if (rec.finished) {
        ttft.values.push_back(rec.ttft);
        e2e.values.push_back(rec.e2e);
      }
    cdfs.push_back(std::move(ttft));
    cdfs.push_back(std::move(e2e));
    cdfs.push_back({policy + " BE batch job", r.be_job_seconds});
  };
  auto plot = [&] {
    if (args.plot.empty()) return;
    write_cdf_plot(args.plot, "blend bench serve: latency CDF per class", "seconds", cdfs);
    std::fprintf(stderr, "blend bench serve: wrote %s\n", args.plot.c_str());
  };
  if (!args.url.empty()) {
    const std::string label = args.policy_given ? policies[0] : "server";
    const online::LoadReport report = online::run_load(lo);
    print(label, lo, report, args.json);
    collect(label, report);
    plot();
    return;
  }
  for (const std::string& policy : policies) {
    ServerOptions so;
    so.model = args.model;
    so.host = "127.0.0.1";
    so.port = 0;
    so.data_dir = std::filesystem::temp_directory_path() /
                  ("blend-bench-serve-" + std::to_string(::getpid()) + "-" + policy);
    std::filesystem::remove_all(so.data_dir);
    so.engine = args.engine;
    so.engine.scheduler.policy = parse_scheduler_policy(policy);
    so.engine.scheduler.bidirectional_kv =
        bidirectional_kv_for(args.kv_layout, so.engine.scheduler.policy);
    if (!args.profile.empty())
      so.engine.scheduler.iteration_cost = read_iteration_model(args.profile);
    so.engine.scheduler.fit_iteration_cost = args.profile.empty();
    so.engine.ttft_slo = lo.ttft_slo;
    so.engine.tpot_slo = lo.tpot_slo;
    online::LoadReport report;
    {
      Server server(so);
      server.start();
      lo.host = so.host;
      lo.port = server.port();
      try {
        report = online::run_load(lo);
      } catch (...) {
        server.stop();
        std::filesystem::remove_all(so.data_dir);
        throw;
      }
      server.stop();
    }
    std::filesystem::remove_all(so.data_dir);
    print(policy, lo, report, args.json,
          so.engine.scheduler.bidirectional_kv ? "bidirectional" : "unidirectional");
    collect(policy, report);
  }
  plot();
}

}  // namespace

void register_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks against the real server");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchServeArgs>();
  a->load.ttft_slo = kDefaultTtftSlo;
  a->load.tpot_slo = kDefaultTpotSlo;
  CLI::App* cmd = bench->add_subcommand(
      "serve",
      "BROS online experiment over HTTP: Poisson RT streams + Batch API BE jobs, per policy");
  cmd->add_option("--model", a->model,
                  "Model folder or GGUF file (the server is started in-process)")
      ->transform(model_source_transform());
  cmd->add_option("--url", a->url,
                  "A running server to load instead, http://127.0.0.1:PORT (loopback only)");
  cmd->add_option("--scheduler", a->policies,
                  "Comma-separated: " + scheduler_policy_list() + " (with --url: one label)")
      ->capture_default_str();
  refuse_policy_flag(cmd);
  cmd->add_option("--duration", a->duration, "Seconds of RT arrivals and BE jobs")
      ->capture_default_str();
  cmd->add_option("--rt-rate", a->rt_rate, "RT requests per second (Poisson)")
      ->capture_default_str();
  cmd->add_option("--length-scale", a->length_scale,
                  "Multiplies every prompt and output length (RT and BE)")
      ->capture_default_str();
  cmd->add_option("--be-batch", a->load.be_batch_requests, "Requests per BE batch job (0: none)")
      ->capture_default_str();
  cmd->add_option("--ttft-slo", a->load.ttft_slo, "Time-to-first-token target, seconds")
      ->capture_default_str();
  cmd->add_option("--tpot-slo", a->load.tpot_slo, "Time-per-output-token target, seconds")
      ->capture_default_str();
  cmd->add_option("--drain-timeout", a->load.drain_timeout_seconds,
                  "Seconds RT requests in flight get after the window")
      ->capture_default_str();
  cmd->add_option("--max-in-flight", a->load.max_in_flight,
                  "RT requests open at once; arrivals over it count as failed")
      ->capture_default_str();
  cmd->add_option("--max-context", a->max_context, "ShareGPT requests longer than this are skipped")
      ->capture_default_str();
  cmd->add_option("--traces", a->traces, "Trace folder (default: the repository's data/traces)")
      ->capture_default_str();
  cmd->add_option("--seed", a->load.seed, "Arrivals, lengths and prompts")->capture_default_str();
  cmd->add_option("--threads", a->engine.threads, "Server compute threads (default: all)");
  cmd->add_option("--kv-memory", a->engine.kv_memory_gb, "Server KV cache size in GB");
  cmd->add_option("--kv-host-memory", a->engine.kv_host_memory_gb,
                  "Server host memory in GB for evicted KV, dropped BE requests' among it "
                  "(default 0: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-batch-tokens", a->engine.scheduler.max_batch_tokens,
                  "Server token budget of one step")
      ->capture_default_str();
  add_hybrid_flags(cmd, a->engine.scheduler.hybrid);
  cmd->add_option("--profile", a->profile,
                  "A `blend profile` file: its iteration model drives --scheduler hybrid (without "
                  "one the model is fitted from the steps served)");
  cmd->add_option("--kv-layout", a->kv_layout,
                  "As `blend serve --kv-layout`: bidirectional, unidirectional, or auto "
                  "(bidirectional for hybrid only); for BROS's Fig. 13 ablation over HTTP")
      ->check(CLI::IsMember({"auto", "bidirectional", "unidirectional"}))
      ->capture_default_str();
  cmd->add_option("--models", a->models,
                  "Comma-separated model names (a zoo's tenants): each RT request asks for one, "
                  "the i-th (from 1) with probability proportional to 1 / i^zipf");
  cmd->add_option("--zipf", a->load.zipf, "Popularity exponent over --models (0: uniform)")
      ->capture_default_str();
  cmd->add_option("--model-port", a->model_ports,
                  "NAME=PORT: send model NAME's requests to that port of the --url host (an "
                  "engine per model); repeatable");
  cmd->add_flag("--json", a->json, "One JSON object per policy");
  cmd->add_option("--plot", a->plot,
                  "Write a PNG of the latency CDFs per class and policy (RT TTFT and "
                  "end-to-end, BE batch jobs) here; its numbers go to the same name with .dat");
  cmd->callback([a, cmd] {
    a->policy_given = cmd->count("--scheduler") > 0;
    run(*a);
  });
  register_bench_soak_command(*bench);
}

}  // namespace blend::cli
