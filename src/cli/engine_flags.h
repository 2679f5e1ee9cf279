// What the CLI commands share, defined once: the engine flags `blend batch` and `blend serve`
// take (KV sizing, batching, prefix cache, KV tiers, determinism), and the parsing of policy
// names, KV layouts, comma lists and simulated KV memory that serve, bench serve, simulate and
// simulate-serve have in common.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cost/cost_model.h"
#include "engine/engine.h"

namespace blend::cli {

void add_engine_flags(CLI::App* cmd, EngineOptions& options);

// What every `--model` option applies to its value: a GGUF file (or a folder holding one and no
// config.json) becomes the model folder it is imported into once (gguf/import.h's
// resolve_model_source); a model folder stays itself. A file that cannot be imported is the
// option's error, naming what in it is not supported.
CLI::Validator model_source_transform();

// The cuda backend's knobs as flags --cuda-NAME VALUE (backend/cuda/knobs.h), in --help's "CUDA
// backend" group, into `knobs` by name. Nothing in a build without the cuda backend.
void add_cuda_knob_flags(CLI::App* cmd, std::map<std::string, std::string>& knobs);

// --dense-batch-sizes (NanoFlow §4.2's discrete batching; batch, serve, simulate): a comma list
// of token counts, or a `blend profile` file whose GEMM row tile's multiples are the sizes
// (none when it saw no tile: a note says so). set_dense_batch_sizes throws blend::Error naming
// the flag for anything else.
void add_dense_batch_sizes_flag(CLI::App* cmd, SchedulerOptions& scheduler);
void set_dense_batch_sizes(const std::string& value, SchedulerOptions& scheduler);

// BlockLLM's adaptive serving (blocks/adaptive.h; batch, serve): --adaptive-blocks FILE (what
// `blend zoo analyze --out` wrote), --adaptive-threshold T (default: the file's), and
// --adaptive-serving request|all (whether requests that do not say allow it; sets
// options.adaptive_by_default).
struct AdaptiveFlags {
  std::string blocks;
  double threshold = 0;
};
void add_adaptive_flags(CLI::App* cmd, AdaptiveFlags& flags, EngineOptions& options);
// Throws blend::Error when --adaptive-threshold or --adaptive-serving all come without
// --adaptive-blocks (they would change nothing).
void check_adaptive_flags(const AdaptiveFlags& flags, const EngineOptions& options);

// --hybrid-initial-batch, --hybrid-batch-step, --hybrid-overdue-after,
// --hybrid-preempt-be-pages (serve, bench serve, simulate-serve).
// The batch size's ceiling is --max-running (the scheduler applies it).
void add_hybrid_flags(CLI::App* cmd, HybridOptions& hybrid);

// BROS's iteration model (§4.1) from a `blend profile` file (serve --profile).
IterationCostModel read_iteration_model(const std::string& path);

// "hybrid" | "fcfs" | "round-robin" | "prefill-first" (the names --scheduler takes).
const std::map<std::string, SchedulerPolicy>& scheduler_policy_names();
// Those names, comma-separated (for help and error texts).
std::string scheduler_policy_list();
// Throws blend::Error naming the policy when it is not one of them.
SchedulerPolicy parse_scheduler_policy(const std::string& name);
// `--policy` means one thing, a plan order (blend batch, plan, simulate); the commands that
// pick a scheduler instead (serve, simulate-serve, bench serve, bench soak) take --scheduler
// and refuse --policy with this, naming --scheduler (and `also`, e.g. serve's --batch-policy),
// so that a command line written for the old meaning fails instead of meaning another thing.
void refuse_policy_flag(CLI::App* cmd, const std::string& also = "");

// --kv-layout: "bidirectional", "unidirectional", or "auto" (bidirectional with the hybrid
// policy, as BROS; unidirectional for its baselines).
bool bidirectional_kv_for(const std::string& layout, SchedulerPolicy policy);

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_list(const std::string& list);

// The simulator's KV memory per device: `kv_memory_gb` when given, else 90% of the device's
// memory minus the weights' share. Throws blend::Error when the weights do not fit.
double simulated_kv_memory_bytes(const Hardware& hardware, const ModelShape& shape,
                                 double kv_memory_gb);

}  // namespace blend::cli
