// Hardware the cost model reasons about (DESIGN.md §3): peak dense FP16/BF16 compute, memory
// bandwidth, interconnect bandwidth and memory size of one accelerator. Presets carry the
// datasheet numbers of NanoFlow Table 1; a JSON profile file carries the same fields plus the
// coefficients a measurement fit (`blend profile`, later) found for the local machine.
#pragma once

#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace blend {

struct Hardware {
  std::string name;
  double compute_flops = 0;      // dense FP16/BF16 FLOP/s of one device
  double memory_bandwidth = 0;   // bytes/s of device memory
  double network_bandwidth = 0;  // bytes/s of the device interconnect (NVLink), for TP
  double memory_bytes = 0;       // device memory size
  // bytes/s between host and device memory (PCIe), what KV swaps and BROS checkpoints move at;
  // 0 = unknown (swaps are then free in the simulator). The GPU presets assume 25 GB/s (A100,
  // PCIe 4.0 x16: 32 nominal) and 50 GB/s (H100 / H200, PCIe 5.0 x16: 64 nominal): assumed from
  // the link's datasheet rate, not measured.
  double host_bandwidth = 0;

  // Fitted coefficients (1, 1, 0 = the datasheet taken at its word). The achieved rate is the
  // peak times the efficiency; every step pays `step_overhead_seconds` on top.
  double compute_efficiency = 1.0;
  // Prefill attention (its 4 pairs H L FLOPs) runs at compute x compute_efficiency x this: on a
  // CPU it reaches about half the GEMMs' rate (measured by `blend profile`; docs/BENCHMARKS.md).
  double attention_efficiency = 1.0;
  double bandwidth_efficiency = 1.0;
  double step_overhead_seconds = 0.0;
  // Host work per sampled row outside the forward pass (sampling over the vocabulary,
  // detokenizing): what a CPU engine pays per logit row; 0 for the GPU presets.
  double per_logit_row_seconds = 0.0;
  // GEMM-attention interference when the two overlap (NanoFlow §4.3, BlendServe §6.2's
  // "practical" optimum): an overlapped step takes max(parts) + interference x (the rest).
  // 0 = perfect overlap. a100-* assume 0.15; h100 and h200 carry measured figures (hardware.cc).
  double overlap_interference = 0.0;
  // A GPU's step form (fitted by `blend profile` where the information criterion prefers it to
  // the sum; off in every preset): a dense GEMM reads its weights while it computes, so the layers
  // cost max(GEMM FLOPs / compute, weight bytes / bandwidth), not their sum; decode attention reads
  // the KV at `kv_bandwidth` (0: the memory bandwidth) and pays `per_decode_seconds` per
  // sequence (its blocks' fixed cost).
  bool gemm_roofline = false;
  double kv_bandwidth = 0.0;
  double per_decode_seconds = 0.0;
  // Steps whose rows are all device draws (argmax or temperature, with or without cuts and
  // logprobs) are drawn on the device (the cuda backend's forward_draw): no logits leave it and
  // per_logit_row_seconds is not paid. The JSON name is older than the temperature draws.
  bool device_argmax = false;
  // NanoFlow §4.2: a GEMM of more rows than a tile computes them in whole tiles, so a step that
  // is not a multiple of the tile pays for the whole last one (CUTLASS loses 7% at 2,049 rows
  // against 2,048; the cpu backend pads rows to 16, too little to see beside its noise,
  // docs/BENCHMARKS.md). Fewer rows than a tile run as a smaller one, as the libraries pick it.
  // The cost model charges the dense layers and the lm_head for rows n as n up to the tile and
  // n rounded up to whole tiles past it; 1 = no tile seen. `blend profile` fits it
  // (harness/profile.h); discrete batching's fast sizes are its multiples
  // (`--dense-batch-sizes PROFILE`).
  int64_t dense_row_tile = 1;

  // The GEMM rows `rows` are charged as under dense_row_tile.
  double rows_charged(double rows) const {
    const auto tile = static_cast<double>(dense_row_tile);
    return rows <= tile ? rows : std::ceil(rows / tile) * tile;
  }
  double effective_compute() const { return compute_flops * compute_efficiency; }
  double effective_bandwidth() const { return memory_bandwidth * bandwidth_efficiency; }

  // Throws blend::Error naming the field that is not positive.
  void validate() const;

  // {"name", "compute_tflops", "memory_bandwidth_gb_s", "network_bandwidth_gb_s",
  //  "memory_gb", optional "host_bandwidth_gb_s", optional "fit": {"compute_efficiency",
  //  "attention_efficiency", "bandwidth_efficiency", "step_overhead_seconds",
  //  "per_logit_row_seconds", "overlap_interference", optional "gemm_roofline",
  //  "kv_bandwidth_gb_s", "per_decode_seconds", "device_argmax", "dense_row_tile"}} with
  //  GB = 1e9 bytes.
  static Hardware from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

// a100-80g, a100-40g, h100, h200 (NanoFlow Table 1); h100 and h200 with a measured fit.
std::optional<Hardware> find_hardware_preset(std::string_view name);
std::vector<std::string> hardware_preset_names();

// A preset name, or else a path to a JSON profile. Throws blend::Error when it is neither.
Hardware resolve_hardware(const std::string& name_or_file);

// What the planner assumes about the machine without a profile (`blend batch` without
// --hardware, `blend serve` without --profile): a 2-core CPU of the kind we develop on (its
// measured bf16 GEMM rate and a modest DRAM bandwidth).
Hardware default_cpu_hardware();

}  // namespace blend
