#include "model/config.h"

#include <cmath>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend {

using nlohmann::json;

int64_t ModelConfig::num_matmul_parameters() const {
  const int64_t attn = hidden_size * (q_dim() + 2 * kv_dim()) + q_dim() * hidden_size;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  return num_layers * (attn + mlp) + vocab_size * hidden_size;  // + lm_head
}

int64_t ModelConfig::num_parameters() const {
  const int64_t bias = attention_bias ? q_dim() + 2 * kv_dim() : 0;
  // Gemma's layers add a norm after attention and after the MLP.
  const int64_t layer_norms = (gemma.enabled ? 4 : 2) * hidden_size + (qk_norm ? 2 * head_dim : 0);
  const int64_t norms = num_layers * layer_norms + hidden_size;
  const int64_t embed = vocab_size * hidden_size;
  return num_matmul_parameters() - embed + embed * (tie_word_embeddings ? 1 : 2) +
         num_layers * bias + norms;
}

void ModelConfig::validate() const {
  auto fail = [](const std::string& what) { throw Error("config.json: " + what); };
  auto in_range = [&](int64_t v, const char* what, int64_t max) {
    if (v <= 0 || v > max)
      fail(std::string(what) + " is " + std::to_string(v) + "; expected 1.." + std::to_string(max));
  };
  in_range(hidden_size, "hidden_size", kMaxHidden);
  in_range(num_layers, "num_hidden_layers", kMaxLayers);
  in_range(num_heads, "num_attention_heads", kMaxHeads);
  in_range(num_kv_heads, "num_key_value_heads", kMaxHeads);
  in_range(head_dim, "head_dim", kMaxHeadDim);
  in_range(intermediate_size, "intermediate_size", kMaxIntermediate);
  in_range(vocab_size, "vocab_size", kMaxVocab);
  // Positions are int32 throughout the engine.
  in_range(max_position_embeddings, "max_position_embeddings", (int64_t{1} << 31) - 1);
  if (num_heads % num_kv_heads != 0)
    fail("num_attention_heads must be a multiple of num_key_value_heads");
  if (head_dim % 2 != 0) fail("head_dim must be even for RoPE");
  // An epsilon of 1 or more swamps the mean square it is added to; 1e300 is inf in f32.
  if (!(rms_norm_eps > 0 && rms_norm_eps < 1))
    fail("rms_norm_eps must be in (0, 1), not " + json(rms_norm_eps).dump());
  if (!(rope_theta > 0 && std::isfinite(rope_theta)))
    fail("rope_theta must be positive, not " + json(rope_theta).dump());
  const RopeScaling& rs = rope_scaling;
  if (rs.type != "none" && rs.type != "linear" && rs.type != "llama3" && rs.type != "longrope")
    fail("unsupported RoPE type '" + rs.type + "'");
  if (rs.type != "none" && !(rs.factor > 0 && std::isfinite(rs.factor)))
    fail("RoPE scaling factor must be positive, not " + json(rs.factor).dump());
  if (rs.type == "llama3") {
    // llama3 divides by high - low and by both factors (transformers _compute_llama3_parameters).
    if (!(rs.low_freq_factor > 0 && rs.high_freq_factor > rs.low_freq_factor &&
          std::isfinite(rs.high_freq_factor)))
      fail("llama3 RoPE needs 0 < low_freq_factor < high_freq_factor");
    if (rs.original_max_position_embeddings <= 0)
      fail("llama3 RoPE needs a positive original_max_position_embeddings");
  }
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1) || rotary_dim() < 2 ||
      rotary_dim() % 2 != 0)
    fail("partial_rotary_factor must leave an even number of rotary dims, not " +
         json(partial_rotary_factor).dump());
  if (rs.type == "longrope" &&
      (static_cast<int64_t>(rs.short_factor.size()) != rotary_dim() / 2 ||
       rs.long_factor.size() != rs.short_factor.size() || !(rs.attention_factor > 0) ||
       rs.original_max_position_embeddings <= 0))
    fail(
        "longrope RoPE needs rotary_dim / 2 short and long factors and a positive "
        "attention_factor and original_max_position_embeddings");
  if (sliding_window && *sliding_window <= 0)
    fail("sliding_window must be positive (unset means no window)");
  if (gemma.enabled && gemma.sliding_layers.size() != static_cast<size_t>(num_layers))
    fail("Gemma: one sliding/full attention type per layer is needed");
  if (bos_token_id && *bos_token_id < 0) fail("bos_token_id must not be negative");
  for (int32_t id : eos_token_ids)
    if (id < 0) fail("eos_token_id must not be negative");
}

namespace {

// Gemma's fields as Gemma2Config / Gemma3TextConfig write them (every layer's type explicit).
void write_gemma(const ModelConfig& c, json& j) {
  const GemmaSettings& g = c.gemma;
  j["hidden_act"] = "gelu_pytorch_tanh";
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["query_pre_attn_scalar"] = g.query_pre_attn_scalar;
  auto cap = [](double v) { return v > 0 ? json(v) : json(nullptr); };
  j["attn_logit_softcapping"] = cap(g.attn_logit_softcapping);
  j["final_logit_softcapping"] = cap(g.final_logit_softcapping);
  j["sliding_window"] = g.sliding_window > 0 ? json(g.sliding_window) : json(nullptr);
  json types = json::array();
  for (bool s : g.sliding_layers) types.push_back(s ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  if (g.rope_local_theta) j["rope_local_base_freq"] = *g.rope_local_theta;
}

}  // namespace

json ModelConfig::to_json() const {
  json j;
  j["architectures"] = {architecture};
  j["model_type"] = model_type;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["intermediate_size"] = intermediate_size;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (architecture != "Qwen2ForCausalLM") j["attention_bias"] = attention_bias;
  const bool qwen = architecture == "Qwen2ForCausalLM" || architecture == "Qwen3ForCausalLM";
  // Written even when unset: MistralConfig reads an absent key as a 4096-token window.
  j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
  if (qwen) {
    j["use_sliding_window"] = sliding_window.has_value();
    j["max_window_layers"] = 0;  // the window, when there is one, is on every layer
  }
  if (gemma.enabled) write_gemma(*this, j);
  if (rope_scaling.type == "llama3") {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  } else if (rope_scaling.type == "longrope") {
    // Phi3's layout: the original length at the top level, the factor implied by the two.
    j["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    j["rope_scaling"] = {{"type", "longrope"},
                         {"short_factor", rope_scaling.short_factor},
                         {"long_factor", rope_scaling.long_factor}};
    // Only when it is not the default: transformers 4's Phi3Config takes exactly three keys.
    const double scale = rope_scaling.factor,
                 original = static_cast<double>(rope_scaling.original_max_position_embeddings);
    const double derived = scale <= 1 ? 1 : std::sqrt(1 + std::log(scale) / std::log(original));
    if (rope_scaling.attention_factor != derived)
      j["rope_scaling"]["attention_factor"] = rope_scaling.attention_factor;
  } else if (rope_scaling.type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (partial_rotary_factor != 1.0) j["partial_rotary_factor"] = partial_rotary_factor;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  j["torch_dtype"] = dtype == DType::kF32   ? "float32"
                     : dtype == DType::kF16 ? "float16"
                                            : "bfloat16";
  return j;
}

std::string architecture_difference(const ModelConfig& a, const ModelConfig& b) {
  const std::pair<const char*, bool> same[] = {
      {"architectures", a.architecture == b.architecture},
      {"hidden_size", a.hidden_size == b.hidden_size},
      {"num_hidden_layers", a.num_layers == b.num_layers},
      {"num_attention_heads", a.num_heads == b.num_heads},
      {"num_key_value_heads", a.num_kv_heads == b.num_kv_heads},
      {"head_dim", a.head_dim == b.head_dim},
      {"intermediate_size", a.intermediate_size == b.intermediate_size},
      {"vocab_size", a.vocab_size == b.vocab_size},
      {"max_position_embeddings", a.max_position_embeddings == b.max_position_embeddings},
      {"rope_theta", a.rope_theta == b.rope_theta},
      {"rope_scaling", a.rope_scaling.type == b.rope_scaling.type &&
                           a.rope_scaling.factor == b.rope_scaling.factor &&
                           a.rope_scaling.low_freq_factor == b.rope_scaling.low_freq_factor &&
                           a.rope_scaling.high_freq_factor == b.rope_scaling.high_freq_factor &&
                           a.rope_scaling.original_max_position_embeddings ==
                               b.rope_scaling.original_max_position_embeddings &&
                           a.rope_scaling.short_factor == b.rope_scaling.short_factor &&
                           a.rope_scaling.long_factor == b.rope_scaling.long_factor &&
                           a.rope_scaling.attention_factor == b.rope_scaling.attention_factor},
      {"partial_rotary_factor", a.partial_rotary_factor == b.partial_rotary_factor},
      {"rms_norm_eps", a.rms_norm_eps == b.rms_norm_eps},
      {"attention_bias", a.attention_bias == b.attention_bias},
      {"qk_norm", a.qk_norm == b.qk_norm},
      {"sliding_window", a.sliding_window == b.sliding_window},
      {"gemma", a.gemma == b.gemma},
      {"torch_dtype", a.dtype == b.dtype},
  };
  for (const auto& [field, equal] : same)
    if (!equal) return field;
  return "";
}

}  // namespace blend
