#include "backend/cuda/knobs.h"

#include <cstdlib>
#include <initializer_list>
#include <utility>

#include "core/error.h"

namespace blend::cuda {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string(fallback);
}

// A whole decimal number in [lo, hi], or nullopt.
std::optional<long> whole_number(const std::string& s, long lo, long hi) {
  char* end = nullptr;
  const long n = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || n < lo || n > hi) return std::nullopt;
  return n;
}

// The value of knob `name` among `options`, the first one its default; blend::Error naming the
// knob and what it takes for any other value.
template <typename T>
T choose(const char* name, std::initializer_list<std::pair<const char*, T>> options) {
  const std::string value = env_or(name, options.begin()->first);
  std::string expected;
  size_t i = 0;
  for (const auto& [key, result] : options) {
    if (value == key) return result;
    if (i > 0) expected += i + 1 == options.size() ? " or " : ", ";
    expected += key;
    ++i;
  }
  throw Error(std::string(name) + "=" + value + ": expected " + expected);
}

}  // namespace

Knobs read_knobs() {
  Knobs k;
  k.attention =
      choose<AttentionKernel>("BLEND_CUDA_ATTENTION", {{"default", AttentionKernel::kDefault},
                                                       {"pipelined3", AttentionKernel::kPipelined3},
                                                       {"warps", AttentionKernel::kWarps},
                                                       {"warps8", AttentionKernel::kWarps8},
                                                       {"tiled64", AttentionKernel::kTiled64},
                                                       {"tiled32", AttentionKernel::kTiled32}});
  k.prefill = choose<PrefillKernel>("BLEND_CUDA_PREFILL",
                                    {{"mma", PrefillKernel::kMma}, {"wmma", PrefillKernel::kWmma}});
  k.gate_up_bf16 = choose<bool>("BLEND_CUDA_GATE_UP", {{"f32", false}, {"bf16", true}});
  k.kv_layout = choose<KvLayout>(
      "BLEND_CUDA_KV_LAYOUT", {{"page", KvLayout::kPageMajor}, {"layer", KvLayout::kLayerMajor}});
  k.decode_heads_fastest =
      choose<bool>("BLEND_CUDA_DECODE_GRID", {{"tokens", false}, {"heads", true}});
  const std::string splits = env_or("BLEND_CUDA_DECODE_SPLITS", "fill");
  if (splits == "waves") {
    k.decode_splits = DecodeSplits::kWaves;
  } else if (splits != "fill") {
    const auto n = whole_number(splits, 1, 32);
    if (!n)
      throw Error("BLEND_CUDA_DECODE_SPLITS=" + splits +
                  ": expected fill, waves or a number from 1 to 32");
    k.min_decode_splits = static_cast<int32_t>(*n);
  }
  k.nano = choose<NanoMode>(
      "BLEND_CUDA_NANO_BATCHES",
      {{"off", NanoMode::kOff}, {"auto", NanoMode::kAuto}, {"always", NanoMode::kAlways}});
  k.nano_name = env_or("BLEND_CUDA_NANO_BATCHES", "off");
  const std::string sms = env_or("BLEND_CUDA_NANO_GEMM_SMS", "0");
  const auto n = whole_number(sms, 0, 1024);
  if (!n) throw Error("BLEND_CUDA_NANO_GEMM_SMS=" + sms + ": expected a number of SMs (0: all)");
  k.nano_gemm_sms = static_cast<int>(*n);
  k.nano_profile = env_or("BLEND_CUDA_NANO_PROFILE", "");
  const std::string split = env_or("BLEND_CUDA_NANO_SM_SPLIT", "");
  k.nano_green = choose<bool>("BLEND_CUDA_NANO_SM_SPLIT", {{"cublas", false}, {"green", true}});
  if (!k.nano_profile.empty()) {
    if (k.nano == NanoMode::kOff)
      throw Error(
          "BLEND_CUDA_NANO_PROFILE plans pipelined steps: it needs "
          "BLEND_CUDA_NANO_BATCHES auto or always");
    if (k.nano_gemm_sms > 0 || split == "cublas")
      throw Error(
          "BLEND_CUDA_NANO_PROFILE chooses each step's SM split (green contexts): unset "
          "BLEND_CUDA_NANO_GEMM_SMS and BLEND_CUDA_NANO_SM_SPLIT=cublas");
    k.nano_green = true;
  } else if (k.nano_green && (k.nano == NanoMode::kOff || k.nano_gemm_sms == 0)) {
    throw Error(
        "BLEND_CUDA_NANO_SM_SPLIT=green splits the SMs of pipelined steps: it needs "
        "BLEND_CUDA_NANO_BATCHES auto or always and BLEND_CUDA_NANO_GEMM_SMS > 0 (or "
        "BLEND_CUDA_NANO_PROFILE)");
  }
  const std::string interference = env_or("BLEND_CUDA_NANO_INTERFERENCE", "");
  if (!interference.empty()) {
    char* end = nullptr;
    const double x = std::strtod(interference.c_str(), &end);
    if (*end != '\0' || !(x >= 0.0 && x <= 2.0))
      throw Error("BLEND_CUDA_NANO_INTERFERENCE=" + interference +
                  ": expected a number from 0 to 2");
    k.nano_interference = x;
    if (!k.nano_profile.empty())
      throw Error(
          "BLEND_CUDA_NANO_INTERFERENCE is the cost model's; BLEND_CUDA_NANO_PROFILE's "
          "plans come from measured phase times: set one of them");
  }
  k.graphs = choose<bool>("BLEND_CUDA_GRAPHS", {{"off", false}, {"decode", true}});
  k.draw_cuts = choose<bool>("BLEND_CUDA_DRAW", {{"plain", false}, {"all", true}});
  return k;
}

}  // namespace blend::cuda
