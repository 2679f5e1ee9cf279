#include "cost/hardware.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend {
namespace {

constexpr double kGiga = 1e9;
constexpr double kTera = 1e12;

// A100: assumed, not measured (no A100 is lent to us). With NanoFlow's execution-unit
// scheduling a GEMM and a concurrent attention kernel each keep most of their speed; 0.15 makes
// the shorter part cost 15% of its own time on top of the longer one, and with it the simulated
// NanoFlow-DFS / vLLM-DFS ratio is about the paper's (docs/BENCHMARKS.md). Override with
// `blend simulate --interference` or a profile's fit.overlap_interference.
constexpr double kAssumedA100Interference = 0.15;

// H100 and H200: measured (bench/gpu_interference.sh; docs/BENCHMARKS.md, "GEMM-attention
// interference on H100 and H200"). A Llama-3-8B layer's GEMMs through cuBLASLt at 1024-2048
// tokens reach this fraction of the datasheet FLOP/s, a streaming read of the KV cache this
// fraction of its bandwidth, and the two overlapped on split SMs this interference (the median
// over memory/compute ratios 0.25-4). The read has almost no arithmetic. Of our real attention
// kernels, the CUDA-core one measured about 1.0 (no overlap) and the tensor-core one 0.75 on the
// H100 (one run), within the read's spread between runs; so these are what the kernels we have
// show, not a bound.
struct MeasuredFit {
  double compute_efficiency;
  double bandwidth_efficiency;
  double overlap_interference;
};
constexpr MeasuredFit kH100Measured{0.79, 0.92, 0.71};
constexpr MeasuredFit kH200Measured{0.78, 0.82, 0.81};

Hardware preset(std::string name, double tflops, double mem_bw_gb_s, double net_bw_gb_s,
                double memory_gb) {
  Hardware h;
  h.name = std::move(name);
  h.compute_flops = tflops * kTera;
  h.memory_bandwidth = mem_bw_gb_s * kGiga;
  h.network_bandwidth = net_bw_gb_s * kGiga;
  h.memory_bytes = memory_gb * kGiga;
  h.overlap_interference = kAssumedA100Interference;
  return h;
}

Hardware measured_preset(Hardware h, const MeasuredFit& fit) {
  h.compute_efficiency = fit.compute_efficiency;
  h.bandwidth_efficiency = fit.bandwidth_efficiency;
  h.overlap_interference = fit.overlap_interference;
  return h;
}

double required(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number())
    throw Error(std::string("hardware profile: \"") + key + "\" must be a number");
  return j[key].get<double>();
}

}  // namespace

void Hardware::validate() const {
  auto positive = [](double v, const char* what) {
    if (!(v > 0)) throw Error(std::string("hardware profile: ") + what + " must be positive");
  };
  positive(compute_flops, "compute_tflops");
  positive(memory_bandwidth, "memory_bandwidth_gb_s");
  positive(network_bandwidth, "network_bandwidth_gb_s");
  positive(memory_bytes, "memory_gb");
  if (!(host_bandwidth >= 0)) throw Error("hardware profile: host_bandwidth_gb_s must be >= 0");
  positive(compute_efficiency, "fit.compute_efficiency");
  positive(attention_efficiency, "fit.attention_efficiency");
  positive(bandwidth_efficiency, "fit.bandwidth_efficiency");
  if (step_overhead_seconds < 0) throw Error("hardware profile: fit.step_overhead_seconds < 0");
  if (per_logit_row_seconds < 0) throw Error("hardware profile: fit.per_logit_row_seconds < 0");
  if (!(overlap_interference >= 0 && overlap_interference <= 1))
    throw Error("hardware profile: fit.overlap_interference must lie in [0, 1]");
  if (!(kv_bandwidth >= 0)) throw Error("hardware profile: fit.kv_bandwidth_gb_s must be >= 0");
  if (!(per_decode_seconds >= 0))
    throw Error("hardware profile: fit.per_decode_seconds must be >= 0");
  if (dense_row_tile < 1 || dense_row_tile > (int64_t{1} << 20))
    throw Error("hardware profile: fit.dense_row_tile must be a row count of 1 to 1048576");
}

Hardware Hardware::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw Error("hardware profile: expected a JSON object");
  Hardware h;
  h.name = j.value("name", std::string("custom"));
  h.compute_flops = required(j, "compute_tflops") * kTera;
  h.memory_bandwidth = required(j, "memory_bandwidth_gb_s") * kGiga;
  h.network_bandwidth = required(j, "network_bandwidth_gb_s") * kGiga;
  h.memory_bytes = required(j, "memory_gb") * kGiga;
  if (j.contains("host_bandwidth_gb_s"))
    h.host_bandwidth = required(j, "host_bandwidth_gb_s") * kGiga;
  if (j.contains("fit")) {
    const nlohmann::json& fit = j["fit"];
    if (!fit.is_object()) throw Error("hardware profile: \"fit\" must be an object");
    h.compute_efficiency = fit.value("compute_efficiency", 1.0);
    h.attention_efficiency = fit.value("attention_efficiency", 1.0);
    h.bandwidth_efficiency = fit.value("bandwidth_efficiency", 1.0);
    h.step_overhead_seconds = fit.value("step_overhead_seconds", 0.0);
    h.per_logit_row_seconds = fit.value("per_logit_row_seconds", 0.0);
    h.overlap_interference = fit.value("overlap_interference", 0.0);
    h.gemm_roofline = fit.value("gemm_roofline", false);
    h.kv_bandwidth = fit.value("kv_bandwidth_gb_s", 0.0) * kGiga;
    h.per_decode_seconds = fit.value("per_decode_seconds", 0.0);
    h.device_argmax = fit.value("device_argmax", false);
    if (fit.contains("dense_row_tile")) {
      if (!fit["dense_row_tile"].is_number_integer())
        throw Error("hardware profile: fit.dense_row_tile must be a whole number of rows");
      h.dense_row_tile = fit["dense_row_tile"].get<int64_t>();
    }
  }
  h.validate();
  return h;
}

nlohmann::json Hardware::to_json() const {
  return {{"name", name},
          {"compute_tflops", compute_flops / kTera},
          {"memory_bandwidth_gb_s", memory_bandwidth / kGiga},
          {"network_bandwidth_gb_s", network_bandwidth / kGiga},
          {"memory_gb", memory_bytes / kGiga},
          {"host_bandwidth_gb_s", host_bandwidth / kGiga},
          {"fit",
           {{"compute_efficiency", compute_efficiency},
            {"attention_efficiency", attention_efficiency},
            {"bandwidth_efficiency", bandwidth_efficiency},
            {"step_overhead_seconds", step_overhead_seconds},
            {"per_logit_row_seconds", per_logit_row_seconds},
            {"overlap_interference", overlap_interference},
            {"gemm_roofline", gemm_roofline},
            {"kv_bandwidth_gb_s", kv_bandwidth / kGiga},
            {"per_decode_seconds", per_decode_seconds},
            {"device_argmax", device_argmax},
            {"dense_row_tile", dense_row_tile}}}};
}

std::optional<Hardware> find_hardware_preset(std::string_view name) {
  // NanoFlow Table 1: NetBW, FP16 compute, MemBW; memory sizes from the datasheets.
  // Host links (Hardware::host_bandwidth): assumed, about 80% of PCIe's nominal rate.
  auto with_host = [](Hardware h, double gb_s) {
    h.host_bandwidth = gb_s * kGiga;
    return h;
  };
  if (name == "a100-80g") return with_host(preset("a100-80g", 312, 2000, 600, 80), 25);
  if (name == "a100-40g") return with_host(preset("a100-40g", 312, 1555, 600, 40), 25);
  if (name == "h100")
    return with_host(measured_preset(preset("h100", 989, 3352, 600, 80), kH100Measured), 50);
  if (name == "h200")
    return with_host(measured_preset(preset("h200", 989, 4800, 900, 141), kH200Measured), 50);
  return std::nullopt;
}

std::vector<std::string> hardware_preset_names() {
  return {"a100-80g", "a100-40g", "h100", "h200"};
}

Hardware resolve_hardware(const std::string& name_or_file) {
  if (auto h = find_hardware_preset(name_or_file)) return *h;
  std::ifstream in(name_or_file);
  if (!in) {
    std::string names;
    for (const std::string& n : hardware_preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("--hardware: \"" + name_or_file + "\" is neither a preset (" + names +
                ") nor a readable profile file");
  }
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error("hardware profile " + name_or_file + ": " + e.what());
  }
  return Hardware::from_json(j);
}

Hardware default_cpu_hardware() {
  Hardware h;
  h.name = "cpu-default";
  h.compute_flops = 0.8e12;
  h.memory_bandwidth = 20e9;
  h.network_bandwidth = 1e18;
  h.memory_bytes = 16e9;
  return h;
}

}  // namespace blend
