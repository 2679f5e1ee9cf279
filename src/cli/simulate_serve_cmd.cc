// `blend simulate-serve`: BROS's online experiment (§7) on the simulator at the paper's scale —
// Poisson RT arrivals with ShareGPT lengths plus resubmitted BE batch jobs, per scheduling
// policy and RT rate, on a model shape and hardware preset (harness/serving_sim).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "cost/cost_model.h"
#include "harness/serving_sim.h"
#include "harness/traces.h"
#include "offline/planned_run.h"

namespace blend::cli {
namespace {

struct SimulateServeArgs {
  std::string hardware = "a100-40g";
  std::string model_shape = "opt-13b";
  int tensor_parallel = 2;
  std::string policies = "hybrid,fcfs,round-robin";
  std::string kv_layout = "auto";
  std::string rates = "1,2,4";
  double duration = 600;
  double kv_memory_gb = 0;  // per device; 0 = 90% of device memory minus the weights' share
  // Host memory per device for KV the device cache evicts (a dropped BE request's pages among
  // them), over the preset's host link; 0 = none (a dropped request recomputes).
  double kv_host_memory_gb = 0;
  int32_t max_batch_tokens = 2048;
  int32_t max_running = 256;
  int32_t max_context = 2048;
  std::string traces = workload::default_traces_dir().string();
  online::ServingWorkload workload;
  HybridOptions hybrid;
  // hybrid's iteration model: "fit" from the simulated steps, as serve does without --profile,
  // or "oracle" (the cost model's own: exactly right about every step).
  std::string iteration_model = "fit";
  bool fit_flag = false;  // --fit-iteration-model, the old spelling of --iteration-model fit
  // Lognormal sigma on each simulated step's time: 0.02 as measured on an H100
  // (docs/BENCHMARKS.md, "Step-time noise on the GPU"; assumed for the other GPU presets).
  double step_noise = 0.02;
  bool json = false;
};

void run(const SimulateServeArgs& args) {
  if (args.fit_flag && args.iteration_model != "fit")
    throw Error("--fit-iteration-model contradicts --iteration-model " + args.iteration_model);
  const Hardware hw = resolve_hardware(args.hardware);
  const auto shape = find_model_shape_preset(args.model_shape, args.tensor_parallel);
  if (!shape) throw Error("unknown --model-shape " + args.model_shape);
  const CostModel cost(*shape, hw);
  const double kv_memory = simulated_kv_memory_bytes(hw, *shape, args.kv_memory_gb);
  online::ServingWorkload w = args.workload;
  w.duration_seconds = args.duration;
  w.rt_lengths = online::sharegpt_lengths(args.traces, args.max_context);
  const ModelConfig config = sim_model_config(*shape);
  const int32_t page_tokens = EngineOptions{}.page_size;  // the engine's, which runs below
  const auto page_bytes = static_cast<int64_t>(cost.kv_bytes_per_token_per_device()) * page_tokens;

  for (const std::string& rate : split_list(args.rates)) {
    for (const std::string& policy : split_list(args.policies)) {
      EngineOptions eo;
      eo.scheduler.max_batch_tokens = args.max_batch_tokens;
      eo.scheduler.max_running = args.max_running;
      eo.scheduler.policy = parse_scheduler_policy(policy);
      eo.scheduler.bidirectional_kv = bidirectional_kv_for(args.kv_layout, eo.scheduler.policy);
      eo.scheduler.iteration_cost = iteration_model_of(cost, page_tokens);
      const double swap_per_page = eo.scheduler.iteration_cost.swap_per_page;
      // Swap out or recompute (kv/radix_cache): the same swap line the backend charges, and a
      // prompt token's marginal time in the cost model's prefill.
      eo.kv_host_memory_gb = args.kv_host_memory_gb;
      if (swap_per_page > 0)
        eo.kv_host_link_bytes_per_s = static_cast<double>(page_bytes) / swap_per_page;
      eo.kv_recompute_seconds_per_token = eo.scheduler.iteration_cost.prefill_per_token;
      if (args.iteration_model == "fit") {  // what serve does without a profile: from nothing
        eo.scheduler.fit_iteration_cost = true;
        eo.scheduler.iteration_cost = {};
      }
      eo.scheduler.hybrid = args.hybrid;
      eo.ttft_slo = w.ttft_slo;
      eo.tpot_slo = w.tpot_slo;
      SimBackendOptions so;
      so.num_pages = static_cast<int64_t>(kv_memory) / page_bytes;
      so.kv_bytes_per_page = page_bytes;
      // BROS checkpoints, restores and swaps over the host link, copies in device memory.
      so.swap_seconds_per_page = swap_per_page;
      so.copy_seconds_per_page = 2 * static_cast<double>(page_bytes) / hw.effective_bandwidth();
      so.step_noise = args.step_noise;
      so.noise_seed = args.workload.seed;
      auto backend = make_sim_backend(config, so, cost, Overlap::kSequential);
      SimBackend& sim = *backend;
      Engine engine(std::move(backend), eo);
      online::ServingWorkload run_w = w;
      run_w.rt_rate = std::stod(rate);
      const online::ServingReport r = online::simulate_serving(engine, sim, run_w);
      const EngineStats s = engine.stats();
      const nlohmann::json j = {
          {"policy", policy},
          {"kv_layout", eo.scheduler.bidirectional_kv ? "bidirectional" : "unidirectional"},
          {"model", shape->name},
          {"tensor_parallel", args.tensor_parallel},
          {"hardware", hw.name},
          {"rt_rate", run_w.rt_rate},
          {"duration_s", run_w.duration_seconds},
          {"rt_requests", r.rt_requests},
          {"rt_normalized_latency_s", r.rt_normalized_latency_s},
          {"ttft_attainment", r.ttft_attainment},
          {"tpot_attainment", r.tpot_attainment},
          {"ttft_p50_s", r.ttft_p50},
          {"ttft_p99_s", r.ttft_p99},
          {"tpot_p50_s", r.tpot_p50},
          {"tpot_p99_s", r.tpot_p99},
          {"be_requests", r.be_requests},
          {"be_requests_per_s", r.be_requests_per_s},
          {"be_throughput_tokens_per_s", r.be_throughput_tokens_per_s},
          {"seconds_until_drained", r.seconds},
          {"be_throughput_until_drained_tokens_per_s", r.be_throughput_until_drained_tokens_per_s},
          {"steps", r.steps},
          {"mean_batch_tokens",
           s.steps ? static_cast<double>(s.batch_tokens) / static_cast<double>(s.steps) : 0.0},
          {"preemptions", s.preemptions},
          {"kv_shared_pages", s.kv_shared_pages},
          {"kv_checkpointed_slots", s.kv_checkpointed_slots},
          {"kv_transfer_seconds", sim.totals().transfer},
          {"kv_offloaded_pages", s.kv_offloaded_pages},
          {"kv_loaded_pages", s.kv_loaded_pages},
          {"iteration_model", args.iteration_model},
          {"step_noise", args.step_noise}};
      if (args.json) {
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf(
            "%-11s rate %5.2f/s: RT %lld req, norm. latency %.3f s/token, TTFT attain %.1f%% "
            "(p50 %.3f p99 %.3f s), TPOT attain %.1f%% (p50 %.3f p99 %.3f s); BE %.2f req/s "
            "%.0f tok/s\n",
            policy.c_str(), run_w.rt_rate, static_cast<long long>(r.rt_requests),
            r.rt_normalized_latency_s, 100 * r.ttft_attainment, r.ttft_p50, r.ttft_p99,
            100 * r.tpot_attainment, r.tpot_p50, r.tpot_p99, r.be_requests_per_s,
            r.be_throughput_tokens_per_s);
      }
      std::fflush(stdout);
    }
  }
}

}  // namespace

void register_simulate_serve_command(CLI::App& app) {
  auto a = std::make_shared<SimulateServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "simulate-serve",
      "BROS online experiment on the simulator: RT Poisson arrivals + BE batch jobs");
  cmd->add_option("--hardware", a->hardware, "a100-80g | a100-40g | h100 | h200 | FILE.json")
      ->capture_default_str();
  cmd->add_option("--model-shape", a->model_shape, "Model shape preset")->capture_default_str();
  cmd->add_option("--tp", a->tensor_parallel, "Tensor-parallel degree")->capture_default_str();
  cmd->add_option("--scheduler", a->policies, "Comma-separated: " + scheduler_policy_list())
      ->capture_default_str();
  refuse_policy_flag(cmd);
  cmd->add_option("--kv-layout", a->kv_layout,
                  "auto (bidirectional for hybrid), bidirectional, unidirectional")
      ->check(CLI::IsMember({"auto", "bidirectional", "unidirectional"}))
      ->capture_default_str();
  cmd->add_option("--rt-rate", a->rates, "Comma-separated RT request rates (requests/s)")
      ->capture_default_str();
  cmd->add_option("--duration", a->duration, "Seconds of arrivals (virtual)")
      ->capture_default_str();
  cmd->add_option("--be-batch", a->workload.be_batch_requests, "Requests per BE batch job")
      ->capture_default_str();
  cmd->add_option("--ttft-slo", a->workload.ttft_slo, "Seconds")->capture_default_str();
  cmd->add_option("--tpot-slo", a->workload.tpot_slo, "Seconds")->capture_default_str();
  cmd->add_option("--kv-memory", a->kv_memory_gb, "KV memory per device in GB");
  cmd->add_option("--kv-host-memory", a->kv_host_memory_gb,
                  "Host memory per device in GB for evicted KV, dropped BE requests' among it: "
                  "brought back over the host link where that is cheaper than recomputing "
                  "(0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  add_hybrid_flags(cmd, a->hybrid);
  cmd->add_option("--iteration-model", a->iteration_model,
                  "hybrid's iteration model: fit (from the simulated steps, as `blend serve` fits "
                  "it from real ones without --profile) or oracle (the cost model's own)")
      ->check(CLI::IsMember({"fit", "oracle"}))
      ->capture_default_str();
  cmd->add_flag("--fit-iteration-model", a->fit_flag, "The same as --iteration-model fit");
  cmd->add_option("--step-noise", a->step_noise,
                  "Each simulated step's time times a mean-1 lognormal factor of this sigma "
                  "(0.02: measured on an H100; 0: the cost model's time exactly)")
      ->check(CLI::Range(0.0, 2.0))
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "Token budget of one step")
      ->capture_default_str();
  cmd->add_option("--max-running", a->max_running, "Sequences running at once")
      ->capture_default_str();
  cmd->add_option("--max-context", a->max_context, "RT requests longer than this are skipped")
      ->capture_default_str();
  cmd->add_option("--traces", a->traces, "Trace folder (default: the repository's data/traces)")
      ->capture_default_str();
  cmd->add_option("--seed", a->workload.seed, "Arrivals and lengths")->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object per policy and rate");
  cmd->callback([a] { run(*a); });
}

}  // namespace blend::cli
