#include "backend/cuda/knobs.h"

#include <cstdlib>

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

}  // namespace

Knobs read_knobs() {
  Knobs k;
  const std::string kernel = env_or("BLEND_CUDA_ATTENTION", "default");
  if (kernel == "tiled32")
    k.attention = AttentionKernel::kTiled32;
  else if (kernel == "tiled64")
    k.attention = AttentionKernel::kTiled64;
  else if (kernel == "pipelined3")
    k.attention = AttentionKernel::kPipelined3;
  else if (kernel == "warps")
    k.attention = AttentionKernel::kWarps;
  else if (kernel == "warps8")
    k.attention = AttentionKernel::kWarps8;
  else if (kernel != "default")
    throw Error("BLEND_CUDA_ATTENTION=" + kernel +
                ": expected default, pipelined3, warps, warps8, tiled64 or tiled32");
  const std::string prefill = env_or("BLEND_CUDA_PREFILL", "mma");
  if (prefill == "wmma")
    k.prefill = PrefillKernel::kWmma;
  else if (prefill != "mma")
    throw Error("BLEND_CUDA_PREFILL=" + prefill + ": expected mma or wmma");
  const std::string gate_up = env_or("BLEND_CUDA_GATE_UP", "f32");
  if (gate_up == "bf16")
    k.gate_up_bf16 = true;
  else if (gate_up != "f32")
    throw Error("BLEND_CUDA_GATE_UP=" + gate_up + ": expected f32 or bf16");
  const std::string layout = env_or("BLEND_CUDA_KV_LAYOUT", "page");
  if (layout == "layer")
    k.kv_layout = KvLayout::kLayerMajor;
  else if (layout != "page")
    throw Error("BLEND_CUDA_KV_LAYOUT=" + layout + ": expected page or layer");
  const std::string grid = env_or("BLEND_CUDA_DECODE_GRID", "tokens");
  if (grid == "heads")
    k.decode_heads_fastest = true;
  else if (grid != "tokens")
    throw Error("BLEND_CUDA_DECODE_GRID=" + grid + ": expected tokens or heads");
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
  k.nano_name = env_or("BLEND_CUDA_NANO_BATCHES", "off");
  if (k.nano_name == "auto")
    k.nano = NanoMode::kAuto;
  else if (k.nano_name == "always")
    k.nano = NanoMode::kAlways;
  else if (k.nano_name != "off")
    throw Error("BLEND_CUDA_NANO_BATCHES=" + k.nano_name + ": expected off, auto or always");
  const std::string sms = env_or("BLEND_CUDA_NANO_GEMM_SMS", "0");
  const auto n = whole_number(sms, 0, 1024);
  if (!n) throw Error("BLEND_CUDA_NANO_GEMM_SMS=" + sms + ": expected a number of SMs (0: all)");
  k.nano_gemm_sms = static_cast<int>(*n);
  const std::string interference = env_or("BLEND_CUDA_NANO_INTERFERENCE", "");
  if (!interference.empty()) {
    char* end = nullptr;
    const double x = std::strtod(interference.c_str(), &end);
    if (*end != '\0' || !(x >= 0.0 && x <= 2.0))
      throw Error("BLEND_CUDA_NANO_INTERFERENCE=" + interference +
                  ": expected a number from 0 to 2");
    k.nano_interference = x;
  }
  return k;
}

}  // namespace blend::cuda
