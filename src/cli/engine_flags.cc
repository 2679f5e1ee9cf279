#include "cli/engine_flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/registry.h"
#ifdef BLEND_HAVE_CUDA
#include "backend/cuda/knobs.h"
#endif
#include "core/error.h"
#include "gguf/import.h"

namespace blend::cli {

namespace {

// Accepts a finite number in [lo, hi] (an integer when `integer`); the error names the flag
// (CLI11 prefixes it) and says what the value should be.
CLI::Validator number_in(double lo, double hi, bool integer, const std::string& meaning) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        // Checked on the text: NaN passes every comparison, and "1e999" converts to infinity.
        double v = 0;
        size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool ok = used == text.size() && std::isfinite(v) && v >= lo && v <= hi &&
                        (!integer || v == std::floor(v));
        if (ok) return "";
        std::ostringstream msg;
        msg << "'" << text << "' is not " << meaning;
        return msg.str();
      },
      integer ? "INT" : "NUMBER");
}

}  // namespace

void set_dense_batch_sizes(const std::string& value, SchedulerOptions& scheduler) {
  scheduler.dense_batch_sizes.clear();
  scheduler.dense_batch_tile = 0;
  const std::vector<std::string> items = split_list(value);
  auto token_count = [](const std::string& item) -> std::optional<int32_t> {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (used != item.size() || v < 1 || v > std::numeric_limits<int32_t>::max())
      return std::nullopt;
    return static_cast<int32_t>(v);
  };
  bool all_counts = !items.empty();
  for (const std::string& item : items) all_counts = all_counts && token_count(item).has_value();
  if (all_counts) {
    for (const std::string& item : items) scheduler.dense_batch_sizes.push_back(*token_count(item));
    std::sort(scheduler.dense_batch_sizes.begin(), scheduler.dense_batch_sizes.end());
    return;
  }
  if (items.size() != 1 || !std::filesystem::is_regular_file(value))
    throw Error("--dense-batch-sizes: '" + value +
                "' is neither a list of token counts of at least 1 (e.g. 1024,2048) nor a "
                "readable `blend profile` file");
  Hardware profile;
  try {
    profile = resolve_hardware(value);
  } catch (const Error& e) {
    throw Error(std::string("--dense-batch-sizes: ") + e.what());
  }
  if (profile.dense_row_tile > 1) {
    scheduler.dense_batch_tile = static_cast<int32_t>(profile.dense_row_tile);
  } else {
    std::fprintf(stderr,
                 "blend: --dense-batch-sizes: %s saw no GEMM row tile (every step size is as "
                 "fast), so no step is cut\n",
                 value.c_str());
  }
}

void add_dense_batch_sizes_flag(CLI::App* cmd, SchedulerOptions& scheduler) {
  cmd->add_option_function<std::string>(
      "--dense-batch-sizes",
      [&scheduler](const std::string& v) { set_dense_batch_sizes(v, scheduler); },
      "NanoFlow's discrete batching: step sizes in tokens the GEMMs run fastest at (e.g. "
      "1024,2048,4096), or a `blend profile` file (the multiples of the GEMM row tile it "
      "measured); a step whose work fills one is cut to the largest under --max-batch-tokens, "
      "keeping every decode (default: any size)");
}

void add_adaptive_flags(CLI::App* cmd, AdaptiveFlags& flags, EngineOptions& options) {
  cmd->add_option("--adaptive-blocks", flags.blocks,
                  "BlockLLM adaptive serving: a `blend zoo analyze --out` file; requests that "
                  "allow it run through the equivalent blocks it lists (request field "
                  "\"adaptive_blocks\": true)");
  cmd->add_option("--adaptive-threshold", flags.threshold,
                  "Similarity a block needs to stand in for another (default: the file's)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option_function<std::string>(
         "--adaptive-serving",
         [&options](const std::string& v) { options.adaptive_by_default = v == "all"; },
         "Which requests allow adaptive serving: those that say so (request, the default) or "
         "all that do not refuse it")
      ->check(CLI::IsMember({"request", "all"}));
}

void check_adaptive_flags(const AdaptiveFlags& flags, const EngineOptions& options) {
  if (flags.blocks.empty() && (flags.threshold != 0 || options.adaptive_by_default))
    throw Error("--adaptive-threshold and --adaptive-serving need --adaptive-blocks FILE");
}

void add_cuda_knob_flags([[maybe_unused]] CLI::App* cmd,
                         [[maybe_unused]] std::map<std::string, std::string>& knobs) {
#ifdef BLEND_HAVE_CUDA
  for (const cuda::KnobSpec& spec : cuda::knob_specs()) {
    const std::string name = spec.name;
    cmd->add_option_function<std::string>(
           "--cuda-" + name, [&knobs, name](const std::string& v) { knobs[name] = v; },
           std::string(spec.help) + " (" + spec.values + "; variable " + cuda::knob_env_var(name) +
               " where the flag is not given)")
        ->group("CUDA backend (--backend cuda)");
  }
#endif
}

CLI::Validator model_source_transform() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
          value = resolve_model_source(value, threads).string();
          return "";
        } catch (const std::exception& e) {
          return e.what();
        }
      },
      "", "GGUF import");
}

void add_engine_flags(CLI::App* cmd, EngineOptions& o) {
  // Nonsense values are refused here, naming the flag: `--max-batch-tokens 0` used to end in
  // "internal: the scheduler ... scheduled nothing" (issue 26).
  const double int_max = std::numeric_limits<int32_t>::max();
  std::vector<std::string> kinds;  // the real backends of this build (sim is simulate's)
  for (const std::string& k : backend_kinds())
    if (k != "sim") kinds.push_back(k);
  std::string list;
  for (const std::string& k : kinds) list += (list.empty() ? "" : ", ") + k;
  cmd->add_option("--backend", o.backend,
                  "Backend that computes the model (this build: " + list + ")")
      ->check(CLI::IsMember(kinds))
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", o.scheduler.max_batch_tokens,
                  "Token budget of one step (prefill chunks + decodes)")
      ->check(number_in(1, int_max, true, "a token count of at least 1"));
  add_dense_batch_sizes_flag(cmd, o.scheduler);
  cmd->add_option("--max-running", o.scheduler.max_running, "Most sequences decoding at once")
      ->check(number_in(1, int_max, true, "a sequence count of at least 1"));
  // vLLM's names for the same two knobs, so that its command lines run unchanged.
  cmd->add_option("--max-num-batched-tokens", o.scheduler.max_batch_tokens,
                  "vLLM's name for --max-batch-tokens")
      ->check(number_in(1, int_max, true, "a token count of at least 1"));
  cmd->add_option("--max-num-seqs", o.scheduler.max_running, "vLLM's name for --max-running")
      ->check(number_in(1, int_max, true, "a sequence count of at least 1"));
  cmd->add_option_function<std::string>(
      "--gpu-memory-utilization",
      [](const std::string&) {
        throw CLI::ValidationError("--gpu-memory-utilization",
                                   "blend sizes the KV cache in GB, not as a share of device "
                                   "memory: use --kv-memory GB");
      },
      "Refused: blend's KV cache is sized with --kv-memory GB");
  cmd->add_option("--kv-memory", o.kv_memory_gb,
                  "KV cache size in GB (fractions allowed); default: a share of free memory")
      ->check(
          number_in(0, 1e6, false, "a size in GB, 0 (default: a share of free memory) or more"));
  cmd->add_option("--page-size", o.page_size, "Tokens per KV page")
      ->check(number_in(1, 1 << 20, true, "a page size of 1 to 1048576 tokens"));
  cmd->add_option("--threads", o.threads,
                  "Compute threads (default 0: the cores this process may use, its cgroup's CPU "
                  "quota included, less those other processes keep busy, measured every 0.1 s; "
                  "a number fixes it)")
      ->check(number_in(0, 65536, true, "a thread count, 0 (blend chooses) or more"));
  cmd->add_flag("--deterministic", o.deterministic,
                "Same seed, same tokens, whatever the batch or order");
  cmd->add_option("--overlap-schedule", o.overlap,
                  "Plan the next step while this one computes (NanoFlow's asynchronous "
                  "scheduling): on|off (default off)");
  cmd->add_option("--seed", o.seed, "Seed for requests without one");
  cmd->add_option("--prefix-cache", o.prefix_cache,
                  "Reuse cached prompt prefixes: on|off (default on)");
  cmd->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", o.prefix_cache,
                "vLLM's names for --prefix-cache on|off");
  cmd->add_option("--kv-host-memory", o.kv_host_memory_gb,
                  "GB of host memory for cached KV evicted from the KV cache (default 0: none)")
      ->check(number_in(0, 1e6, false, "a size in GB, 0 (none) or more"));
  cmd->add_option("--kv-disk", o.kv_disk_dir,
                  "Directory for cached KV evicted from host memory (default: none)");
  cmd->add_option("--kv-disk-size", o.kv_disk_gb, "Cap of --kv-disk in GB (default 10)")
      ->check(number_in(1e-9, 1e9, false, "a size in GB above 0"));
  const std::map<std::string, Tenancy> tenancies = {{"blocks", Tenancy::kBlocks},
                                                    {"ps", Tenancy::kParameterSharing},
                                                    {"per-model", Tenancy::kPerModel}};
  cmd->add_option("--tenancy", o.tenancy,
                  "With several models, what they share (BlockLLM's deployments): blocks "
                  "(identical blocks once, the default), ps (a LoRA adapter its base, nothing "
                  "else), per-model (nothing)")
      ->transform(CLI::CheckedTransformer(tenancies, CLI::ignore_case));
  add_cuda_knob_flags(cmd, o.cuda_knobs);
}

void add_hybrid_flags(CLI::App* cmd, HybridOptions& h) {
  cmd->add_option("--hybrid-initial-batch", h.initial_batch,
                  "--scheduler hybrid: start (and floor) of the adaptive batch size, in requests; "
                  "it grows by --hybrid-batch-step after each iteration with no real-time "
                  "request at risk, up to --max-running, and halves on a predicted miss")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--hybrid-batch-step", h.batch_step,
                  "--scheduler hybrid: growth of the batch size per calm iteration")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--hybrid-overdue-after", h.overdue_after_slos,
                  "--scheduler hybrid: a prompt that missed its TTFT target runs first once it is "
                  "this many targets late, bounding waits under sustained overload (default 0: "
                  "it yields to on-time requests for ever, BROS's order)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  using Preempt = HybridOptions::PreemptBePages;
  const std::map<std::string, Preempt> preempt = {
      {"auto", Preempt::kAuto}, {"on", Preempt::kOn}, {"off", Preempt::kOff}};
  cmd->add_flag("--hybrid-preempt-be-pages{on}", h.preempt_be_pages,
                "--scheduler hybrid: whether the pages of running best-effort sequences count as "
                "room for a real-time request, which then shares one (bidirectional KV) or "
                "drops its holder (Alg. 1 as BROS publishes it): auto (the default) when a "
                "dropped sequence's KV swaps out to --kv-host-memory / --kv-disk, on (the flag "
                "alone), off")
      ->transform(CLI::CheckedTransformer(preempt, CLI::ignore_case));
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
  m.swap_base = j.value("swap_base", 0.0);  // absent from profiles made before it was fitted
  m.swap_per_page = j.value("swap_per_page", 0.0);
  return m;
}

const std::map<std::string, SchedulerPolicy>& scheduler_policy_names() {
  static const std::map<std::string, SchedulerPolicy> kNames = {
      {"hybrid", SchedulerPolicy::kHybrid},
      {"fcfs", SchedulerPolicy::kFcfs},
      {"round-robin", SchedulerPolicy::kRoundRobin},
      {"prefill-first", SchedulerPolicy::kPrefillFirst}};
  return kNames;
}

std::string scheduler_policy_list() {
  std::string list;
  for (const auto& [name, policy] : scheduler_policy_names())
    list += (list.empty() ? "" : ", ") + name;
  return list;
}

SchedulerPolicy parse_scheduler_policy(const std::string& name) {
  const auto& names = scheduler_policy_names();
  const auto it = names.find(name);
  if (it == names.end())
    throw Error("unknown scheduler '" + name + "' (" + scheduler_policy_list() + ")");
  return it->second;
}

void refuse_policy_flag(CLI::App* cmd, const std::string& also) {
  const std::string command = cmd->get_name();
  cmd->add_option_function<std::string>(
         "--policy",
         [command, also](const std::string& value) {
           throw Error("--policy " + value + ": " + command + " picks its scheduler with " +
                       "--scheduler (" + scheduler_policy_list() + ")" + also +
                       "; --policy is a plan order, on blend batch, plan and simulate");
         })
      ->group("");  // hidden from --help
}

bool bidirectional_kv_for(const std::string& layout, SchedulerPolicy policy) {
  return layout == "bidirectional" || (layout == "auto" && policy == SchedulerPolicy::kHybrid);
}

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string e; std::getline(in, e, ',');)
    if (!e.empty()) out.push_back(e);
  return out;
}

double simulated_kv_memory_bytes(const Hardware& hardware, const ModelShape& shape,
                                 double kv_memory_gb) {
  const double bytes = kv_memory_gb > 0
                           ? kv_memory_gb * 1e9
                           : 0.9 * hardware.memory_bytes -
                                 static_cast<double>(shape.weight_bytes) / shape.tensor_parallel;
  if (bytes <= 0) throw Error("the model's weights do not fit; raise --tp or set --kv-memory");
  return bytes;
}

}  // namespace blend::cli
