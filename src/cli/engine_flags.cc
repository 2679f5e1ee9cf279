#include "cli/engine_flags.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend::cli {

void add_engine_flags(CLI::App* cmd, EngineOptions& o) {
  cmd->add_option("--max-batch-tokens", o.scheduler.max_batch_tokens,
                  "Token budget of one step (prefill chunks + decodes)");
  cmd->add_option("--max-running", o.scheduler.max_running, "Most sequences decoding at once");
  cmd->add_option("--kv-memory", o.kv_memory_gb,
                  "KV cache size in GB (fractions allowed); default: a share of free memory");
  cmd->add_option("--page-size", o.page_size, "Tokens per KV page");
  cmd->add_option("--threads", o.threads, "Compute threads (default: all)");
  cmd->add_flag("--deterministic", o.deterministic,
                "Same seed, same tokens, whatever the batch or order");
  cmd->add_option("--seed", o.seed, "Seed for requests without one");
  cmd->add_option("--prefix-cache", o.prefix_cache,
                  "Reuse cached prompt prefixes: on|off (default on)");
  cmd->add_option("--kv-host-memory", o.kv_host_memory_gb,
                  "GB of host memory for cached KV evicted from the KV cache (default 0: none)");
  cmd->add_option("--kv-disk", o.kv_disk_dir,
                  "Directory for cached KV evicted from host memory (default: none)");
  cmd->add_option("--kv-disk-size", o.kv_disk_gb, "Cap of --kv-disk in GB (default 10)");
}

IterationCostModel read_iteration_model(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read --profile " + path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in).at("iteration");
  } catch (const std::exception& e) {
    throw Error("--profile " + path + " has no iteration model: " + e.what());
  }
  IterationCostModel m;
  m.prefill_base = j.value("prefill_base", 0.0);
  m.prefill_per_token = j.value("prefill_per_token", 0.0);
  m.decode_base = j.value("decode_base", 0.0);
  m.decode_per_token = j.value("decode_per_token", 0.0);
  m.decode_per_context_token = j.value("decode_per_context_token", 0.0);
  return m;
}

}  // namespace blend::cli
