// `blend simulate`: offline batch runs on the simulator (backend/sim) — the same planner,
// engine loop, scheduler and KV code as `blend batch`, with a virtual clock advanced by the cost
// model (DESIGN.md §3) for the given hardware and model shape. One JSON object per policy.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "backend/sim/sim_backend.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "cost/cost_model.h"
#include "model/config.h"
#include "offline/planned_run.h"
#include "plan/dp_partition.h"
#include "plan/planner.h"
#include "plan/prefix_tree.h"

namespace blend::cli {
namespace {

// max_tokens of a request whose output length is hidden from the planner: a user's cap, high
// enough never to end a request before its true length.
constexpr int32_t kHiddenLengthCap = 1 << 20;

struct SimulateArgs {
  std::string hardware = "a100-80g";
  std::string planner_hardware;  // the planner's view of the machine; empty = --hardware
  std::string model_shape = "llama-3-8b";
  std::string model_dir;  // a model folder's config.json instead of a preset
  int tensor_parallel = 1;
  std::string workload;
  std::string policies = "blend,dfs,dfs@sequential,random";
  double kv_memory_gb = 0;
  int32_t page_size = 16;
  int32_t max_batch_tokens = 2048;
  int32_t max_running = 1024;
  SchedulerOptions discrete;  // --dense-batch-sizes: its two fields only
  SamplingOptions sampling{.fraction = 0.01, .seed = 1};
  double interference = -1;  // < 0: the hardware's own
  std::string step_trace;    // CSV per policy ({policy} in the path is replaced)
  int32_t step_trace_every = 1;
  bool json = false;  // one JSON object per run instead of a readable line
  bool capacity_pacing = true;
  bool baselines_paced = false;             // dfs, random, fcfs with pacing's step budget rule
  std::vector<std::string> pacing_without;  // pacing's rules dropped, for the ablation
  std::optional<double> split_threshold;    // Alg. 2's t, tokens (unset: 99% of s_o kept)
  int32_t data_parallel = 1;  // replicas (BlendServe §5.5): the batch partitioned across them
  int32_t dp_recuts = 0;      // cuts after the first, each by the last one's replica times
};

// The trace path for one policy entry: "{policy}" replaced by the entry ('@' becomes '-').
std::string step_trace_path(std::string pattern, std::string entry) {
  for (char& ch : entry)
    if (ch == '@') ch = '-';
  for (size_t at; (at = pattern.find("{policy}")) != std::string::npos;)
    pattern.replace(at, 8, entry);
  return pattern;
}

// BlendServe Fig. 10: each recorded step's compute and memory time and its shape, one CSV row
// per `every` steps (summed over the group, so the plot's area keeps the run's totals).
void write_step_trace(const std::string& path, const std::vector<SimStepTime>& steps,
                      int32_t every) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw Error("cannot write " + path);
  std::fprintf(f,
               "step,clock_s,compute_s,memory_s,network_s,step_s,prefill_tokens,decode_tokens,"
               "decode_context_tokens\n");
  double clock = 0;
  for (size_t i = 0; i < steps.size(); i += every) {
    SimStepTime group;
    for (size_t k = i; k < std::min(steps.size(), i + every); ++k) {
      group.compute += steps[k].compute;
      group.memory += steps[k].memory;
      group.network += steps[k].network;
      group.total += steps[k].total;
      group.prefill_tokens += steps[k].prefill_tokens;
      group.decode_tokens += steps[k].decode_tokens;
      group.decode_context_tokens += steps[k].decode_context_tokens;
    }
    clock += group.total;
    std::fprintf(f, "%zu,%.6f,%.6g,%.6g,%.6g,%.6g,%lld,%lld,%lld\n", i, clock, group.compute,
                 group.memory, group.network, group.total,
                 static_cast<long long>(group.prefill_tokens),
                 static_cast<long long>(group.decode_tokens),
                 static_cast<long long>(group.decode_context_tokens));
  }
  if (std::fclose(f) != 0) throw Error("cannot write " + path);
}

std::vector<OfflineRequest> read_workload(const std::string& path) {
  std::vector<OfflineRequest> out;
  for_each_batch_input(path, [&](BatchInputLine&& line) {
    if (line.error) throw Error(path + ": " + batch_line_name(line) + ": " + *line.error);
    const auto& prompt = line.body.at("prompt");
    if (!prompt.is_array())
      throw Error(path + ": " + line.custom_id + ": the simulator needs token-id prompts");
    OfflineRequest r;
    r.request.id = line.custom_id;
    r.request.prompt.reserve(prompt.size());
    for (const auto& t : prompt) r.request.prompt.push_back(t.get<TokenId>());
    // The true output length is max_tokens. With ignore_eos the request says so (a known
    // length). Without it the length is hidden: the engine ends the request there as if EOS
    // came, while the planner and scheduler see the workload's "estimated_output" hint and a
    // max_tokens cap far above any output (a cap equal to the true length let both clamp
    // their guesses to the truth: the planner's mean estimate for azure-conv came out 144
    // against a true 211).
    const int32_t length = line.body.value("max_tokens", 16);
    r.output_known = line.body.value("ignore_eos", false);
    r.request.params.temperature = 0;
    r.request.params.ignore_eos = r.output_known;
    r.request.params.max_tokens = r.output_known ? length : kHiddenLengthCap;
    if (!r.output_known) r.simulated_output_tokens = length;
    r.output_estimate = r.output_known ? length : line.body.value("estimated_output", 256.0);
    out.push_back(std::move(r));
  });
  if (out.empty()) throw Error(path + " holds no requests");
  return out;
}

// `--dp N` (BlendServe §5.5): rank 0's partition of the global plan; each replica plans and runs
// its part, and the job takes as long as the slowest replica (makespan). Returns the job's
// totals; `dp_json` gets the per-replica figures and the partition's sharing loss.
PlannedRunStats run_data_parallel(
    const SimulateArgs& args, const std::vector<OfflineRequest>& requests,
    const std::vector<plan::PlanRequest>& plan_requests, const CostModel& planner_cost,
    plan::Policy policy,
    const std::function<PlannedRunStats(const std::vector<OfflineRequest>&)>& run_replica,
    nlohmann::json& dp_json) {
  // Runs each part on its own replica; the job's totals, each replica's seconds.
  const auto run_parts = [&](const plan::DpPartition& dp, std::vector<double>& rank_seconds) {
    PlannedRunStats st;
    double cached = 0;
    for (const std::vector<int32_t>& part : dp.parts) {
      std::vector<OfflineRequest> sub;
      sub.reserve(part.size());
      for (int32_t r : part) sub.push_back(requests[static_cast<size_t>(r)]);
      if (sub.empty()) {
        rank_seconds.push_back(0);
        continue;
      }
      const PlannedRunStats r = run_replica(sub);
      rank_seconds.push_back(r.seconds);
      st.sampled_requests += r.sampled_requests;
      st.requests += r.requests;
      st.prompt_tokens += r.prompt_tokens;
      st.output_tokens += r.output_tokens;
      st.steps += r.steps;
      st.seconds = std::max(st.seconds, r.seconds);
      cached += r.sharing_ratio * static_cast<double>(r.prompt_tokens);
    }
    st.sharing_ratio = st.prompt_tokens > 0 ? cached / static_cast<double>(st.prompt_tokens) : 0;
    return st;
  };
  // Each cut's job totals, by the order cut_data_parallel asks for them.
  std::vector<PlannedRunStats> cut_stats;
  std::vector<double> first_rank_seconds;
  const plan::DpCuts cuts = plan::cut_data_parallel(plan_requests, planner_cost, args.data_parallel,
                                                    args.max_batch_tokens, args.dp_recuts,
                                                    [&](const plan::DpPartition& cut) {
                                                      std::vector<double> seconds;
                                                      cut_stats.push_back(run_parts(cut, seconds));
                                                      if (cut_stats.size() == 1)
                                                        first_rank_seconds = seconds;
                                                      return seconds;
                                                    });
  const plan::DpPartition& dp = cuts.partition;
  const std::vector<double>& rank_seconds = cuts.rank_seconds;
  PlannedRunStats st = cut_stats[cuts.kept];
  nlohmann::json first_cut;
  if (args.dp_recuts > 0)
    first_cut = {{"rank_seconds", first_rank_seconds},
                 {"seconds", cuts.cut_seconds.front()},
                 {"cut_seconds", cuts.cut_seconds}};
  st.policy = plan::policy_name(policy);
  st.sharing_optimal = dp.sharing_optimal;
  st.root_density = dp.root_density;
  st.compute_seconds = dp.root.compute_seconds;
  st.memory_seconds = dp.root.memory_seconds;
  nlohmann::json parts = nlohmann::json::array();
  for (size_t k = 0; k < dp.parts.size(); ++k)
    parts.push_back({{"requests", dp.parts[k].size()},
                     {"density", dp.stats[k].density()},
                     {"sharing", dp.stats[k].sharing_ratio()},
                     {"compute_seconds", dp.stats[k].compute_seconds},
                     {"memory_seconds", dp.stats[k].memory_seconds},
                     {"prompt_tokens", dp.stats[k].prompt_tokens},
                     {"output_tokens", dp.stats[k].output_tokens},
                     {"predicted_work_seconds", dp.work(k)}});
  dp_json = {{"rank_seconds", rank_seconds},
             {"parts", parts},
             {"partition_sharing", dp.sharing_partitioned},
             {"sharing_loss", dp.sharing_loss()},
             {"sharing_loss_of_optimal", dp.sharing_loss_of_optimal()},
             {"partition_imbalance", dp.imbalance()}};
  if (!first_cut.is_null()) dp_json["first_cut"] = first_cut;
  return st;
}

// One policy's run against BlendServe's bounds (§3.3, §6.2), printed as a line or as JSON.
void report_run(const SimulateArgs& args, const std::string& entry, const std::string& overlap_name,
                const Hardware& hw, const ModelShape& shape, double kv_memory,
                const PlannedRunStats& st, const nlohmann::json& dp_json) {
  // BlendServe §3.3 / §6.2, at optimal sharing s_o: the ideal T_o overlaps compute and memory
  // perfectly; the practical T_o ("optimal") pays the same interference the overlapped
  // simulation pays, so an overlapped run can reach 1.0 of it and no more.
  const double shared_compute = (1 - st.sharing_optimal) * st.compute_seconds;
  // N replicas share the work: each bound is 1/N of one device's (§5.5, Table 3).
  const double replicas = args.data_parallel;
  const double ideal = std::max(shared_compute, st.memory_seconds) / replicas;
  auto practical = [&](double memory_seconds) {  // a whole run priced as one overlapped step
    return StepCost{.compute_seconds = shared_compute,
                    .memory_seconds = memory_seconds,
                    .interference = hw.overlap_interference}
        .overlapped();
  };
  const double optimal = practical(st.memory_seconds) / replicas;
  // T_o leaves out that every step also reads the weights. No step reads more KV than the
  // KV memory holds, so the run needs at least T_mem BW / M steps and reads the weights that
  // often: memory time of at least T_mem (1 + W / (tp M)). With that memory time the same
  // practical optimum is about the most an order can reach under the cost model (not a strict
  // bound: a run pays the interference step by step, which can add up to less).
  const double capacity_optimal =
      practical(st.memory_seconds *
                (1 + static_cast<double>(shape.weight_bytes) / args.tensor_parallel / kv_memory)) /
      replicas;
  nlohmann::json j = {
      {"policy", entry},
      {"overlap", overlap_name},
      {"hardware", hw.name},
      {"model", shape.name},
      {"tensor_parallel", args.tensor_parallel},
      {"requests", st.requests},
      {"prompt_tokens", st.prompt_tokens},
      {"output_tokens", st.output_tokens},
      {"seconds", st.seconds},
      {"steps", st.steps},
      {"throughput_tokens_per_s", st.throughput()},
      {"fraction_of_optimal", st.seconds > 0 ? optimal / st.seconds : 0},
      {"fraction_of_ideal", st.seconds > 0 ? ideal / st.seconds : 0},
      {"fraction_of_capacity_optimal", st.seconds > 0 ? capacity_optimal / st.seconds : 0},
      {"interference", hw.overlap_interference},
      {"sharing_ratio", st.sharing_ratio},
      {"sharing_optimal", st.sharing_optimal},
      {"root_density", st.root_density},
      {"sampled_requests", st.sampled_requests},
      {"data_parallel", args.data_parallel}};
  if (!dp_json.is_null()) j.update(dp_json);
  // NanoFlow §4.2's discrete batching, when asked for, and the tile the clock prices.
  if (!args.discrete.dense_batch_sizes.empty())
    j["dense_batch_sizes"] = args.discrete.dense_batch_sizes;
  if (args.discrete.dense_batch_tile > 0) j["dense_batch_tile"] = args.discrete.dense_batch_tile;
  j["dense_row_tile"] = hw.dense_row_tile;
  if (args.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "%-18s %10.0f tok/s  %.3f of optimal  %.3f of ideal  %.3f of capacity optimal  "
        "sharing %.3f of %.3f  %.1f s\n",
        entry.c_str(), st.throughput(), j["fraction_of_optimal"].get<double>(),
        j["fraction_of_ideal"].get<double>(), j["fraction_of_capacity_optimal"].get<double>(),
        st.sharing_ratio, st.sharing_optimal, st.seconds);
    if (args.data_parallel > 1)
      std::printf(
          "%-18s dp %d: slowest replica %.1f s, partition keeps %.4f of %.4f sharing "
          "(loss %.2f%% of s_o), work imbalance %.3f\n",
          "", args.data_parallel, st.seconds, dp_json["partition_sharing"].get<double>(),
          st.sharing_optimal, 100 * dp_json["sharing_loss_of_optimal"].get<double>(),
          dp_json["partition_imbalance"].get<double>());
  }
  std::fflush(stdout);
}

void run_simulate(const SimulateArgs& args) {
  Hardware hw = resolve_hardware(args.hardware);
  if (args.interference >= 0) hw.overlap_interference = args.interference;
  const std::optional<ModelShape> shape =
      args.model_dir.empty()
          ? find_model_shape_preset(args.model_shape, args.tensor_parallel)
          : ModelShape::from_config(ModelConfig::from_dir(args.model_dir),
                                    std::filesystem::path(args.model_dir).filename().string(),
                                    args.tensor_parallel);
  if (!shape) throw Error("unknown --model-shape " + args.model_shape);
  const CostModel cost(*shape, hw);
  // A real run is planned with a profile of the machine, not with the machine itself: the
  // simulator's clock can follow one fit while the planner and admission use another.
  const CostModel planner_cost(
      *shape, args.planner_hardware.empty() ? hw : resolve_hardware(args.planner_hardware));
  const double kv_memory = simulated_kv_memory_bytes(hw, *shape, args.kv_memory_gb);
  plan::PlannerKnobs planner{.pacing = {.enabled = args.capacity_pacing},
                             .split_threshold_tokens = args.split_threshold,
                             .baselines_paced = args.baselines_paced};
  if (args.split_threshold && !(*args.split_threshold >= 0))
    throw Error("--split-threshold must be a number of tokens >= 0");
  plan::drop_pacing_rules(planner.pacing, args.pacing_without);
  const std::vector<OfflineRequest> requests = read_workload(args.workload);
  const ModelConfig config = sim_model_config(*shape);
  const auto page_bytes =
      static_cast<int64_t>(cost.kv_bytes_per_token_per_device()) * args.page_size;

  // The run's T_comp and T_mem (for T_o) come from the plan, priced by the planner; with a
  // planner of its own they are priced again by the clock's hardware, over the requests' own
  // output estimates (the same as the plan's unless lengths are sampled).
  std::vector<plan::PlanRequest> plan_requests;
  for (const OfflineRequest& q : requests)
    plan_requests.push_back({q.request.id, q.request.prompt, q.output_estimate, q.output_known});
  std::optional<plan::DemandStats> clock_root;
  if (!args.planner_hardware.empty()) {
    const plan::PrefixTree tree(plan_requests);
    clock_root = plan::annotate_tree(tree, cost)[plan::PrefixTree::kRoot];
  }
  if (!args.step_trace.empty() && args.policies.find(',') != std::string::npos &&
      args.step_trace.find("{policy}") == std::string::npos)
    throw Error("--step-trace with several policies needs {policy} in the path");
  if (args.data_parallel < 1) throw Error("--dp must be at least 1");
  if (args.dp_recuts > 0 && args.data_parallel < 2) throw Error("--dp-recut needs --dp 2 or more");
  if (args.data_parallel > 1 && !args.step_trace.empty())
    throw Error("--step-trace traces one replica: it needs --dp 1");
  for (const std::string& entry : split_list(args.policies)) {
    // POLICY[@sequential|@overlapped]; the policy's own name may hold an '@' (blend@alg3), and
    // parse_policy refuses what is neither.
    const size_t at = entry.rfind('@');
    const std::string suffix = at == std::string::npos ? "" : entry.substr(at + 1);
    const bool has_overlap = suffix == "overlapped" || suffix == "sequential";
    const std::string policy_name = has_overlap ? entry.substr(0, at) : entry;
    const std::string overlap_name = has_overlap ? suffix : "overlapped";
    const Overlap overlap =
        overlap_name == "sequential" ? Overlap::kSequential : Overlap::kOverlapped;
    const plan::Policy policy = plan::parse_policy(policy_name);

    // One replica's run on its own simulated device.
    auto run_replica = [&](const std::vector<OfflineRequest>& part) {
      SimBackendOptions so;
      so.num_pages = static_cast<int64_t>(kv_memory) / page_bytes;
      so.kv_bytes_per_page = page_bytes;
      so.record_steps = !args.step_trace.empty();
      EngineOptions eo;
      eo.page_size = args.page_size;
      eo.scheduler.max_batch_tokens = args.max_batch_tokens;
      eo.scheduler.max_running = args.max_running;
      eo.scheduler.dense_batch_sizes = args.discrete.dense_batch_sizes;
      eo.scheduler.dense_batch_tile = args.discrete.dense_batch_tile;
      auto backend = make_sim_backend(config, so, cost, overlap);
      SimBackend& sim = *backend;
      Engine engine(std::move(backend), eo);
      PlannedRunStats st = run_planned(engine, part, policy, planner_cost, kv_memory, {},
                                       args.sampling, planner, &sim.tokens());
      if (!args.step_trace.empty())
        write_step_trace(step_trace_path(args.step_trace, entry), sim.steps(),
                         args.step_trace_every);
      return st;
    };
    PlannedRunStats st;
    nlohmann::json dp_json;
    if (args.data_parallel == 1) {
      st = run_replica(requests);
    } else {
      st = run_data_parallel(args, requests, plan_requests, planner_cost, policy, run_replica,
                             dp_json);
    }
    if (clock_root) {  // T_comp and T_mem as the clock's hardware prices them
      st.compute_seconds = clock_root->compute_seconds;
      st.memory_seconds = clock_root->memory_seconds;
    }
    report_run(args, entry, overlap_name, hw, *shape, kv_memory, st, dp_json);
  }
}

}  // namespace

void register_simulate_command(CLI::App& app) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Run an offline workload on the simulator (cost model, virtual clock)");
  cmd->add_option("--hardware", args->hardware, "a100-80g | a100-40g | h100 | h200 | FILE.json");
  cmd->add_option("--planner-hardware", args->planner_hardware,
                  "The planner's view of the machine, when it differs from the --hardware that "
                  "times the steps (a real run planned with an older profile, say)");
  cmd->add_option("--model-shape", args->model_shape, "Model shape preset (llama-3-8b, ...)");
  cmd->add_option("--model", args->model_dir, "Take the shape from this model folder or GGUF file")
      ->transform(model_source_transform());
  cmd->add_option("--tp", args->tensor_parallel, "Tensor-parallel degree");
  cmd->add_option("--workload", args->workload, "Batch JSONL with token-id prompts")->required();
  cmd->add_option("--policy", args->policies,
                  "Comma-separated policies (blend, blend@alg3, dfs, fcfs, random), each "
                  "optionally @sequential or @overlapped (default overlapped); fcfs is the input "
                  "order admitted by the engine's scheduler alone, as `blend batch --policy "
                  "fcfs`; blend@alg3 is blend's plan admitted by Alg. 3 as published");
  cmd->add_option("--kv-memory", args->kv_memory_gb,
                  "KV memory per device in GB (default: 90% of device memory minus weights)");
  cmd->add_option("--page-size", args->page_size, "Tokens per KV page");
  cmd->add_option("--max-batch-tokens", args->max_batch_tokens, "Token budget of one step");
  cmd->add_option("--max-running", args->max_running, "Sequences running at once");
  add_dense_batch_sizes_flag(cmd, args->discrete);
  cmd->add_option("--sample-fraction", args->sampling.fraction,
                  "Output-length sampling (BlendServe §5.1): this fraction of the requests "
                  "without ignore_eos runs first; their lengths estimate the others' (0.01)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--sample-seed", args->sampling.seed, "Which requests are sampled");
  cmd->add_option("--dp", args->data_parallel,
                  "Data-parallel replicas (BlendServe §5.5): the batch is partitioned as "
                  "`mpirun -np N blend batch` partitions it and each part runs on its own "
                  "simulated device; seconds and throughput are the slowest replica's (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--dp-recut", args->dp_recuts,
                  "With --dp N: cut again this many times, each part's share of the work in "
                  "proportion to its simulated rate in the cut before, and keep the shortest job "
                  "(default 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", args->json, "One JSON object per run (the keys experiments read)");
  cmd->add_flag("!--no-capacity-pacing", args->capacity_pacing,
                "blend: the dual scanner without capacity pacing or Alg. 3's prefill budgets "
                "(memory split by density only, each side filling its M_L / M_R at once; the "
                "engine's fixed step budget); blend@alg3 adds the budgets");
  cmd->add_flag("--baselines-paced", args->baselines_paced,
                "dfs, random and fcfs: each step's token budget from capacity pacing's rule over "
                "the work left (KV capacity x dense tokens / token-steps, as blend's) instead of "
                "--max-batch-tokens, which stays its ceiling");
  cmd->add_option("--split-threshold", args->split_threshold,
                  "blend: Alg. 2's split threshold t in recomputed prompt tokens (default: 1% of "
                  "the shared tokens, halved until the plan keeps 99% of the optimal sharing)");
  cmd->add_option("--pacing-without", args->pacing_without,
                  "blend: capacity pacing without these of its rules, for the ablation "
                  "(comma-separated): budget (the engine's fixed step budget), spacing (no end "
                  "spacing of memory-intensive requests), floor (no floor kept for the compute-"
                  "intensive side)")
      ->delimiter(',');
  cmd->add_option("--interference", args->interference,
                  "GEMM-attention interference of overlapped steps, in [0, 1] (default: the "
                  "hardware's: 0.15 for a100-*, 0.71 h100, 0.81 h200)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--step-trace", args->step_trace,
                  "Write each run's per-step compute and memory time as CSV ({policy} in the "
                  "path names the run)");
  cmd->add_option("--step-trace-every", args->step_trace_every,
                  "One CSV row per this many steps (summed)")
      ->check(CLI::PositiveNumber);
  cmd->callback([args] { run_simulate(*args); });
}

}  // namespace blend::cli
