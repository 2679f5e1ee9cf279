// `blend profile --model DIR --out FILE [--backend cpu|cuda]`: times this machine's forward
// passes through a backend and writes a hardware profile (the cost model's fit, DESIGN.md §3) that
// `--hardware FILE` accepts wherever a preset name is, with BROS's iteration model and the
// validation table (estimated vs measured step time) beside it. With `--steps FILE...` (step
// timings of real `blend batch` runs) the hardware it writes is fitted on the engine's own steps
// instead.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#ifdef BLEND_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "cli/commands.h"
#include "core/error.h"
#include "harness/profile.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend::cli {
namespace {

struct ProfileArgs {
  std::string model;
  std::string backend = "cpu";
  std::string out;
  int threads = 0;
  int reps = 3;
  bool deterministic = false;
  std::vector<std::string> step_timings;  // `blend batch --step-timings` files to fit on
};

void run_profile(const ProfileArgs& args) {
  std::vector<MeasuredStep> steps;  // read first: a bad file fails before minutes of timing
  for (const std::string& path : args.step_timings) {
    const std::vector<MeasuredStep> more = read_step_timings(path);
    steps.insert(steps.end(), more.begin(), more.end());
  }
  const ModelConfig config = ModelConfig::from_dir(args.model);
  const TensorStore weights = TensorStore::open_dir(args.model);
  check_tensors(config, weights);
  ProfileOptions po;
  po.reps = args.reps;
  BackendOptions bo;
  bo.threads = args.threads;
  bo.deterministic = args.deterministic;
  bo.page_size = static_cast<int>(po.page_size);
  bo.num_pages = po.max_kv_tokens / po.page_size + 256;
  auto backend =
      make_backend(args.backend, {.config = &config, .weights = &weights, .options = bo});
  const ModelShape shape =
      ModelShape::from_config(config, std::filesystem::path(args.model).filename().string());
  const BackendProfile p = profile_backend(*backend, shape, po);

  // With step timings the hardware written is the fit on the engine's own steps (what the
  // simulator must reproduce); the isolated forward passes' fit is kept beside it.
  std::optional<HardwareFit> steps_fit;
  if (!args.step_timings.empty()) {
    steps_fit = fit_hardware(shape, steps, p.hardware.per_logit_row_seconds);
    steps_fit->hardware.name = "profile:" + backend->name() + ":steps";
    steps_fit->hardware.memory_bytes = p.hardware.memory_bytes;
  }
  const Hardware& written = steps_fit ? steps_fit->hardware : p.hardware;
  nlohmann::json j = written.to_json();
  // The memory the model and its KV cache live in: the host's, or the GPU's.
  j["memory_gb"] = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                   static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1e9;
#ifdef BLEND_HAVE_CUDA
  if (args.backend == "cuda")
    j["memory_gb"] = static_cast<double>(cuda_device_memory_bytes()) / 1e9;
#endif
  j["model"] = shape.name;
  j["threads"] = args.threads;
  j["iteration"] = {{"prefill_base", p.iteration.prefill_base},
                    {"prefill_per_token", p.iteration.prefill_per_token},
                    {"decode_base", p.iteration.decode_base},
                    {"decode_per_token", p.iteration.decode_per_token},
                    {"decode_per_context_token", p.iteration.decode_per_context_token},
                    {"swap_base", p.iteration.swap_base},
                    {"swap_per_page", p.iteration.swap_per_page}};
  nlohmann::json points = nlohmann::json::array();
  std::printf("%-8s %6s %7s %8s %12s %12s %8s\n", "kind", "seqs", "tokens", "context",
              "measured ms", "estimate ms", "error");
  for (const ProfilePoint& q : p.points) {
    const double err = (q.estimated_seconds - q.measured_seconds) / q.measured_seconds;
    std::printf("%-8s %6lld %7lld %8lld %12.2f %12.2f %7.1f%%\n", q.kind.c_str(),
                static_cast<long long>(q.sequences), static_cast<long long>(q.tokens),
                static_cast<long long>(q.context), q.measured_seconds * 1e3,
                q.estimated_seconds * 1e3, err * 100);
    points.push_back({{"kind", q.kind},
                      {"sequences", q.sequences},
                      {"tokens", q.tokens},
                      {"context", q.context},
                      {"measured_seconds", q.measured_seconds},
                      {"estimated_seconds", q.estimated_seconds}});
  }
  j["validation"] = {
      {"points", points}, {"mean_abs_error", p.mean_abs_error}, {"max_abs_error", p.max_abs_error}};
  std::printf(
      "fit: %.1f GFLOP/s (prefill attention %.1f), %.1f GB/s, %.2f ms per step; error mean "
      "%.1f%%, max %.1f%%\n",
      p.hardware.compute_flops / 1e9,
      p.hardware.compute_flops * p.hardware.attention_efficiency / 1e9,
      p.hardware.memory_bandwidth / 1e9, p.hardware.step_overhead_seconds * 1e3,
      p.mean_abs_error * 100, p.max_abs_error * 100);
  if (steps_fit) {
    const Hardware& h = steps_fit->hardware;
    std::printf(
        "fit on the engine's steps: %.1f GFLOP/s (prefill attention %.1f), %.1f GB/s, %.2f ms "
        "per step; error mean %.1f%%, max %.1f%%, total %+.2f%%\n",
        h.compute_flops / 1e9, h.compute_flops * h.attention_efficiency / 1e9,
        h.memory_bandwidth / 1e9, h.step_overhead_seconds * 1e3, steps_fit->mean_abs_error * 100,
        steps_fit->max_abs_error * 100, steps_fit->total_error * 100);
    j["isolated_fit"] = p.hardware.to_json();
    j["isolated_fit"]["memory_gb"] = j["memory_gb"];
    j["steps_fit"] = {{"files", args.step_timings},
                      {"mean_abs_error", steps_fit->mean_abs_error},
                      {"max_abs_error", steps_fit->max_abs_error},
                      {"total_error", steps_fit->total_error}};
  }
  std::ofstream out(args.out);
  out << j.dump(2) << "\n";
  if (!out) throw Error("cannot write " + args.out);
}

}  // namespace

void register_profile_command(CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Time this machine's forward passes and write a cost-model hardware profile");
  cmd->add_option("--model", args->model, "Model folder")->required();
  cmd->add_option("--out", args->out, "Profile JSON to write")->required();
  std::vector<std::string> kinds;  // the real backends of this build
  for (const std::string& k : backend_kinds())
    if (k != "sim") kinds.push_back(k);
  cmd->add_option("--backend", args->backend, "Backend to time (cpu, or cuda where built)")
      ->check(CLI::IsMember(kinds))
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Compute threads (default: all)");
  cmd->add_option("--reps", args->reps, "Timed repetitions per step (median)");
  cmd->add_flag("--deterministic", args->deterministic, "Profile the deterministic kernels");
  cmd->add_option("--steps", args->step_timings,
                  "Step timings of real runs (`blend batch --step-timings`): fit the written "
                  "hardware on those steps instead of on the isolated forward passes")
      ->delimiter(',')
      ->check(CLI::ExistingFile);
  cmd->callback([args] { run_profile(*args); });
}

}  // namespace blend::cli
