// blend batch — an OpenAI Batch API input file in, a result file out (DESIGN.md §1).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "backend/backend.h"
#include "blocks/adaptive.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/progress.h"
#include "core/error.h"
#include "dist/data_parallel.h"
#include "engine/engine.h"
#include "harness/plot.h"
#include "harness/profile.h"
#include "offline/batch_job.h"
#include "plan/admission_source.h"

namespace blend::cli {
namespace {

struct BatchArgs {
  std::string model;
  std::string zoo;                        // several models in one engine (model/zoo.h)
  std::vector<std::string> lora_modules;  // vLLM's --lora-modules NAME=DIR
  std::string input;
  std::string output;
  std::string stats;
  std::string step_timings;  // each step's shape and time, for `blend profile --steps`
  std::string plot;          // PNG of throughput and KV use over the run
  EngineOptions engine;
  BatchJobOptions job;
  std::vector<std::string> pacing_without;  // blend's capacity pacing rules dropped
  int32_t dp_recuts = 0;                    // mpirun: re-cuts of the data-parallel partition
  AdaptiveFlags adaptive;                   // BlockLLM adaptive serving (--zoo)
  bool quiet = false;
};

void run_batch(const BatchArgs& given) {
  BatchArgs args = given;
  plan::drop_pacing_rules(args.job.planner.pacing, args.pacing_without);
  check_adaptive_flags(args.adaptive, args.engine);
  // `mpirun -np N blend batch ...`: N data-parallel replicas (dist/data_parallel.h).
  if (dist::launched_by_mpirun()) {
    if (!args.zoo.empty() || !args.lora_modules.empty() || args.model.empty() ||
        !args.adaptive.blocks.empty())
      throw Error(
          "--zoo, --lora-modules and --adaptive-blocks run on one machine for now: "
          "data-parallel ranks take one --model");
    if (!args.step_timings.empty() || !args.plot.empty())
      throw Error("--step-timings and --plot record one engine's steps: run them without mpirun");
    dist::run_batch({.model = args.model,
                     .input = args.input,
                     .output = args.output,
                     .stats = args.stats,
                     .engine = args.engine,
                     .job = args.job,
                     .dp_recuts = args.dp_recuts,
                     .quiet = args.quiet});
    return;
  }
  if (args.dp_recuts != 0)
    throw Error("--dp-recut re-cuts a data-parallel job's partition: run it under mpirun");
  const auto t_load = std::chrono::steady_clock::now();
  // Before anything runs: a second `blend batch` on this output would run every request again.
  ExclusiveLock lock(output_lock_path(args.output), "the output file " + args.output);
  const std::vector<BatchInputLine> lines = read_batch_input(args.input);
  Engine engine(model_folders(args.model, "", args.zoo, args.lora_modules), args.engine);
  if (!args.adaptive.blocks.empty()) {
    const auto chains =
        enable_adaptive_serving(engine, args.adaptive.blocks, args.adaptive.threshold);
    if (!args.quiet) std::fputs(describe_adaptive_chains(engine, chains).c_str(), stderr);
  }
  BatchJobOptions job_options = args.job;
  BatchJob job(engine, job_options);
  BatchResultWriter writer(args.output);
  if (writer.set_aside() > 0 && !args.quiet)
    std::fprintf(stderr,
                 "blend batch: %lld lines of %s were not results of this job (not JSON, no "
                 "custom_id, or a custom_id twice); moved to %s, their requests run again\n",
                 static_cast<long long>(writer.set_aside()), args.output.c_str(),
                 writer.set_aside_path().c_str());
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  std::optional<StepRecorder> recorder;
  if (!args.step_timings.empty()) recorder.emplace(engine);
  std::optional<RunTimeline> timeline;
  if (!args.plot.empty()) timeline.emplace(engine);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<BatchInputLine> todo;  // a rerun skips what the output already holds
  int64_t skipped = 0;
  for (const BatchInputLine& line : lines) {
    if (writer.done_ids().count(line.custom_id))
      ++skipped;
    else
      todo.push_back(line);
  }
  const BatchResultSink sink{
      [&writer](const std::string& id, const nlohmann::json& body) {
        writer.write_success(id, body);
      },
      [&writer](const std::string& id, int status, const nlohmann::json& body) {
        writer.write_error(id, status, body);
      }};
  std::vector<PreparedBatchLine> prepared = job.prepare(todo, sink);
  Progress progress(static_cast<int64_t>(todo.size()), args.quiet ? ProgressStyle::kOff
                                                       : ::isatty(STDERR_FILENO)
                                                           ? ProgressStyle::kBar
                                                           : ProgressStyle::kLines);
  job.run(std::move(prepared), sink, [&](int64_t answered, int64_t token_bound) {
    const EngineStats st = engine.stats();
    progress.update(answered, st.prompt_tokens + st.output_tokens, token_bound);
  });
  progress.finish();
  if (recorder) write_step_timings(args.step_timings, recorder->steps(engine.clock_seconds()));
  if (timeline && !timeline->steps().empty()) {
    write_run_plot(args.plot,
                   "blend batch: " + job.model_name() + ", " + args.job.policy + " order",
                   *timeline, engine.clock_seconds());
    if (!args.quiet) std::fprintf(stderr, "blend batch: wrote %s\n", args.plot.c_str());
  }

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json stats = batch_run_stats(engine, job.stats(), wall);
  stats["skipped_already_done"] = skipped;
  stats["load_seconds"] = load_seconds;
  stats["prefix_cache"] = args.engine.prefix_cache;
  stats["overlap_schedule"] = args.engine.overlap;
  stats["policy"] = args.job.policy;
  stats["deterministic"] = args.engine.deterministic;
  stats["threads"] = args.engine.threads;
  const OpStatistics ops = engine.backend().op_statistics();
  if (ops.steps > 0 && ops.thread_steps > 0)  // below --threads when CoreShare lowered passes
    stats["pass_threads_mean"] =
        static_cast<double>(ops.thread_steps) / static_cast<double>(ops.steps);
  if (ops.steps > 0) {
    nlohmann::json seconds = nlohmann::json::object();
    for (const auto& [op, s] : ops.seconds) seconds[op] = s;
    stats["op_seconds"] = std::move(seconds);
  }
  if (!args.quiet)
    std::fprintf(stderr,
                 "blend batch: %lld requests (%lld failed, %lld already done), %lld in + %lld out "
                 "tokens in %.2f s = %.1f tokens/s, %lld steps\n",
                 static_cast<long long>(job.stats().requests),
                 static_cast<long long>(job.stats().failed), static_cast<long long>(skipped),
                 stats["input_tokens"].get<long long>(), stats["output_tokens"].get<long long>(),
                 wall, stats["throughput_tokens_per_s"].get<double>(),
                 stats["steps"].get<long long>());
  if (!args.stats.empty()) {
    std::ofstream out(args.stats);
    out << stats.dump(2) << "\n";
    if (!out) throw Error("cannot write " + args.stats);
  }
  // The run is complete: the lock file goes once the output is closed (`writer`, declared
  // after `lock`, is destroyed first). OUTPUT.set-aside stays: it holds the only copy of the
  // bytes set aside, which the message above pointed to.
  lock.remove_file_on_release();
}

}  // namespace

void register_batch_command(CLI::App& app) {
  auto args = std::make_shared<BatchArgs>();
  CLI::App* cmd = app.add_subcommand("batch", "Run an OpenAI Batch API JSONL file offline");
  cmd->add_option("--model", args->model, "Model folder or GGUF file (the first model, with --zoo)")
      ->transform(model_source_transform());
  cmd->add_option("--zoo", args->zoo,
                  "Serve every model folder in this folder too, in one engine; a line's "
                  "body.model picks one by folder name (fine-tunes of one architecture)");
  cmd->add_option("--lora-modules", args->lora_modules,
                  "LoRA adapters on --model, as vLLM: NAME=DIR ... (lines pick them by NAME)");
  cmd->add_option("--input", args->input, "Batch input JSONL")->required();
  cmd->add_option("--output", args->output,
                  "Result JSONL (appended; custom_ids already there are skipped; one run at a "
                  "time: OUTPUT.lock; lines that are no results are moved to OUTPUT.set-aside)")
      ->required();
  cmd->add_option("--stats", args->stats, "Write run statistics as JSON here");
  cmd->add_option("--endpoint", args->job.endpoint,
                  "The batch's endpoint (/v1/completions or /v1/chat/completions): lines with "
                  "another url fail, as in OpenAI's Batch API (default: each line's url)");
  cmd->add_option("--served-model-name", args->job.served_model_name,
                  "Lines whose body names another model fail with 404, as `blend serve` does "
                  "(default: any model name is accepted)");
  cmd->add_option("--step-timings", args->step_timings,
                  "Write each engine step's shape and wall time (to the next step's start) as "
                  "JSONL here, for `blend profile --steps`");
  cmd->add_option("--plot", args->plot,
                  "Write a PNG of throughput (tokens/s) and KV cache use over the run here; its "
                  "numbers go to the same name with .dat");
  add_engine_flags(cmd, args->engine);
  add_adaptive_flags(cmd, args->adaptive, args->engine);
  cmd->add_option("--policy", args->job.policy,
                  "Request order: fcfs (input order, default), or a BlendServe plan: blend "
                  "(dual scanner), blend@alg3 (its admission as Alg. 3 publishes it), dfs "
                  "(prefix-tree order), random")
      ->check(CLI::IsMember({"fcfs", "blend", "blend@alg3", "dfs", "random"}));
  cmd->add_option("--hardware", args->job.hardware,
                  "The planner's view of this machine: a `blend profile` file (default: a "
                  "built-in 2-core CPU estimate)");
  cmd->add_option("--sample-fraction", args->job.sampling.fraction,
                  "With a planned --policy: this fraction of the requests without ignore_eos "
                  "runs first and their output lengths estimate the others' (BlendServe §5.1; "
                  "default 0.01)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--pacing-without", args->pacing_without,
                  "With --policy blend: capacity pacing without these of its rules "
                  "(comma-separated): budget (the engine's fixed step budget), spacing (no end "
                  "spacing of memory-intensive requests), floor (no floor kept for the compute-"
                  "intensive side); as `blend simulate --pacing-without`")
      ->delimiter(',');
  cmd->add_option("--dp-recut", args->dp_recuts,
                  "Under mpirun: after the first cut, rank 0 simulates each rank's part on the "
                  "--hardware profile and cuts this many times more by the simulated rates, "
                  "keeping the cut whose slowest rank is fastest (as `blend simulate --dp N "
                  "--dp-recut K`)")
      ->check(CLI::Range(0, 16));
  cmd->add_option("--assume-output", args->job.assumed_output,
                  "Output length the planner assumes for requests without ignore_eos");
  cmd->add_flag("--quiet", args->quiet, "No progress bar or summary");
  cmd->add_option("--max-model-len", args->engine.max_model_len,
                  "Longest prompt + output of a request (default: the model's context; more is "
                  "refused; also picks longrope's factors, as for serve)")
      ->check(CLI::PositiveNumber);
  cmd->callback([args] { run_batch(*args); });
}

}  // namespace blend::cli
