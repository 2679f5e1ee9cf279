// ModelConfig — what the engine needs from a Hugging Face model folder's config.json (and
// generation_config.json): shapes, RoPE, norm epsilon, special token ids. Supports
// LlamaForCausalLM, Qwen2ForCausalLM (QKV bias), Qwen3ForCausalLM (per-head q/k norms),
// Phi3ForCausalLM (fused projections, partial RoPE, longrope), MistralForCausalLM,
// Gemma2ForCausalLM and Gemma3ForCausalLM as transformers 4 and 5
// write them (config_json.cc lists, field by field, what is read, what is ignored on purpose and
// what is refused); anything else is a blend::Error naming the field, never a silently wrong
// model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "core/types.h"

namespace blend {

// RoPE frequency scaling. "llama3" is the piecewise scheme of Llama 3.1/3.2; "linear" divides
// every frequency by `factor`; "longrope" (Phi-3) divides frequency i by short_factor[i] or
// long_factor[i] (model/rope.h says which) and multiplies cos and sin by attention_factor;
// "none" leaves them alone.
struct RopeScaling {
  std::string type = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // longrope: one divisor per rotated frequency (rotary_dim / 2 each), and the cos/sin
  // multiplier, resolved at load (transformers' _compute_longrope_parameters default when the
  // config gives none).
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
};

// What Gemma 2 and Gemma 3 add to the Llama layer (transformers' Gemma2/Gemma3 modeling). Off
// (`enabled` false) for every other architecture, whose math these fields leave as it was.
struct GemmaSettings {
  // Every RMSNorm scales by (1 + w); the embedding rows are multiplied by sqrt(hidden_size)
  // (rounded to the activation dtype); the MLP is GeGLU with tanh-approximated GELU; attention's
  // and the MLP's outputs pass their own RMSNorm before the residual add (four norms a layer).
  bool enabled = false;
  double query_pre_attn_scalar = 0;    // attention scores scaled by its -1/2 power
  double attn_logit_softcapping = 0;   // scores -> cap * tanh(scores / cap); 0 = none
  double final_logit_softcapping = 0;  // logits -> cap * tanh(logits / cap); 0 = none
  int64_t sliding_window = 0;          // the window of the sliding layers (0 = none slide)
  std::vector<bool> sliding_layers;    // per layer: attends through the window ("local")
  // The local layers' RoPE base, without rope_scaling (Gemma 3's rope_local_base_freq); unset:
  // every layer uses rope_theta and rope_scaling (Gemma 2).
  std::optional<double> rope_local_theta;

  bool sliding(int64_t layer) const {
    return sliding_window > 0 && sliding_layers.at(static_cast<size_t>(layer));
  }
  bool operator==(const GemmaSettings&) const = default;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // e.g. "llama"
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (Qwen2)
  // Q and K pass an RMSNorm over each head (weights of head_dim) before RoPE (Qwen3).
  bool qk_norm = false;
  // The checkpoint holds q/k/v as one qkv_proj and gate/up as one gate_up_proj (Phi-3); the
  // rows are in blend's fused order already (q, k, v; gate, up), so only the names differ.
  bool fused_checkpoint_projections = false;
  // The share of each head's dims RoPE rotates (Phi-4-mini: 0.75); the rest pass unchanged.
  double partial_rotary_factor = 1.0;
  std::optional<int64_t> sliding_window;  // Mistral: every layer; unset = full attention
  GemmaSettings gemma;                    // Gemma 2 / 3 only (per-layer windows live there)
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // generation_config.json wins over config.json
  DType dtype = DType::kBF16;          // torch_dtype of the checkpoint
  // generation_config.json's sampling defaults (temperature, top_p, top_k, min_p,
  // repetition_penalty, max_new_tokens); requests that set a field keep their own.
  SamplingDefaults sampling_defaults;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }  // H_kv of DESIGN.md §3
  // The rotated leading dims of a head: int(head_dim * partial_rotary_factor), as transformers.
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  // Parameters of the dense model (embedding, layers, final norm, lm_head unless tied).
  int64_t num_parameters() const;
  // Parameters touched per token excluding the embedding lookup (the "P" of the cost model).
  int64_t num_matmul_parameters() const;

  // Throws blend::Error on a missing, inconsistent or out-of-range field. The bounds below are
  // far above any real model (Llama-3.1-405B: 126 layers, hidden 16384) and keep every size
  // computed from the config (parameter counts, tensor lists, byte sizes) small and exact.
  void validate() const;
  static constexpr int64_t kMaxLayers = 4096;
  static constexpr int64_t kMaxHidden = int64_t{1} << 17;
  static constexpr int64_t kMaxIntermediate = int64_t{1} << 20;
  static constexpr int64_t kMaxHeads = 4096;
  static constexpr int64_t kMaxHeadDim = 4096;
  static constexpr int64_t kMaxVocab = int64_t{1} << 24;

  // Reads config.json in either layout: transformers 4 (rope_theta + rope_scaling,
  // torch_dtype) or 5 (rope_parameters, dtype); where both are present they must agree.
  static ModelConfig from_json(const nlohmann::json& config);
  // Reads DIR/config.json and, when present, DIR/generation_config.json (regular files only).
  static ModelConfig from_dir(const std::filesystem::path& dir);
  nlohmann::json to_json() const;  // Hugging Face config.json layout (transformers 4)
};

// The first field (by name) in which two configs describe different networks, or "" when one set
// of shapes, RoPE, norm and attention settings fits both (fine-tunes of one base): what models
// sharing one engine's KV cache and batch must agree on. Special tokens, sampling defaults and
// whether the embedding is tied may differ.
std::string architecture_difference(const ModelConfig& a, const ModelConfig& b);

}  // namespace blend
