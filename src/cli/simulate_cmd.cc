// `blend simulate`: offline batch runs on the simulator (backend/sim) — the same planner,
// engine loop, scheduler and KV code as `blend batch`, with a virtual clock advanced by the cost
// model (DESIGN.md §3) for the given hardware and model shape. One JSON object per policy.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "cli/commands.h"
#include "core/error.h"
#include "cost/cost_model.h"
#include "model/config.h"
#include "offline/planned_run.h"

namespace blend::cli {
namespace {

struct SimulateArgs {
  std::string hardware = "a100-80g";
  std::string model_shape = "llama-3-8b";
  std::string model_dir;  // a model folder's config.json instead of a preset
  int tensor_parallel = 1;
  std::string workload;
  std::string policies = "blend,dfs,dfs@sequential,random";
  double kv_memory_gb = 0;
  int32_t page_size = 16;
  int32_t max_batch_tokens = 2048;
  int32_t max_running = 1024;
  SamplingOptions sampling{.fraction = 0.01, .seed = 1};
};

std::vector<OfflineRequest> read_workload(const std::string& path) {
  std::vector<OfflineRequest> out;
  for (const BatchInputLine& line : read_batch_input(path)) {
    if (line.error) throw Error(path + ": " + line.custom_id + ": " + *line.error);
    const auto& prompt = line.body.at("prompt");
    if (!prompt.is_array())
      throw Error(path + ": " + line.custom_id + ": the simulator needs token-id prompts");
    OfflineRequest r;
    r.id = line.custom_id;
    for (const auto& t : prompt) r.prompt.push_back(t.get<TokenId>());
    // The true output length is max_tokens (with ignore_eos); the planner sees it only when
    // the request says so (known length), else the workload's "estimated_output" hint.
    r.params.max_tokens = line.body.value("max_tokens", 16);
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    r.output_known = line.body.value("ignore_eos", false);
    r.output_estimate =
        r.output_known ? r.params.max_tokens : line.body.value("estimated_output", 256.0);
    out.push_back(std::move(r));
  }
  if (out.empty()) throw Error(path + " holds no requests");
  return out;
}

void run_simulate(const SimulateArgs& args) {
  const Hardware hw = resolve_hardware(args.hardware);
  const std::optional<ModelShape> shape =
      args.model_dir.empty()
          ? find_model_shape_preset(args.model_shape, args.tensor_parallel)
          : ModelShape::from_config(ModelConfig::from_dir(args.model_dir),
                                    std::filesystem::path(args.model_dir).filename().string(),
                                    args.tensor_parallel);
  if (!shape) throw Error("unknown --model-shape " + args.model_shape);
  const CostModel cost(*shape, hw);
  const double kv_memory =
      args.kv_memory_gb > 0
          ? args.kv_memory_gb * 1e9
          : 0.9 * hw.memory_bytes - static_cast<double>(shape->weight_bytes) / args.tensor_parallel;
  if (kv_memory <= 0) throw Error("the model's weights do not fit; raise --tp or set --kv-memory");
  const std::vector<OfflineRequest> requests = read_workload(args.workload);
  const ModelConfig config = sim_model_config(*shape);
  const auto page_bytes =
      static_cast<int64_t>(cost.kv_bytes_per_token_per_device()) * args.page_size;

  std::stringstream list(args.policies);
  for (std::string entry; std::getline(list, entry, ',');) {
    if (entry.empty()) continue;
    const size_t at = entry.find('@');
    const std::string policy_name = entry.substr(0, at);
    const std::string overlap_name = at == std::string::npos ? "overlapped" : entry.substr(at + 1);
    if (overlap_name != "overlapped" && overlap_name != "sequential")
      throw Error("unknown overlap mode '" + overlap_name + "' (overlapped | sequential)");
    const Overlap overlap =
        overlap_name == "sequential" ? Overlap::kSequential : Overlap::kOverlapped;
    const plan::Policy policy = plan::parse_policy(policy_name);

    SimBackendOptions so;
    so.num_pages = static_cast<int64_t>(kv_memory) / page_bytes;
    so.kv_bytes_per_page = page_bytes;
    EngineOptions eo;
    eo.page_size = args.page_size;
    eo.scheduler.max_batch_tokens = args.max_batch_tokens;
    eo.scheduler.max_running = args.max_running;
    Engine engine(config,
                  std::make_unique<SimBackend>(config, so, simulate_step_cost(cost, overlap)), eo);
    const PlannedRunStats st =
        run_planned(engine, requests, policy, cost, kv_memory, {}, args.sampling);
    // Ideal: optimal sharing, compute and memory perfectly overlapped (BlendServe §3, T_o).
    const double ideal = std::max((1 - st.sharing_optimal) * st.compute_seconds, st.memory_seconds);
    const nlohmann::json j = {{"policy", entry},
                              {"overlap", overlap_name},
                              {"hardware", hw.name},
                              {"model", shape->name},
                              {"tensor_parallel", args.tensor_parallel},
                              {"requests", st.requests},
                              {"prompt_tokens", st.prompt_tokens},
                              {"output_tokens", st.output_tokens},
                              {"seconds", st.seconds},
                              {"steps", st.steps},
                              {"throughput_tokens_per_s", st.throughput()},
                              {"fraction_of_ideal", st.seconds > 0 ? ideal / st.seconds : 0},
                              {"sharing_ratio", st.sharing_ratio},
                              {"sharing_optimal", st.sharing_optimal},
                              {"root_density", st.root_density},
                              {"sampled_requests", st.sampled_requests}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
}

}  // namespace

void register_simulate_command(CLI::App& app) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Run an offline workload on the simulator (cost model, virtual clock)");
  cmd->add_option("--hardware", args->hardware, "a100-80g | a100-40g | h100 | h200 | FILE.json");
  cmd->add_option("--model-shape", args->model_shape, "Model shape preset (llama-3-8b, ...)");
  cmd->add_option("--model", args->model_dir, "Take the shape from this model folder");
  cmd->add_option("--tp", args->tensor_parallel, "Tensor-parallel degree");
  cmd->add_option("--workload", args->workload, "Batch JSONL with token-id prompts")->required();
  cmd->add_option("--policy", args->policies,
                  "Comma-separated policies (blend, dfs, fcfs, random), each optionally "
                  "@sequential or @overlapped (default overlapped)");
  cmd->add_option("--kv-memory", args->kv_memory_gb,
                  "KV memory per device in GB (default: 90% of device memory minus weights)");
  cmd->add_option("--page-size", args->page_size, "Tokens per KV page");
  cmd->add_option("--max-batch-tokens", args->max_batch_tokens, "Token budget of one step");
  cmd->add_option("--max-running", args->max_running, "Sequences running at once");
  cmd->add_option("--sample-fraction", args->sampling.fraction,
                  "Output-length sampling (BlendServe §5.1): this fraction of the requests "
                  "without ignore_eos runs first; their lengths estimate the others' (0.01)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--sample-seed", args->sampling.seed, "Which requests are sampled");
  cmd->callback([args] { run_simulate(*args); });
}

}  // namespace blend::cli
