// blend batch — an OpenAI Batch API input file in, a result file out (DESIGN.md §1).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "api/batch_lines.h"
#include "api/openai.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/progress.h"
#include "core/error.h"
#include "engine/engine.h"
#include "grammar/json_schema.h"
#include "harness/profile.h"
#include "kv/radix_cache.h"
#include "offline/planned_run.h"
#include "text/chat_template.h"

namespace blend::cli {
namespace {

struct BatchArgs {
  std::string model;
  std::string input;
  std::string output;
  std::string stats;
  std::string step_timings;       // each step's shape and time, for `blend profile --steps`
  std::string endpoint;           // the batch's endpoint; empty = each line's url
  std::string served_model_name;  // lines naming another model fail; empty = any name
  EngineOptions engine;
  bool quiet = false;
  std::string policy = "fcfs";   // fcfs = input order, all queued at once; else a plan's
  std::string hardware = "cpu";  // for the planner's cost model (a `blend profile` file)
  double assumed_output = 256;   // planner's guess when a request's length is not known
  SamplingOptions sampling{.fraction = 0.01, .seed = 1};
};

std::optional<ChatTemplate> load_chat_template(const std::filesystem::path& dir) {
  try {
    return ChatTemplate::from_dir(dir);
  } catch (const Error&) {
    return std::nullopt;  // chat requests then fail one by one with a clear message
  }
}

void run_batch(const BatchArgs& args) {
  const auto t_load = std::chrono::steady_clock::now();
  const std::vector<BatchInputLine> lines = read_batch_input(args.input);
  std::optional<Endpoint> batch_endpoint;
  if (!args.endpoint.empty()) {
    try {
      batch_endpoint = parse_endpoint(args.endpoint);
    } catch (const ApiError& e) {
      throw Error(std::string("--endpoint: ") + e.what());
    }
  }
  Engine engine(args.model, args.engine);
  const std::optional<ChatTemplate> chat_template = load_chat_template(args.model);
  BatchResultWriter writer(args.output);
  std::string model_name = std::filesystem::path(args.model).filename().string();
  if (model_name.empty())
    model_name = std::filesystem::path(args.model).parent_path().filename().string();
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  std::optional<StepRecorder> recorder;
  if (!args.step_timings.empty()) recorder.emplace(engine);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  int64_t total = 0, done = 0, failed = 0, skipped = 0;
  std::vector<std::vector<TokenId>> prompts;           // for the optimal sharing ratio
  std::unordered_map<std::string, ApiRequest> api_of;  // request settings for the response
  std::vector<OfflineRequest> planned;                 // --policy other than fcfs
  const bool use_plan = args.policy != "fcfs";
  Progress progress(0, false);
  auto on_result = [&](GenerationResult&& r) {
    const ApiRequest& request = api_of.at(r.id);
    const char* prefix = request.endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-";
    writer.write_success(
        r.id, make_response(request, r, make_id(prefix), model_name, created, engine.tokenizer()));
    api_of.erase(r.id);
    ++done;
    const EngineStats st = engine.stats();
    progress.update(done + failed, st.prompt_tokens + st.output_tokens);
  };
  BatchLineContext context;
  context.tokenizer = &engine.tokenizer();
  context.chat_template = chat_template ? &*chat_template : nullptr;
  context.max_sequence_tokens = engine.max_sequence_tokens();
  context.max_prompt_bytes = max_prompt_bytes(engine.tokenizer(), context.max_sequence_tokens);
  context.endpoint = batch_endpoint;
  context.sampling_defaults = &engine.config().sampling_defaults;
  GrammarCompiler grammars(engine.tokenizer(), engine.config().vocab_size,
                           engine.config().eos_token_ids);
  context.grammars = &grammars;
  if (!args.served_model_name.empty()) context.model = args.served_model_name;
  for (const BatchInputLine& line : lines) {
    if (writer.done_ids().count(line.custom_id)) {
      ++skipped;
      continue;
    }
    ++total;
    try {
      PreparedBatchLine prepared = prepare_batch_line(line, context);
      if (prepared.error) throw *prepared.error;
      GenerationRequest& gen = prepared.generation;
      engine.check_request(gen);
      prompts.push_back(gen.prompt);
      api_of.emplace(line.custom_id, std::move(prepared.api));
      if (use_plan) {
        OfflineRequest q{gen.id, std::move(gen.prompt), gen.params, 0, gen.params.ignore_eos};
        q.output_estimate = q.output_known
                                ? q.params.max_tokens
                                : std::min<double>(args.assumed_output, q.params.max_tokens);
        planned.push_back(std::move(q));
      } else {
        engine.submit(std::move(gen), on_result);
      }
    } catch (const ApiError& e) {
      writer.write_error(line.custom_id, e.status(), e.body());
      ++failed;
    } catch (const Error& e) {
      writer.write_error(line.custom_id, 400, ApiError(400, e.what()).body());
      ++failed;
    }
  }

  progress = Progress(total, !args.quiet && ::isatty(STDERR_FILENO));
  std::optional<PlannedRunStats> plan_stats;
  if (use_plan && !planned.empty()) {
    const Hardware hw =
        args.hardware == "cpu" ? default_cpu_hardware() : resolve_hardware(args.hardware);
    const CostModel cost(ModelShape::from_config(engine.config(), model_name), hw);
    plan_stats = run_planned(engine, planned, plan::parse_policy(args.policy), cost,
                             static_cast<double>(engine.stats().kv_capacity_bytes), on_result,
                             args.sampling);
  }
  while (engine.has_work()) {
    engine.step();
    const EngineStats s = engine.stats();
    progress.update(done + failed, s.prompt_tokens + s.output_tokens);
  }
  progress.finish();
  if (recorder) write_step_timings(args.step_timings, recorder->steps(engine.clock_seconds()));

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats s = engine.stats();
  const int64_t tokens = s.prompt_tokens + s.output_tokens;
  std::vector<std::span<const TokenId>> prompt_spans(prompts.begin(), prompts.end());
  const auto ratio = [&](int64_t shared) {
    return s.prompt_tokens > 0 ? static_cast<double>(shared) / static_cast<double>(s.prompt_tokens)
                               : 0.0;
  };
  nlohmann::json stats = {
      {"requests", total},
      {"completed", done},
      {"failed", failed},
      {"skipped_already_done", skipped},
      {"input_tokens", s.prompt_tokens},
      {"output_tokens", s.output_tokens},
      {"wall_seconds", wall},
      {"load_seconds", load_seconds},
      {"throughput_tokens_per_s", wall > 0 ? static_cast<double>(tokens) / wall : 0.0},
      {"output_tokens_per_s", wall > 0 ? static_cast<double>(s.output_tokens) / wall : 0.0},
      {"steps", s.steps},
      {"mean_batch_tokens",
       s.steps ? static_cast<double>(s.batch_tokens) / static_cast<double>(s.steps) : 0.0},
      {"preemptions", s.preemptions},
      {"prefix_cache", args.engine.prefix_cache},
      {"overlap_schedule", args.engine.overlap},
      {"schedule_seconds", s.schedule_seconds},
      {"step_seconds", s.step_seconds},
      {"backend_seconds", s.backend_seconds},
      {"cached_prompt_tokens", s.cached_prompt_tokens},
      {"sharing_ratio", ratio(s.cached_prompt_tokens)},
      {"sharing_optimal", ratio(optimal_shared_tokens(std::move(prompt_spans)))},
      {"cache_evicted_pages", s.cache_evicted_pages},
      {"kv_offloaded_pages", s.kv_offloaded_pages},
      {"kv_loaded_pages", s.kv_loaded_pages},
      {"kv_peak_bytes", s.kv_peak_bytes},
      {"kv_capacity_bytes", s.kv_capacity_bytes},
      {"policy", args.policy},
      {"deterministic", args.engine.deterministic},
      {"threads", args.engine.threads}};
  if (plan_stats) {
    stats["sampled_requests"] = plan_stats->sampled_requests;
    stats["sampling_seconds"] = plan_stats->sampling_seconds;
  }
  if (!args.quiet)
    std::fprintf(stderr,
                 "blend batch: %lld requests (%lld failed, %lld already done), %lld in + %lld out "
                 "tokens in %.2f s = %.1f tokens/s, %lld steps\n",
                 static_cast<long long>(total), static_cast<long long>(failed),
                 static_cast<long long>(skipped), static_cast<long long>(s.prompt_tokens),
                 static_cast<long long>(s.output_tokens), wall,
                 stats["throughput_tokens_per_s"].get<double>(), static_cast<long long>(s.steps));
  if (!args.stats.empty()) {
    std::ofstream out(args.stats);
    out << stats.dump(2) << "\n";
    if (!out) throw Error("cannot write " + args.stats);
  }
}

}  // namespace

void register_batch_command(CLI::App& app) {
  auto args = std::make_shared<BatchArgs>();
  CLI::App* cmd = app.add_subcommand("batch", "Run an OpenAI Batch API JSONL file offline");
  cmd->add_option("--model", args->model, "Model folder")->required();
  cmd->add_option("--input", args->input, "Batch input JSONL")->required();
  cmd->add_option("--output", args->output,
                  "Result JSONL (appended; custom_ids already there are skipped)")
      ->required();
  cmd->add_option("--stats", args->stats, "Write run statistics as JSON here");
  cmd->add_option("--endpoint", args->endpoint,
                  "The batch's endpoint (/v1/completions or /v1/chat/completions): lines with "
                  "another url fail, as in OpenAI's Batch API (default: each line's url)");
  cmd->add_option("--served-model-name", args->served_model_name,
                  "Lines whose body names another model fail with 404, as `blend serve` does "
                  "(default: any model name is accepted)");
  cmd->add_option("--step-timings", args->step_timings,
                  "Write each engine step's shape and wall time (to the next step's start) as "
                  "JSONL here, for `blend profile --steps`");
  add_engine_flags(cmd, args->engine);
  cmd->add_option("--policy", args->policy,
                  "Request order: fcfs (input order, default), or a BlendServe plan: blend "
                  "(dual scanner), dfs (prefix-tree order), random")
      ->check(CLI::IsMember({"fcfs", "blend", "dfs", "random"}));
  cmd->add_option("--hardware", args->hardware,
                  "The planner's view of this machine: a `blend profile` file (default: a "
                  "built-in 2-core CPU estimate)");
  cmd->add_option("--sample-fraction", args->sampling.fraction,
                  "With a planned --policy: this fraction of the requests without ignore_eos "
                  "runs first and their output lengths estimate the others' (BlendServe §5.1; "
                  "default 0.01)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--assume-output", args->assumed_output,
                  "Output length the planner assumes for requests without ignore_eos");
  cmd->add_flag("--quiet", args->quiet, "No progress bar or summary");
  cmd->callback([args] { run_batch(*args); });
}

}  // namespace blend::cli
