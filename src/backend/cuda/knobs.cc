#include "backend/cuda/knobs.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <initializer_list>
#include <utility>

#include "core/error.h"

namespace blend::cuda {
namespace {

// Where each knob's value comes from: the --cuda-NAME flag, else BLEND_CUDA_NAME (debugging),
// else its default. Errors name the source the value came from.
class KnobSource {
 public:
  explicit KnobSource(const std::map<std::string, std::string>& flags) : flags_(flags) {
    // Not a structured binding: clang 14 (CI's) cannot capture one in the lambda.
    for (const auto& flag : flags) {
      const std::string& name = flag.first;
      if (std::none_of(knob_specs().begin(), knob_specs().end(),
                       [&](const KnobSpec& s) { return name == s.name; }))
        throw Error("--cuda-" + name + ": no such cuda backend knob");
    }
  }

  std::string value(const char* name, const char* fallback) const {
    if (auto it = flags_.find(name); it != flags_.end() && !it->second.empty()) return it->second;
    const char* v = std::getenv(knob_env_var(name).c_str());
    return v && *v ? std::string(v) : std::string(fallback);
  }
  // "--cuda-NAME" or "BLEND_CUDA_NAME": what the user set (the flag when neither).
  std::string label(const char* name) const {
    if (flags_.count(name)) return std::string("--cuda-") + name;
    return std::getenv(knob_env_var(name).c_str()) ? knob_env_var(name)
                                                   : std::string("--cuda-") + name;
  }
  std::string setting(const char* name, const std::string& value) const {
    return label(name) + "=" + value;
  }

 private:
  const std::map<std::string, std::string>& flags_;
};

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
T choose(const KnobSource& src, const char* name,
         std::initializer_list<std::pair<const char*, T>> options) {
  const std::string value = src.value(name, options.begin()->first);
  std::string expected;
  size_t i = 0;
  for (const auto& [key, result] : options) {
    if (value == key) return result;
    if (i > 0) expected += i + 1 == options.size() ? " or " : ", ";
    expected += key;
    ++i;
  }
  throw Error(src.setting(name, value) + ": expected " + expected);
}

}  // namespace

const std::vector<KnobSpec>& knob_specs() {
  static const std::vector<KnobSpec> specs = {
      {"attention", "default|pipelined3|warps|warps8|tiled64|tiled32",
       "attention kernels: default (prefill chunks on tensor cores, the other tokens in the "
       "pipelined decode kernel where the shape allows), pipelined3 (three buffers), warps / "
       "warps8 (warp-parallel decode), tiled64 / tiled32 for every token"},
      {"prefill", "mma|wmma", "the tensor-core prefill attention's instructions"},
      {"gate-up", "f32|bf16",
       "the gate/up GEMM's output on bf16 checkpoints: f32 (the cpu backend's math) or bf16 "
       "(vLLM's and transformers')"},
      {"kv-layout", "page|layer", "KV pages page-major or layer-major"},
      {"decode-grid", "tokens|heads",
       "decode blocks in flight read one KV head of many sequences (tokens) or every head of "
       "fewer (heads)"},
      {"decode-splits", "fill|waves|N",
       "flash-decoding key splits: to fill an idle GPU, also to shorten the last wave, or at "
       "least N (1-32)"},
      {"nano-batches", "off|auto|always",
       "NanoFlow's two overlapped nano-batches: never, where nano_split predicts a gain, or "
       "wherever a step has two chunks"},
      {"nano-gemm-sms", "N", "a pipelined step's GEMMs on N SMs (0: all)"},
      {"nano-sm-split", "cublas|green",
       "how the GEMMs' SM limit is held: cuBLAS's SM target, or green contexts (NanoFlow §5.1)"},
      {"nano-interference", "X",
       "the cost model's interference factor for nano-batch plans, 0 to 2"},
      {"nano-profile", "FILE",
       "a `blend profile --backend cuda --nano` file: each step's cut and SM split from "
       "NanoFlow §5.5's autosearch (needs nano-batches auto or always)"},
      {"graphs", "off|decode", "decode-only steps as captured CUDA graphs"},
      {"draw", "plain|all",
       "sampling cuts (top-k/top-p/min-p) and logprobs on the host (plain) or the GPU (all)"},
  };
  return specs;
}

std::string knob_env_var(const std::string& name) {
  std::string var = "BLEND_CUDA_";
  for (char c : name) var += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return var;
}

Knobs parse_knobs(const std::map<std::string, std::string>& flags) {
  const KnobSource src(flags);
  Knobs k;
  k.attention = choose<AttentionKernel>(src, "attention",
                                        {{"default", AttentionKernel::kDefault},
                                         {"pipelined3", AttentionKernel::kPipelined3},
                                         {"warps", AttentionKernel::kWarps},
                                         {"warps8", AttentionKernel::kWarps8},
                                         {"tiled64", AttentionKernel::kTiled64},
                                         {"tiled32", AttentionKernel::kTiled32}});
  k.prefill = choose<PrefillKernel>(src, "prefill",
                                    {{"mma", PrefillKernel::kMma}, {"wmma", PrefillKernel::kWmma}});
  k.gate_up_bf16 = choose<bool>(src, "gate-up", {{"f32", false}, {"bf16", true}});
  k.kv_layout = choose<KvLayout>(
      src, "kv-layout", {{"page", KvLayout::kPageMajor}, {"layer", KvLayout::kLayerMajor}});
  k.decode_heads_fastest = choose<bool>(src, "decode-grid", {{"tokens", false}, {"heads", true}});
  const std::string splits = src.value("decode-splits", "fill");
  if (splits == "waves") {
    k.decode_splits = DecodeSplits::kWaves;
  } else if (splits != "fill") {
    const auto n = whole_number(splits, 1, 32);
    if (!n)
      throw Error(src.setting("decode-splits", splits) +
                  ": expected fill, waves or a number from 1 to 32");
    k.min_decode_splits = static_cast<int32_t>(*n);
  }
  k.nano = choose<NanoMode>(
      src, "nano-batches",
      {{"off", NanoMode::kOff}, {"auto", NanoMode::kAuto}, {"always", NanoMode::kAlways}});
  k.nano_name = src.value("nano-batches", "off");
  const std::string sms = src.value("nano-gemm-sms", "0");
  const auto n = whole_number(sms, 0, 1024);
  if (!n) throw Error(src.setting("nano-gemm-sms", sms) + ": expected a number of SMs (0: all)");
  k.nano_gemm_sms = static_cast<int>(*n);
  k.nano_profile = src.value("nano-profile", "");
  const std::string split = src.value("nano-sm-split", "");
  k.nano_green = choose<bool>(src, "nano-sm-split", {{"cublas", false}, {"green", true}});
  const std::string batches = src.label("nano-batches"), profile = src.label("nano-profile");
  if (!k.nano_profile.empty()) {
    if (k.nano == NanoMode::kOff)
      throw Error(profile + " plans pipelined steps: it needs " + batches + " auto or always");
    if (k.nano_gemm_sms > 0 || split == "cublas")
      throw Error(profile + " chooses each step's SM split (green contexts): unset " +
                  src.label("nano-gemm-sms") + " and " + src.label("nano-sm-split") + "=cublas");
    k.nano_green = true;
  } else if (k.nano_green && (k.nano == NanoMode::kOff || k.nano_gemm_sms == 0)) {
    throw Error(src.setting("nano-sm-split", "green") +
                " splits the SMs of pipelined steps: it needs " + batches + " auto or always and " +
                src.label("nano-gemm-sms") + " > 0 (or " + profile + ")");
  }
  const std::string interference = src.value("nano-interference", "");
  if (!interference.empty()) {
    char* end = nullptr;
    const double x = std::strtod(interference.c_str(), &end);
    if (*end != '\0' || !(x >= 0.0 && x <= 2.0))
      throw Error(src.setting("nano-interference", interference) +
                  ": expected a number from 0 to 2");
    k.nano_interference = x;
    if (!k.nano_profile.empty())
      throw Error(src.label("nano-interference") + " is the cost model's; " + profile +
                  "'s plans come from measured phase times: set one of them");
  }
  k.graphs = choose<bool>(src, "graphs", {{"off", false}, {"decode", true}});
  k.draw_cuts = choose<bool>(src, "draw", {{"plain", false}, {"all", true}});
  return k;
}

Knobs read_knobs() {
  return parse_knobs({});
}

}  // namespace blend::cuda
