// The analytical cost model of DESIGN.md §3 (BlendServe §4, NanoFlow §3). Given a model shape
// and a device it promises:
//  - per request r with prompt p and output d (BlendServe §4.1):
//      Comp(r) = (2 (p+d) P + 4 p^2 H L) / compute,  Mem(r) = (p d + d^2/2) H_kv L 4 / bandwidth,
//      rho(r) = Comp(r) / Mem(r);
//  - per node R with sharing ratio s (BlendServe §5.1): rho(R) = (1-s) T_comp / T_mem;
//  - per engine step (prefill tokens, decode tokens, KV context read): compute, memory and
//    network seconds, the last one NanoFlow eq. 7 under tensor parallelism.
// Everything is a pure function of its arguments; the scheduler, planner and the simulator
// backend share this one model so their predictions agree.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/forward_batch.h"
#include "cost/hardware.h"
#include "model/config.h"

namespace blend {

// What the cost model needs of a model: P (matmul parameters), H, H_kv, L, weight bytes, and the
// tensor-parallel degree it is served with.
struct ModelShape {
  std::string name;
  int64_t hidden_size = 0;  // H
  int64_t num_layers = 0;   // L
  int64_t kv_dim = 0;       // H_kv = kv_heads x head_dim
  // H_q = heads x head_dim, what attention's FLOPs scale with: H unless head_dim is set apart
  // from H / heads (Qwen3-0.6B: 2048 over H = 1024); 0 = H.
  int64_t query_dim = 0;
  int64_t matmul_parameters = 0;   // P: parameters each token multiplies (QKV, O, FFN, lm_head)
  int64_t lm_head_parameters = 0;  // the lm_head's share of P (vocab x H)
  int64_t weight_bytes = 0;        // all parameters at 2 bytes (FP16/BF16)
  int tensor_parallel = 1;

  // KV cache bytes of one token over all layers: key and value, FP16 (the "H_kv L 4").
  int64_t kv_bytes_per_token() const { return kv_dim * num_layers * 4; }
  int64_t attention_width() const { return query_dim > 0 ? query_dim : hidden_size; }

  static ModelShape from_config(const ModelConfig& config, std::string name,
                                int tensor_parallel = 1);
};

// Presets by name: every model/presets.h preset, materialisable or shape-only (llama-3-8b,
// llama-3-70b, qwen2.5-7b, qwen2.5-72b, llama-2-7b, deepseek-67b, ...) plus opt-13b and opt-30b,
// whose non-gated MLP ModelConfig cannot describe.
std::optional<ModelShape> find_model_shape_preset(std::string_view name, int tensor_parallel = 1);

// A model config the engine can run on the simulator (backend/sim): the shape's KV geometry
// (one KV head of H_kv dims, so KV bytes match) and a vocabulary and context large enough for
// any workload's token ids.
ModelConfig sim_model_config(const ModelShape& shape);

// One engine step: tokens run through the dense layers and the attention context they read.
struct StepShape {
  int64_t prefill_tokens = 0;           // prompt tokens computed this step (chunks)
  int64_t decode_tokens = 0;            // sequences decoding one token
  int64_t decode_context_tokens = 0;    // sum of the decoders' context lengths (KV read)
  int64_t prefill_attention_pairs = 0;  // sum over prefill chunks of chunk x context length
  // Rows that go through the lm_head (engines skip it for prompt tokens that sample nothing);
  // -1 = every dense token, as the papers count.
  int64_t logit_rows = -1;
  // Every sampled row is a device draw, an argmax or a temperature draw with no penalty, bias
  // or mask (all_device_draws: a backend with Hardware::device_argmax draws it on the device, and
  // the rows cost no host work).
  bool device_draws = false;
};

// The shape of the step a backend is asked to compute: a one-token chunk with context is a
// decode token, anything else prefill (chunked or not). The simulator prices a step by it, and
// `blend batch --step-timings` records it beside each real step's time.
StepShape step_shape(const ForwardBatch& batch);

struct StepCost {
  double compute_seconds = 0;
  double memory_seconds = 0;
  double network_seconds = 0;
  double overhead_seconds = 0;
  double interference = 0;  // the hardware's overlap_interference
  // With Hardware::gemm_roofline: the shorter of the dense GEMMs' compute and their weight
  // read, which the longer one hides (both are counted in compute and memory seconds).
  double gemm_hidden_seconds = 0;
  // Resources used one after another (FCFS engines), or overlapped (NanoFlow): the longest
  // part plus `interference` times the others.
  double sequential() const {
    return compute_seconds + memory_seconds + network_seconds + overhead_seconds -
           gemm_hidden_seconds;
  }
  double overlapped() const;
};

class CostModel {
 public:
  CostModel(ModelShape shape, Hardware hardware);

  const ModelShape& shape() const { return shape_; }
  const Hardware& hardware() const { return hardware_; }

  // BlendServe §4.1 over all tensor-parallel devices together (TP scales both sides alike).
  double request_compute_seconds(double prompt_tokens, double output_tokens) const;
  double request_memory_seconds(double prompt_tokens, double output_tokens) const;
  double request_density(double prompt_tokens, double output_tokens) const;

  // BlendServe §4.2: one step of a steady continuously batched run whose decoders fill
  // `kv_memory_bytes` (per device) with requests of mean prompt p and output d:
  // B_decode = KV-Mem / ((p + d/2) H_kv L 4) decoders plus B_decode p/d prefill tokens.
  double batch_compute_seconds(double kv_memory_bytes, double prompt_tokens,
                               double output_tokens) const;
  double batch_memory_seconds(double kv_memory_bytes) const;
  // Comp(B) / Mem(B); equals rho(r) without the prefill-attention term (§4.2's derivation).
  double batch_density(double prompt_tokens, double output_tokens) const;

  // BlendServe §5.1: rho(R) = (1-s) T_comp / T_mem; infinite when T_mem is 0 (no decoding).
  static double node_density(double sharing_ratio, double compute_seconds, double memory_seconds);

  // Seconds of one step on each of the `tensor_parallel` devices (each holds 1/TP of weights,
  // heads and KV): dense GEMMs 2 P tokens, prefill attention 4 pairs H L, weights + KV read,
  // and for TP > 1 NanoFlow eq. 7: 4 tokens H 2 bytes L / NetBW; the overhead is the step's,
  // the sampled rows' host work and the decode sequences' fixed cost (Hardware).
  StepCost estimate_step(const StepShape& step) const;

  // KV bytes per token on one device.
  double kv_bytes_per_token_per_device() const;

 private:
  ModelShape shape_;
  Hardware hardware_;
};

}  // namespace blend
