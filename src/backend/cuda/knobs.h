// The cuda backend's knobs: which kernels, KV layout, decode splits and nano-batch pipeline a
// backend uses, so one build can compare them in benchmarks and tests. Each is a command-line
// flag --cuda-NAME of `blend batch` / `serve` / `profile` (in --help; BackendOptions::cuda_knobs),
// and, for debugging, an environment variable BLEND_CUDA_NAME read where the flag is not given.
// The defaults are the measured best (docs/BENCHMARKS.md, "CUDA backend"). Pure host code,
// tested without a GPU. The comments below name each knob by its variable.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"

namespace blend::cuda {

// BLEND_CUDA_NANO_BATCHES: whole steps; two nano-batches where nano_split.h predicts a gain;
// or two wherever a step has two chunks (tests).
enum class NanoMode { kOff, kAuto, kAlways };

struct Knobs {
  // BLEND_CUDA_ATTENTION: default (prefill chunks on tensor cores, the other tokens in the
  // pipelined decode kernel where the shape allows, else tiled64), pipelined3 (three buffers),
  // warps / warps8 (the warp-parallel decode kernel), tiled64 or tiled32 for every token.
  AttentionKernel attention = AttentionKernel::kDefault;
  PrefillKernel prefill = PrefillKernel::kMma;  // BLEND_CUDA_PREFILL: mma or wmma
  // BLEND_CUDA_GATE_UP: the gate/up GEMM's output in f32 (the cpu backend's math) or rounded to
  // bf16 (what vLLM and transformers do; half the bytes into SwiGLU) on bf16 checkpoints.
  bool gate_up_bf16 = false;
  KvLayout kv_layout = KvLayout::kPageMajor;  // BLEND_CUDA_KV_LAYOUT: page or layer
  // BLEND_CUDA_DECODE_GRID: tokens (blocks in flight read one KV head of many sequences) or
  // heads (every KV head of fewer sequences).
  bool decode_heads_fastest = false;
  // BLEND_CUDA_DECODE_SPLITS: fill (split keys only to fill an idle GPU), waves (also to shorten
  // the last wave of blocks), or a number N (at least N splits).
  DecodeSplits decode_splits = DecodeSplits::kFill;
  int32_t min_decode_splits = 1;
  NanoMode nano = NanoMode::kOff;
  std::string nano_name = "off";
  int nano_gemm_sms = 0;  // BLEND_CUDA_NANO_GEMM_SMS: a pipelined step's GEMMs on N SMs; 0 all
  // BLEND_CUDA_NANO_SM_SPLIT: how that limit is held. cublas: cuBLAS's SM count target on the
  // GEMMs alone (the attention may use every SM); green: green contexts, the GEMM phases on a
  // group of N SMs and the attention on the rest (NanoFlow §5.1; sm_partition.h).
  bool nano_green = false;
  std::optional<double> nano_interference;  // BLEND_CUDA_NANO_INTERFERENCE, in [0, 2]
  // BLEND_CUDA_NANO_PROFILE: a file `blend profile --backend cuda --nano` wrote. Each step's
  // cut and SM split then come from NanoFlow §5.5's autosearch on it (nano_search.h), held by
  // green contexts; it needs BLEND_CUDA_NANO_BATCHES auto or always, and takes the place of
  // BLEND_CUDA_NANO_GEMM_SMS and BLEND_CUDA_NANO_INTERFERENCE (refused beside it).
  std::string nano_profile;
  // BLEND_CUDA_GRAPHS: off, or decode (a decode-only step's layers run as a CUDA graph, captured
  // once per shape and replayed: one launch instead of one per kernel; cuda_backend.h).
  bool graphs = false;
  // BLEND_CUDA_DRAW: plain (argmaxes and temperature draws without cuts on the GPU; cuts and
  // logprobs on the host) or all (top-k / top-p / min-p and logprobs on the GPU too, draw.cu).
  // plain until the GPU tests have run the cut kernel (written without a GPU, session 37).
  bool draw_cuts = false;
};

// One knob, for the command line: its name (flag --cuda-NAME, variable knob_env_var(NAME)),
// the values it takes and what it does.
struct KnobSpec {
  const char* name;    // "nano-batches"
  const char* values;  // "off|auto|always"
  const char* help;
};
const std::vector<KnobSpec>& knob_specs();
// "nano-batches" -> "BLEND_CUDA_NANO_BATCHES".
std::string knob_env_var(const std::string& name);

// The knobs from `flags` (knob name -> the value its --cuda-NAME flag gave); a knob not given
// there is read from its environment variable, and unset or empty means the default. Throws
// blend::Error naming the flag (or the variable, where the value came from one) and what it
// takes for a value it does not know, an unknown knob name, or knobs that contradict each other.
Knobs parse_knobs(const std::map<std::string, std::string>& flags);
// parse_knobs({}): the environment alone.
Knobs read_knobs();

}  // namespace blend::cuda
