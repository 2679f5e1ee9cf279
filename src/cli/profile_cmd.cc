// `blend profile --model DIR --out FILE [--backend cpu|cuda]`: times this machine's forward
// passes through a backend and writes a hardware profile (the cost model's fit, DESIGN.md §3) that
// `--hardware FILE` accepts wherever a preset name is, with BROS's iteration model and the
// validation table (estimated vs measured step time) beside it. With `--steps FILE...` (step
// timings of real `blend batch` runs) the hardware it writes is fitted on the engine's own steps
// instead; `--refit PROFILE --steps FILE...` does that fit without timing anything, taking what
// is measured apart (sampling, swaps, the iteration model) from a profile written earlier.
// `--backend cuda --nano FILE` (with or without --out) writes NanoFlow §5.5's phase profile,
// with which --cuda-nano-profile plans pipelined steps (backend/cuda/nano_search.h).
// The profile scans step sizes for the GEMMs' row tile (NanoFlow §4.2) unless --no-dense-scan;
// `--dense-batch-sizes PROFILE` on batch, serve and simulate cuts steps to its multiples.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#ifdef BLEND_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "cli/commands.h"
#include "cli/engine_flags.h"
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
  bool dense_scan = true;  // time the step sizes that show the GEMMs' row tile
  bool deterministic = false;
  std::vector<std::string> step_timings;  // `blend batch --step-timings` files to fit on
  std::string refit;                      // a profile to refit on step_timings, timing nothing
  std::string nano;  // cuda: NanoFlow §5.5's phase profile to write (--cuda-nano-profile's)
  std::map<std::string, std::string> cuda_knobs;  // --cuda-NAME (backend/cuda/knobs.h)
};

void print_steps_fit(const HardwareFit& fit) {
  const Hardware& h = fit.hardware;
  std::printf(
      "fit on the engine's steps (%s form): %.1f GFLOP/s (prefill attention %.1f), %.1f GB/s "
      "(KV %.1f), %.2f ms per step, %.1f us per decode, GEMM row tile %lld; error mean %.1f%%, "
      "max %.1f%%, total %+.2f%%\n",
      h.gemm_roofline ? "roofline" : "sum", h.compute_flops / 1e9,
      h.compute_flops * h.attention_efficiency / 1e9, h.memory_bandwidth / 1e9,
      (h.kv_bandwidth > 0 ? h.kv_bandwidth : h.memory_bandwidth) / 1e9,
      h.step_overhead_seconds * 1e3, h.per_decode_seconds * 1e6,
      static_cast<long long>(h.dense_row_tile), fit.mean_abs_error * 100, fit.max_abs_error * 100,
      fit.total_error * 100);
}

nlohmann::json steps_fit_json(const std::vector<std::string>& files, const HardwareFit& fit) {
  return {{"files", files},
          {"mean_abs_error", fit.mean_abs_error},
          {"max_abs_error", fit.max_abs_error},
          {"total_error", fit.total_error}};
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw Error("cannot write " + path);
}

// --refit: the earlier profile's measured parts kept, its hardware refitted on the steps.
void refit_profile(const ProfileArgs& args, const std::vector<MeasuredStep>& steps) {
  if (steps.empty()) throw Error("--refit needs --steps (the step timings to fit on)");
  std::ifstream in(args.refit);
  if (!in) throw Error("cannot read profile " + args.refit);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error("profile " + args.refit + ": " + e.what());
  }
  const Hardware earlier = Hardware::from_json(j);
  const ModelConfig config = ModelConfig::from_dir(args.model);
  const ModelShape shape =
      ModelShape::from_config(config, std::filesystem::path(args.model).filename().string());
  HardwareFit fit = fit_hardware(shape, steps, earlier.per_logit_row_seconds, earlier.device_argmax,
                                 earlier.dense_row_tile);
  fit.hardware.name = earlier.name + ":steps";
  fit.hardware.memory_bytes = earlier.memory_bytes;
  fit.hardware.host_bandwidth = earlier.host_bandwidth;
  if (!j.contains("isolated_fit")) j["isolated_fit"] = earlier.to_json();
  const nlohmann::json keep = std::move(j);
  j = fit.hardware.to_json();
  for (const char* key : {"model", "threads", "iteration", "validation", "isolated_fit"})
    if (keep.contains(key)) j[key] = keep[key];
  j["steps_fit"] = steps_fit_json(args.step_timings, fit);
  print_steps_fit(fit);
  write_json(args.out, j);
}

// The cost model's hardware profile (--out) of the backend's forward passes.
void write_hardware_profile(const ProfileArgs& args, Backend& backend, const ModelConfig& config,
                            const ProfileOptions& po, const std::vector<MeasuredStep>& steps) {
  const ModelShape shape =
      ModelShape::from_config(config, std::filesystem::path(args.model).filename().string());
  const BackendProfile p = profile_backend(backend, shape, po);

  // With step timings the hardware written is the fit on the engine's own steps (what the
  // simulator must reproduce); the isolated forward passes' fit is kept beside it.
  std::optional<HardwareFit> steps_fit;
  if (!args.step_timings.empty()) {
    steps_fit = fit_hardware(shape, steps, p.hardware.per_logit_row_seconds,
                             p.hardware.device_argmax, p.hardware.dense_row_tile);
    steps_fit->hardware.name = "profile:" + backend.name() + ":steps";
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
      "fit (%s form): %.1f GFLOP/s (prefill attention %.1f), %.1f GB/s, %.2f ms per step; "
      "error mean %.1f%%, max %.1f%%\n",
      p.hardware.gemm_roofline ? "roofline" : "sum", p.hardware.compute_flops / 1e9,
      p.hardware.compute_flops * p.hardware.attention_efficiency / 1e9,
      p.hardware.memory_bandwidth / 1e9, p.hardware.step_overhead_seconds * 1e3,
      p.mean_abs_error * 100, p.max_abs_error * 100);
  // NanoFlow §4.2: the step sizes `--dense-batch-sizes PROFILE` takes.
  if (po.dense_scan_anchors.empty())
    std::printf("GEMM row tile: not scanned (--no-dense-scan); the profile says none\n");
  else if (p.hardware.dense_row_tile > 1)
    std::printf("GEMM row tile: %lld (the fast step sizes are its multiples)\n",
                static_cast<long long>(p.hardware.dense_row_tile));
  else
    std::printf("GEMM row tile: none seen (every step size is as fast)\n");
  if (steps_fit) {
    print_steps_fit(*steps_fit);
    j["isolated_fit"] = p.hardware.to_json();
    j["isolated_fit"]["memory_gb"] = j["memory_gb"];
    j["steps_fit"] = steps_fit_json(args.step_timings, *steps_fit);
  }
  write_json(args.out, j);
}

void run_profile(const ProfileArgs& args) {
  std::vector<MeasuredStep> steps;  // read first: a bad file fails before minutes of timing
  for (const std::string& path : args.step_timings) {
    const std::vector<MeasuredStep> more = read_step_timings(path);
    // A run's first step carries the backend's one-time start-up (cuBLAS's first calls: 0.17 s
    // against 35 ms steps on an H100), which would pull a least-squares fit far off.
    steps.insert(steps.end(), more.begin() + (more.size() > 1 ? 1 : 0), more.end());
  }
  if (!args.refit.empty()) return refit_profile(args, steps);
  const ModelConfig config = ModelConfig::from_dir(args.model);
  const TensorStore weights = TensorStore::open_dir(args.model);
  check_tensors(config, weights, QuantizedWeights::kAllowMatrices);
  ProfileOptions po;
  po.reps = args.reps;
  if (!args.dense_scan) po.dense_scan_anchors.clear();
  BackendOptions bo;
  bo.threads = args.threads;
  bo.deterministic = args.deterministic;
  bo.page_size = static_cast<int>(po.page_size);
  bo.cuda_knobs = args.cuda_knobs;
  auto backend =
      make_backend(args.backend, {.config = &config, .weights = &weights, .options = bo});
  int64_t pages = args.out.empty() ? 0 : po.max_kv_tokens / po.page_size + 256;
#ifdef BLEND_HAVE_CUDA
  // The nano-batch profile's attention wants up to 1,024 sequences of its own pages: as many
  // of them as the GPU's KV memory holds.
  if (!args.nano.empty()) {
    const int64_t most = cuda::NanoGrid{}.pages_needed(bo.page_size);  // every size
    pages = std::max(pages, std::min(most, backend->kv_memory_budget() /
                                               std::max<int64_t>(1, backend->kv_bytes_per_page())));
  }
#endif
  backend->allocate_kv(pages);
  if (!args.out.empty()) write_hardware_profile(args, *backend, config, po, steps);
#ifdef BLEND_HAVE_CUDA
  if (!args.nano.empty()) {
    const cuda::NanoProfile nano = measure_nano_profile(*backend, std::max(args.reps, 5));
    write_json(args.nano, cuda::nano_profile_to_json(nano));
    std::printf(
        "nano-batch profile: %zu GEMM and %zu attention SM counts (steps of %d of %d), "
        "written to %s\n",
        nano.gemm.sms.size(), nano.attention.sms.size(), nano.sm_step, nano.total_sms,
        args.nano.c_str());
  }
#endif
}

}  // namespace

void register_profile_command(CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Time this machine's forward passes and write a cost-model hardware profile");
  cmd->add_option("--model", args->model, "Model folder or GGUF file")
      ->transform(model_source_transform())
      ->required();
  cmd->add_option("--out", args->out, "Profile JSON to write (required unless --nano)");
  std::vector<std::string> kinds;  // the real backends of this build
  for (const std::string& k : backend_kinds())
    if (k != "sim") kinds.push_back(k);
  cmd->add_option("--backend", args->backend, "Backend to time (cpu, or cuda where built)")
      ->check(CLI::IsMember(kinds))
      ->capture_default_str();
  add_cuda_knob_flags(cmd, args->cuda_knobs);
  cmd->add_option("--threads", args->threads, "Compute threads (default: all)");
  cmd->add_option("--reps", args->reps, "Timed repetitions per step (median)");
  cmd->add_flag("--deterministic", args->deterministic, "Profile the deterministic kernels");
  cmd->add_flag("!--no-dense-scan", args->dense_scan,
                "Skip the scan of step sizes that finds the GEMMs' row tile (NanoFlow's "
                "discrete batching; about as long again as the rest of a CPU profile, cheap on a "
                "GPU); the profile then says no tile");
  cmd->add_option("--steps", args->step_timings,
                  "Step timings of real runs (`blend batch --step-timings`): fit the written "
                  "hardware on those steps instead of on the isolated forward passes")
      ->delimiter(',')
      ->check(CLI::ExistingFile);
  cmd->add_option("--refit", args->refit,
                  "A profile written earlier: refit its hardware on --steps without timing "
                  "anything (no backend runs; --model gives the shape)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--nano", args->nano,
                  "cuda: also time one layer's GEMM phase and attention at each SM split green "
                  "contexts allow and write NanoFlow's autosearch profile here (for "
                  "--cuda-nano-profile)");
  cmd->callback([args] {
    if (args->out.empty() && args->nano.empty())
      throw Error("profile: --out is required (the cost model's profile to write), or --nano");
    if (!args->nano.empty() && (args->backend != "cuda" || !args->refit.empty()))
      throw Error("--nano times the cuda backend's phases: it needs --backend cuda, not --refit");
    run_profile(*args);
  });
}

}  // namespace blend::cli
