// One OpenAI Batch API job's lines on one engine: what `blend batch` does in one process and
// what each data-parallel rank does with its partition (dist/). Each line is checked and
// tokenized (api/batch_file: prepare_batch_line), the good ones run in input order (fcfs: all
// queued at once) or in a BlendServe plan's order (offline/planned_run), and every line's result,
// success or error, goes to a sink exactly once as the response body a Batch API result line
// carries (where it is written is the caller's business: a file, or rank 0 over MPI).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "engine/engine.h"
#include "grammar/json_schema.h"
#include "offline/planned_run.h"
#include "plan/prefix_tree.h"
#include "text/chat_template.h"

namespace blend {

struct BatchJobOptions {
  std::string endpoint;  // the batch's endpoint; empty = each line's url
  // One model: lines naming another fail (empty = any name is taken). Several models: lines
  // pick one by the engine's names, and this must be empty.
  std::string served_model_name;
  std::string policy = "fcfs";   // fcfs = input order, all queued at once; else a plan's
  std::string hardware = "cpu";  // the planner's cost model (a `blend profile` file)
  double assumed_output = 256;   // planner's guess when a request's length is not known
  SamplingOptions sampling{.fraction = 0.01, .seed = 1};
  plan::PlannerKnobs planner;  // blend's pacing (its rules dropped by --pacing-without)
};

// Where results go. `success` gets the response body, `error` the status and error body.
struct BatchResultSink {
  std::function<void(const std::string& custom_id, const nlohmann::json& body)> success;
  std::function<void(const std::string& custom_id, int status, const nlohmann::json& body)> error;
};

struct BatchJobStats {
  int64_t requests = 0;  // lines run (or failed) by this job
  int64_t completed = 0, failed = 0;
  int64_t optimal_shared_tokens = 0;  // prompt tokens an unlimited prefix cache would share
  std::optional<PlannedRunStats> plan;
};

class BatchJob {
 public:
  // Reads each model's chat template from its folder (a model without one fails chat lines one
  // by one). Responses name the engine's model names. Throws blend::Error for a bad
  // --endpoint, an unknown policy, or models whose tokenizers differ.
  BatchJob(Engine& engine, BatchJobOptions options);
  BatchJob(const BatchJob&) = delete;  // context_ points into the object
  BatchJob& operator=(const BatchJob&) = delete;

  // Checks and tokenizes `lines`: bad lines get their error result in `sink` at once (counted
  // in stats()); the good ones come back, ready to run.
  std::vector<PreparedBatchLine> prepare(const std::vector<BatchInputLine>& lines,
                                         const BatchResultSink& sink);
  // The planner's view of a prepared line (prompt, output estimate): what the data-parallel
  // partition of a job cuts (plan/dp_partition).
  plan::PlanRequest plan_request(const PreparedBatchLine& line) const;
  // The same line as an offline request (its first sample): what a data-parallel re-cut
  // simulates (offline/planned_run.h simulate_parts).
  OfflineRequest offline_request(const PreparedBatchLine& line) const {
    return offline_request(line.generation);
  }
  // The planner's cost model: this engine's model shape on the --hardware profile (or the
  // built-in CPU estimate).
  CostModel planner_cost() const;

  // Runs prepared lines to completion, each result to `sink` as it finishes; `progress` is
  // called after every step with the lines answered so far and a bound on the tokens the run
  // computes in all: prompt + max_tokens of every line (capped by the context), less what each
  // finished line did not use (for a progress bar's ETA, cli/progress.h).
  void run(std::vector<PreparedBatchLine> lines, const BatchResultSink& sink,
           const std::function<void(int64_t answered, int64_t token_bound)>& progress = {});

  const BatchJobStats& stats() const { return stats_; }
  // The first model's name (the only one's, usually).
  const std::string& model_name() const { return engine_.model_name(0); }

 private:
  OfflineRequest offline_request(const GenerationRequest& gen) const;

  Engine& engine_;
  BatchJobOptions options_;
  std::vector<std::optional<ChatTemplate>> chat_templates_;  // by ModelId
  // response_format schemas of the job's lines, compiled once each: one compiler per tokenizer.
  std::vector<std::unique_ptr<GrammarCompiler>> grammars_;
  BatchLineContext context_;
  BatchJobStats stats_;
};

// The engine's side of a run's statistics (tokens, steps, sharing, KV, time) as `--stats`
// writes them; `job` adds its counts and plan. `wall_seconds` is the run's own time.
nlohmann::json batch_run_stats(const Engine& engine, const BatchJobStats& job, double wall_seconds);

}  // namespace blend
