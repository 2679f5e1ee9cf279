// blend plan — the BlendServe planner on a Batch API input file, without running a model
// (BlendServe §5, docs/ARCHITECTURE.md "plan/"): builds the prefix tree, estimates output
// lengths, orders the requests by the chosen policy, and reports what the cost model predicts.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <unordered_map>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "api/json_limits.h"
#include "api/openai.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "cost/cost_model.h"
#include "model/config.h"
#include "plan/admission.h"
#include "plan/admission_source.h"
#include "plan/planner.h"
#include "plan/prefix_tree.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace blend::cli {
namespace {

struct PlanArgs {
  std::string input;
  std::string model_dir;
  std::string model_shape;
  std::string hardware = "a100-80g";  // as `blend simulate`: the README's plan runs without it
  int tensor_parallel = 1;
  std::string policy = "blend";
  std::string sampled;  // a `blend batch` result file: true output lengths of a sample
  double assumed_output = 256;
  double kv_memory_gb = 0;
  std::optional<double> split_threshold;
  uint64_t seed = 0;
  bool explain = false;
  std::string out;
};

// Token ids of a completions prompt, without a tokenizer (--model-shape).
std::vector<TokenId> token_id_prompt(const nlohmann::json& body) {
  const nlohmann::json* prompt = body.contains("prompt") ? &body["prompt"] : nullptr;
  if (prompt && prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_array())
    prompt = &(*prompt)[0];
  if (!prompt || !prompt->is_array())
    throw Error("without --model, prompts must be lists of token ids");
  std::vector<TokenId> ids;
  ids.reserve(prompt->size());
  for (const nlohmann::json& t : *prompt) {
    if (!t.is_number_integer()) throw Error("prompt: token ids must be integers");
    ids.push_back(t.get<TokenId>());
  }
  return ids;
}

// custom_id -> completion tokens of the successful lines of a `blend batch` result file.
std::unordered_map<std::string, double> read_sampled_lengths(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read --sampled " + path);
  std::unordered_map<std::string, double> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || json_nesting_depth(line) > kMaxClientJsonDepth) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("custom_id")) continue;
    const nlohmann::json* usage = nullptr;
    if (j.contains("response") && j["response"].is_object() && j["response"].contains("body") &&
        j["response"]["body"].is_object() && j["response"]["body"].contains("usage"))
      usage = &j["response"]["body"]["usage"];
    if (usage && usage->contains("completion_tokens") && (*usage)["completion_tokens"].is_number())
      out[j["custom_id"].get<std::string>()] = (*usage)["completion_tokens"].get<double>();
  }
  return out;
}

// The plannable lines of the input (a line that cannot be planned is reported and counted in
// `skipped`): prompts tokenized with the model's tokenizer and template, or token ids as given.
std::vector<plan::PlanRequest> read_plan_requests(const PlanArgs& args, const Tokenizer* tokenizer,
                                                  const ChatTemplate* chat_template,
                                                  int64_t& skipped) {
  std::vector<plan::PlanRequest> requests;
  for_each_batch_input(args.input, [&](BatchInputLine&& line) {
    try {
      if (line.error) throw Error(*line.error);
      plan::PlanRequest r;
      r.id = line.custom_id;
      const Endpoint endpoint = parse_endpoint(line.url);
      int64_t max_tokens = 16;
      bool ignore_eos = false;
      if (tokenizer) {
        ApiRequest api = parse_api_request(endpoint, line.body, *tokenizer, chat_template);
        r.prompt = std::move(api.prompt);
        max_tokens = api.params.max_tokens;
        ignore_eos = api.params.ignore_eos;
      } else {
        if (endpoint != Endpoint::kCompletions)
          throw Error("chat requests need --model for the tokenizer and template");
        r.prompt = token_id_prompt(line.body);
        max_tokens = line.body.value("max_tokens", int64_t{16});
        ignore_eos = line.body.value("ignore_eos", false);
      }
      r.output_known = ignore_eos;
      r.output_tokens = ignore_eos ? static_cast<double>(max_tokens)
                                   : std::min(args.assumed_output, static_cast<double>(max_tokens));
      requests.push_back(std::move(r));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "blend plan: skipping %s: %s\n", batch_line_name(line).c_str(),
                   e.what());
      ++skipped;
    }
  });
  return requests;
}

// The admission order, emulating an engine whose requests finish in the order they started;
// also the dual scanner's first pacing (BlendServe A.2) when the policy has one.
std::vector<int32_t> emulate_admission(plan::AdmissionStream& stream, plan::DualScanner* scanner,
                                       std::optional<plan::Pacing>& first_pacing) {
  std::vector<int32_t> order;
  std::deque<int32_t> running;
  for (int64_t step = 0; !stream.exhausted(); ++step) {
    stream.on_step(step);
    if (scanner && !first_pacing && scanner->step_token_budget()) first_pacing = scanner->pacing();
    bool admitted = false;
    while (auto r = stream.next()) {
      order.push_back(*r);
      running.push_back(*r);
      admitted = true;
    }
    if (!admitted && !running.empty()) {
      stream.on_finished(running.front());
      running.pop_front();
    }
  }
  return order;
}

// `--explain`: what the plan predicts, in words, before the order.
void print_explanation(const PlanArgs& args, const plan::Plan& plan, const ModelShape& shape,
                       const Hardware& hardware, size_t num_requests, int64_t skipped,
                       int64_t sampled_count, double sharing, double cache_tokens, double t_comp,
                       double t_mem, double kv_memory, const plan::DualScanner* scanner,
                       const std::optional<plan::Pacing>& first_pacing) {
  std::printf("policy            %s (%s on %s, tp %d)\n", plan::policy_name(plan.policy),
              shape.name.c_str(), hardware.name.c_str(), args.tensor_parallel);
  std::printf("requests          %zu (%lld skipped, %lld with sampled output lengths)\n",
              num_requests, static_cast<long long>(skipped), static_cast<long long>(sampled_count));
  std::printf("root density      %.4f  (BlendServe §5.1: (1-s) T_comp / T_mem)\n",
              plan.root_density);
  std::printf(
      "sharing           s_o %.4f optimal, %.4f planned (groups), %.4f for this order "
      "with a %.0f-token LRU cache\n",
      plan.optimal_sharing_ratio, plan.planned_sharing_ratio, sharing, cache_tokens);
  std::printf(
      "predicted         T_comp %.3f s, T_mem %.3f s, T_o %.3f s overlapped / %.3f s "
      "sequential\n",
      t_comp, t_mem, std::max(t_comp, t_mem), t_comp + t_mem);
  std::printf(
      "groups            %zu (split threshold %.0f tokens, %lld nodes split, density "
      "%s)\n",
      plan.groups.size(), plan.split_threshold_tokens, static_cast<long long>(plan.split_nodes),
      plan.density_monotone ? "non-increasing" : "not monotone");
  if (scanner) {
    const auto& history = scanner->partition_history();
    const size_t shown = std::min<size_t>(history.size(), 8);
    for (size_t i = 0; i < shown; ++i) {
      const plan::MemoryPartition& m = history[i];
      std::printf(
          "partition %-7zu rho L %.3f R %.3f -> M_L %.2f GB, M_R %.2f GB, N %.1f/%.1f, "
          "C %.0f/%.0f tokens%s%s\n",
          i, m.rho_left, m.rho_right, m.memory_left / 1e9, m.memory_right / 1e9, m.requests_left,
          m.requests_right, m.prefill_budget_left, m.prefill_budget_right,
          m.note.empty() ? "" : "; ", m.note.c_str());
    }
    if (history.size() > shown) std::printf("partition ...     %zu more\n", history.size() - shown);
    if (first_pacing)
      std::printf(
          "capacity pacing   step budget %d tokens, M_R %.2f GB for the memory-intensive "
          "requests' average footprint (the longest ones' ends %.0f steps apart), %.2f GB kept "
          "for the rest (KV token-steps / M: at least %.0f steps)\n",
          first_pacing->step_tokens, first_pacing->memory_right / 1e9,
          first_pacing->right_end_spacing, first_pacing->memory_left_floor / 1e9,
          first_pacing->remaining_occupancy / kv_memory);
  }
  std::printf("order\n");
}

void run_plan(const PlanArgs& args) {
  if (args.model_dir.empty() == args.model_shape.empty())
    throw Error("give exactly one of --model DIR and --model-shape PRESET");
  const Hardware hardware = resolve_hardware(args.hardware);
  std::optional<ModelShape> shape;
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  if (!args.model_dir.empty()) {
    shape = ModelShape::from_config(ModelConfig::from_dir(args.model_dir), args.model_dir,
                                    args.tensor_parallel);
    tokenizer = Tokenizer::from_dir(args.model_dir);
    try {
      chat_template = ChatTemplate::from_dir(args.model_dir);
    } catch (const Error&) {
    }
  } else {
    shape = find_model_shape_preset(args.model_shape, args.tensor_parallel);
    if (!shape) throw Error("unknown --model-shape " + args.model_shape);
  }
  const CostModel cost(*shape, hardware);

  int64_t skipped = 0;
  std::vector<plan::PlanRequest> requests = read_plan_requests(
      args, tokenizer ? &*tokenizer : nullptr, chat_template ? &*chat_template : nullptr, skipped);
  if (requests.empty()) throw Error("no plannable requests in " + args.input);

  plan::PrefixTree tree(requests);
  int64_t sampled_count = 0;
  if (!args.sampled.empty()) {  // §5.1: subtrees take their sampled requests' mean length
    const auto lengths = read_sampled_lengths(args.sampled);
    std::vector<std::optional<double>> sampled(requests.size());
    for (size_t i = 0; i < requests.size(); ++i)
      if (auto it = lengths.find(requests[i].id); it != lengths.end()) {
        sampled[i] = it->second;
        ++sampled_count;
      }
    const std::vector<plan::OutputEstimate> d =
        plan::estimate_output_lengths(tree, sampled, args.assumed_output);
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].output_tokens = d[i].tokens;
      requests[i].output_spread = d[i].spread;
    }
  }

  plan::PlanOptions options;
  options.policy = plan::parse_policy(args.policy);
  options.split_threshold_tokens = args.split_threshold;
  options.seed = args.seed;
  const plan::Plan plan = plan::make_plan(tree, cost, options);

  const double kv_memory =
      args.kv_memory_gb > 0 ? args.kv_memory_gb * 1e9
                            : 0.9 * hardware.memory_bytes -
                                  static_cast<double>(shape->weight_bytes) / args.tensor_parallel;
  if (kv_memory <= 0) throw Error("the model's weights do not fit; raise --tp or set --kv-memory");

  // The admission order, emulating an engine whose requests finish in the order they started.
  std::unique_ptr<plan::AdmissionStream> stream;
  plan::DualScanner* scanner = nullptr;
  if (plan::blend_planned(options.policy)) {
    auto dual = std::make_unique<plan::DualScanner>(plan, requests, cost, kv_memory, 128,
                                                    plan::scanner_options(options.policy, {}));
    scanner = dual.get();
    stream = std::move(dual);
  } else {
    stream = std::make_unique<plan::OrderedStream>(plan, requests, cost, kv_memory);
  }
  std::optional<plan::Pacing> first_pacing;
  const std::vector<int32_t> order = emulate_admission(*stream, scanner, first_pacing);

  const double cache_tokens = kv_memory / cost.kv_bytes_per_token_per_device();
  const double sharing = plan::sharing_ratio_of_order(tree, order, cache_tokens);
  const double t_comp = (1 - sharing) * plan.root.compute_seconds;
  const double t_mem = plan.root.memory_seconds;
  nlohmann::json report = {{"policy", plan::policy_name(plan.policy)},
                           {"model", shape->name},
                           {"hardware", hardware.name},
                           {"tensor_parallel", args.tensor_parallel},
                           {"requests", static_cast<int64_t>(requests.size())},
                           {"skipped", skipped},
                           {"sampled_output_lengths", sampled_count},
                           {"prompt_tokens", plan.root.prompt_tokens},
                           {"estimated_output_tokens", plan.root.output_tokens},
                           {"root_density", plan.root_density},
                           {"optimal_sharing_ratio", plan.optimal_sharing_ratio},
                           {"planned_sharing_ratio", plan.planned_sharing_ratio},
                           {"order_sharing_ratio", sharing},
                           {"kv_memory_gb", kv_memory / 1e9},
                           {"t_comp_seconds", t_comp},
                           {"t_mem_seconds", t_mem},
                           {"t_sequential_seconds", t_comp + t_mem},
                           {"t_overlapped_seconds", std::max(t_comp, t_mem)},
                           {"groups", static_cast<int64_t>(plan.groups.size())},
                           {"split_threshold_tokens", plan.split_threshold_tokens},
                           {"split_nodes", plan.split_nodes},
                           {"density_monotone", plan.density_monotone}};
  if (scanner) {
    nlohmann::json partitions = nlohmann::json::array();
    for (const plan::MemoryPartition& m : scanner->partition_history()) {
      partitions.push_back({{"rho_left", m.rho_left},
                            {"rho_right", m.rho_right},
                            {"memory_left_gb", m.memory_left / 1e9},
                            {"memory_right_gb", m.memory_right / 1e9},
                            {"requests_left", m.requests_left},
                            {"requests_right", m.requests_right},
                            {"prefill_budget_left", m.prefill_budget_left},
                            {"prefill_budget_right", m.prefill_budget_right},
                            {"note", m.note}});
    }
    report["memory_partitions"] = partitions;
    if (first_pacing)
      report["capacity_pacing"] = {{"step_tokens", first_pacing->step_tokens},
                                   {"memory_right_gb", first_pacing->memory_right / 1e9},
                                   {"left_floor_gb", first_pacing->memory_left_floor / 1e9},
                                   {"right_end_spacing_steps", first_pacing->right_end_spacing},
                                   {"remaining_dense_tokens", first_pacing->remaining_dense},
                                   {"kv_token_steps_bytes", first_pacing->remaining_occupancy}};
  }
  nlohmann::json ids = nlohmann::json::array();
  for (int32_t r : order) ids.push_back(requests[static_cast<size_t>(r)].id);

  if (args.explain)
    print_explanation(args, plan, *shape, hardware, requests.size(), skipped, sampled_count,
                      sharing, cache_tokens, t_comp, t_mem, kv_memory, scanner, first_pacing);
  if (args.explain || args.out.empty())
    for (const nlohmann::json& id : ids) std::printf("%s\n", id.get<std::string>().c_str());
  if (!args.out.empty()) {
    report["order"] = ids;
    std::ofstream out(args.out);
    out << report.dump(2) << "\n";
    if (!out) throw Error("cannot write " + args.out);
  }
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Order a Batch API input file with the BlendServe planner and explain the order");
  cmd->add_option("--input", args->input, "Batch input JSONL")->required();
  cmd->add_option("--model", args->model_dir,
                  "Model folder or GGUF file (tokenizer, template and shapes)")
      ->transform(model_source_transform());
  cmd->add_option("--model-shape", args->model_shape,
                  "Shape preset (llama-3-8b, llama-3-70b, qwen2.5-72b, opt-13b, ...) when prompts "
                  "are token ids");
  cmd->add_option("--hardware", args->hardware,
                  "a100-80g, a100-40g, h100, h200, or a JSON hardware profile")
      ->capture_default_str();
  cmd->add_option("--tp", args->tensor_parallel, "Tensor-parallel degree")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--policy", args->policy, "blend, blend@alg3, dfs, fcfs or random");
  cmd->add_option("--sampled", args->sampled,
                  "Result JSONL of a sample run: true output lengths to estimate from (§5.1)");
  cmd->add_option("--assume-output", args->assumed_output,
                  "Output length assumed where nothing better is known (capped by max_tokens)");
  cmd->add_option("--kv-memory", args->kv_memory_gb,
                  "KV memory per device in GB (default: 90% of memory minus the weights)");
  cmd->add_option("--split-threshold", args->split_threshold,
                  "Alg. 2 threshold t in recomputed tokens (default: 1% of the shared tokens)");
  cmd->add_option("--seed", args->seed, "Seed of the random policy");
  cmd->add_flag("--explain", args->explain,
                "Print densities, sharing, predicted times, partitions");
  cmd->add_option("--out", args->out, "Write the plan and its order as JSON here");
  cmd->callback([args] { run_plan(*args); });
}

}  // namespace blend::cli
