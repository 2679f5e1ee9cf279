// ModelConfig::from_json — reading a Hugging Face config.json as transformers 4 and 5 write it
// for LlamaConfig, Qwen2Config, Qwen3Config, Phi3Config, MistralConfig, Gemma2Config and
// Gemma3TextConfig. The rule: a field either is understood (read and honoured exactly as
// transformers' model class honours it), is irrelevant to the forward pass at inference (ignored
// on purpose, listed below), or is refused with an error naming it. A wrong answer is worse than
// an error, so no field that could change the math is skipped.
//
// Understood:
//   architectures, model_type (must agree when both name a supported model), hidden_size,
//   intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
//   max_position_embeddings, rms_norm_eps, tie_word_embeddings, bos_token_id, eos_token_id;
//   hidden_act ("silu" or its alias "swish"; anything else refused);
//   RoPE: transformers 4's rope_theta + rope_scaling and transformers 5's rope_parameters
//     (rope_type/type, rope_theta, factor, low_freq_factor, high_freq_factor,
//     original_max_position_embeddings, partial_rotary_factor), plus the top-level
//     original_max_position_embeddings and partial_rotary_factor transformers 5 folds in.
//     Types default, linear and llama3, and for Phi3 longrope (short_factor, long_factor,
//     attention_factor; factor must be max / original_max_position_embeddings, which is what
//     Phi3's transformers class uses whatever it says); any other type, a key the type does
//     not use, a partial_rotary_factor other than 1 (except Phi3's, in (0, 1]), or the two
//     layouts disagreeing is refused;
//   attention_bias (Qwen2 always has q/k/v biases, so false is refused; Llama and Qwen3 put
//     the bias on o_proj too, which is not implemented, and Mistral has none: true refused);
//     mlp_bias (true refused); Qwen3's per-head q_norm / k_norm are always there; Phi3's
//     lm_head_bias (true refused) and the remote-code keys full_attn_mod and
//     interpolate_factor (other than 1 refused);
//   sliding_window (Mistral: every layer, 4096 when the key is absent, null = none; Qwen2 and
//     Qwen3: only
//     with use_sliding_window, on layers from max_window_layers or as layer_types says, and only
//     when that is every layer or none; Phi3: every layer, none when absent; Llama: not used by
//     transformers, so a window is refused);
//   layer_types (must be uniform and match the window above);
//   torch_dtype (transformers 4) / dtype (transformers 5): float32, float16, bfloat16;
//   quantization_config, compression_config: refused (quantized checkpoints are not supported).
// Gemma 2 / Gemma 3 (read_gemma): hidden_activation (gelu_pytorch_tanh, the default; hidden_act
//   is not read by their MLP and is ignored), query_pre_attn_scalar (256), attn_logit_softcapping
//   and final_logit_softcapping (Gemma2Config: 50 and 30 when absent; Gemma 3: none),
//   sliding_window (4096) on the layers layer_types names, or else on Gemma 2's even layers and on
//   all but every sliding_window_pattern-th (6) of Gemma 3's, rope_local_base_freq (Gemma 3's
//   local layers, 10000, unscaled; rope_theta defaults to 1e6 there), head_dim (256),
//   num_key_value_heads (4), tie_word_embeddings (true). use_bidirectional_attention=true and
//   attention_bias=true are refused; cache_implementation is ignored (a cache layout).
// Gemma3ForConditionalGeneration (unwrapped_text_config): its text_config read as
//   Gemma3ForCausalLM, with the wrapper's bos/eos ids, dtype, tie_word_embeddings and
//   quantization keys over the text config's; vision_config and the image token fields ignored
//   (image inputs are refused where a request could carry one).
// Ignored on purpose (no effect on the logits of a forward pass): initializer_range, use_cache,
//   pad_token_id, attention_dropout, resid_pdrop, embd_pdrop, pretraining_tp (splits the same
//   matmuls into slices), transformers_version, _name_or_path, output_* / return_dict flags,
//   tokenizer_class and any other key transformers' Llama/Qwen2/Mistral classes do not read.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"
#include "model/config.h"

namespace blend {
namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& what) {
  throw Error("config.json: " + what);
}

const json* find(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

// Integers are range-checked before narrowing: 2^64-1 or 2^40 are errors, never wrapped.
std::optional<int64_t> opt_int(const json& j, const char* key, const std::string& where = "") {
  const json* v = find(j, key);
  if (!v) return std::nullopt;
  const std::string name = where + key;
  if (!v->is_number_integer()) refuse("field '" + name + "' must be an integer");
  if (v->is_number_unsigned() &&
      v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    refuse("field '" + name + "' is out of range");
  return v->get<int64_t>();
}

int64_t required_int(const json& j, const char* key) {
  auto v = opt_int(j, key);
  if (!v) refuse(std::string("missing or non-integer field '") + key + "'");
  return *v;
}

std::optional<double> opt_double(const json& j, const char* key, const std::string& where = "") {
  const json* v = find(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) refuse("field '" + where + key + "' must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d)) refuse("field '" + where + key + "' is not finite");
  return d;
}

std::optional<bool> opt_bool(const json& j, const char* key) {
  const json* v = find(j, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) refuse(std::string("field '") + key + "' must be true or false");
  return v->get<bool>();
}

std::optional<std::string> opt_string(const json& j, const char* key,
                                      const std::string& where = "") {
  const json* v = find(j, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) refuse("field '" + where + key + "' must be a string");
  return v->get<std::string>();
}

int32_t token_id(const json& v, const std::string& field) {
  if (!v.is_number_integer()) refuse("'" + field + "' must hold integer token ids");
  if (v.is_number_unsigned()
          ? v.get<uint64_t>() > std::numeric_limits<int32_t>::max()
          : (v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max()))
    refuse("'" + field + "' holds token id " + v.dump() + ", outside [0, 2^31)");
  return static_cast<int32_t>(v.get<int64_t>());
}

enum class Arch { kLlama, kQwen2, kQwen3, kPhi3, kMistral, kGemma2, kGemma3 };

Arch read_architecture(const json& j, ModelConfig& c) {
  if (const json* a = find(j, "architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      refuse("field 'architectures' must be a non-empty list of strings");
    if (a->size() > 1)
      refuse("field 'architectures' names " + std::to_string(a->size()) +
             " architectures; expected one");
    c.architecture = (*a)[0].get<std::string>();
  }
  c.model_type = opt_string(j, "model_type").value_or("");
  static const std::pair<const char*, const char*> kTypes[] = {
      {"llama", "LlamaForCausalLM"},       {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},       {"phi3", "Phi3ForCausalLM"},
      {"mistral", "MistralForCausalLM"},   {"gemma2", "Gemma2ForCausalLM"},
      {"gemma3_text", "Gemma3ForCausalLM"}};
  for (const auto& [type, arch] : kTypes) {
    if (c.model_type != type) continue;
    if (c.architecture.empty()) c.architecture = arch;
    // transformers picks the model class from model_type: a disagreeing pair is ambiguous.
    if (c.architecture != arch)
      refuse("model_type '" + c.model_type + "' disagrees with architectures ['" + c.architecture +
             "'] (expected " + arch + ")");
  }
  if (c.architecture == "LlamaForCausalLM") return Arch::kLlama;
  if (c.architecture == "Qwen2ForCausalLM") return Arch::kQwen2;
  if (c.architecture == "Qwen3ForCausalLM") return Arch::kQwen3;
  if (c.architecture == "Phi3ForCausalLM") return Arch::kPhi3;
  if (c.architecture == "MistralForCausalLM") return Arch::kMistral;
  if (c.architecture == "Gemma2ForCausalLM") return Arch::kGemma2;
  if (c.architecture == "Gemma3ForCausalLM") return Arch::kGemma3;
  refuse("unsupported architecture '" + c.architecture +
         "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
         "Phi3ForCausalLM, MistralForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM)");
}

// One RoPE description from either layout, before the two are reconciled.
struct Rope {
  std::optional<double> theta;
  std::optional<RopeScaling> scaling;  // unset: this layout says nothing about scaling
  std::optional<double> partial_rotary_factor;
};

// A partial_rotary_factor: 1 everywhere but on Phi3, where it is in (0, 1].
std::optional<double> read_partial_rotary(const json& j, const std::string& where, bool phi3) {
  const auto p = opt_double(j, "partial_rotary_factor", where);
  if (p && *p != 1.0 && !phi3)
    refuse("'" + where + "partial_rotary_factor' other than 1 (partial RoPE) is not supported");
  if (p && !(*p > 0 && *p <= 1))
    refuse("'" + where + "partial_rotary_factor' must be in (0, 1], not " + json(*p).dump());
  return p;
}

std::vector<double> factor_list(const json& r, const char* key, const std::string& where) {
  const json* v = find(r, key);
  if (!v || !v->is_array()) refuse("'" + where + key + "' must be a list of numbers");
  std::vector<double> out;
  for (const json& x : *v) {
    if (!x.is_number() || !(x.get<double>() > 0) || !std::isfinite(x.get<double>()))
      refuse("'" + where + key + "' must hold positive numbers, not " + x.dump());
    out.push_back(x.get<double>());
  }
  return out;
}

// Parses a rope_scaling (transformers 4) or rope_parameters (transformers 5) object.
Rope parse_rope_object(const json& r, const std::string& field, int64_t max_position,
                       std::optional<int64_t> top_level_original_max, bool phi3) {
  const std::string where = field + ".";
  if (!r.is_object()) refuse("field '" + field + "' must be an object or null");
  auto rope_type = opt_string(r, "rope_type", where);
  auto legacy_type = opt_string(r, "type", where);
  if (rope_type && legacy_type && *rope_type != *legacy_type)
    refuse(field + ": rope_type '" + *rope_type + "' disagrees with type '" + *legacy_type + "'");
  const std::string type = rope_type ? *rope_type : legacy_type.value_or("default");

  std::set<std::string> allowed = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type == "linear") allowed.insert("factor");
  if (type == "llama3")
    allowed.insert(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  if (type == "longrope")
    allowed.insert({"short_factor", "long_factor", "factor", "attention_factor",
                    "original_max_position_embeddings"});
  if (type == "longrope" && !phi3)
    refuse("unsupported RoPE type 'longrope' in '" + field +
           "' (supported for Phi3ForCausalLM only)");
  if (type != "default" && type != "linear" && type != "llama3" && type != "longrope")
    refuse("unsupported RoPE type '" + type + "' in '" + field +
           "' (supported: default, linear, llama3" + (phi3 ? ", longrope" : "") + ")");
  for (const auto& [key, value] : r.items()) {
    if (!allowed.count(key))
      refuse("'" + where + key + "' is not understood for RoPE type '" + type +
             "' and could change the result");
  }
  Rope out;
  out.partial_rotary_factor = read_partial_rotary(r, where, phi3);
  out.theta = opt_double(r, "rope_theta", where);
  RopeScaling s;
  auto need = [&](const char* key) {
    auto v = opt_double(r, key, where);
    if (!v) refuse("'" + where + key + "' is required for RoPE type '" + type + "'");
    return *v;
  };
  if (type == "linear") {
    s.type = "linear";
    s.factor = need("factor");
  } else if (type == "llama3") {
    s.type = "llama3";
    s.factor = need("factor");
    s.low_freq_factor = need("low_freq_factor");
    s.high_freq_factor = need("high_freq_factor");
    // transformers 5 (standardize_rope_params): the top-level value wins, else the object's,
    // else max_position_embeddings.
    auto inner = opt_int(r, "original_max_position_embeddings", where);
    if (inner && top_level_original_max && *inner != *top_level_original_max)
      refuse("'" + where + "original_max_position_embeddings' disagrees with the top-level one");
    s.original_max_position_embeddings =
        top_level_original_max ? *top_level_original_max : inner.value_or(max_position);
  } else if (type == "longrope") {
    s.type = "longrope";
    s.short_factor = factor_list(r, "short_factor", where);
    s.long_factor = factor_list(r, "long_factor", where);
    auto inner = opt_int(r, "original_max_position_embeddings", where);
    if (inner && top_level_original_max && *inner != *top_level_original_max)
      refuse("'" + where + "original_max_position_embeddings' disagrees with the top-level one");
    // Phi3Config's default is 4096.
    s.original_max_position_embeddings = top_level_original_max.value_or(inner.value_or(4096));
    if (s.original_max_position_embeddings <= 0)
      refuse("longrope needs a positive original_max_position_embeddings");
    // transformers' _compute_longrope_parameters: Phi3 takes the scale from the two lengths
    // (any `factor` is overridden), and the attention factor from it unless one is given.
    s.factor =
        static_cast<double>(max_position) / static_cast<double>(s.original_max_position_embeddings);
    if (auto f = opt_double(r, "factor", where); f && std::abs(*f - s.factor) > 1e-9 * s.factor)
      refuse("'" + where + "factor' (" + json(*f).dump() +
             ") disagrees with max_position_embeddings / original_max_position_embeddings (" +
             json(s.factor).dump() + "), which Phi3 uses");
    const auto given = opt_double(r, "attention_factor", where);
    if (given && !(*given > 0)) refuse("'" + where + "attention_factor' must be positive");
    s.attention_factor =
        given ? *given
        : s.factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(s.factor) / std::log(static_cast<double>(
                                                       s.original_max_position_embeddings)));
  }
  out.scaling = s;
  return out;
}

bool same_scaling(const RopeScaling& a, const RopeScaling& b) {
  return a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.short_factor == b.short_factor && a.long_factor == b.long_factor &&
         a.attention_factor == b.attention_factor;
}

void read_rope(const json& j, Arch arch, ModelConfig& c) {
  const bool phi3 = arch == Arch::kPhi3;
  const auto top_partial = read_partial_rotary(j, "", phi3);
  const auto top_original = opt_int(j, "original_max_position_embeddings");
  Rope v4;
  v4.theta = opt_double(j, "rope_theta");
  if (const json* rs = find(j, "rope_scaling")) {
    Rope r = parse_rope_object(*rs, "rope_scaling", c.max_position_embeddings, top_original, phi3);
    v4.scaling = r.scaling;
    if (r.theta && v4.theta && *r.theta != *v4.theta)
      refuse("rope_scaling.rope_theta disagrees with rope_theta");
    if (r.theta) v4.theta = r.theta;
  }
  Rope v5;
  if (const json* rp = find(j, "rope_parameters")) {
    const json* one = rp;
    // Per-layer-type parameters ({"full_attention": {...}, "sliding_attention": {...}}) are
    // accepted only when every layer type has the same ones.
    if (rp->is_object() && !rp->empty() &&
        (rp->contains("full_attention") || rp->contains("sliding_attention"))) {
      for (const auto& [key, value] : rp->items()) {
        if (key != "full_attention" && key != "sliding_attention")
          refuse("rope_parameters mixes per-layer-type entries with '" + key + "'");
        if (value != rp->begin().value())
          refuse("rope_parameters differ between layer types (not supported)");
      }
      one = &rp->begin().value();
    }
    v5 = parse_rope_object(*one, "rope_parameters", c.max_position_embeddings, top_original, phi3);
  }
  if (v4.theta && v5.theta && *v4.theta != *v5.theta)
    refuse("rope_theta (" + json(*v4.theta).dump() +
           ") disagrees with rope_parameters.rope_theta (" + json(*v5.theta).dump() + ")");
  if (v4.scaling && v5.scaling && !same_scaling(*v4.scaling, *v5.scaling))
    refuse("rope_scaling (type '" + v4.scaling->type + "') disagrees with rope_parameters (type '" +
           v5.scaling->type + "')");
  c.rope_theta = v5.theta.value_or(v4.theta.value_or(10000.0));
  const auto& scaling = v5.scaling ? v5.scaling : v4.scaling;
  if (scaling) c.rope_scaling = *scaling;
  if (top_partial && v5.partial_rotary_factor && *top_partial != *v5.partial_rotary_factor)
    refuse("partial_rotary_factor disagrees with rope_parameters.partial_rotary_factor");
  c.partial_rotary_factor = top_partial.value_or(v5.partial_rotary_factor.value_or(1.0));
  const int64_t rotary = c.rotary_dim();
  if (rotary < 2 || rotary % 2 != 0)
    refuse("partial_rotary_factor " + json(c.partial_rotary_factor).dump() + " gives " +
           std::to_string(rotary) + " rotary dims of head_dim " + std::to_string(c.head_dim) +
           "; RoPE needs an even number");
  const RopeScaling& s = c.rope_scaling;
  for (const auto* f : {&s.short_factor, &s.long_factor})
    if (s.type == "longrope" && static_cast<int64_t>(f->size()) != rotary / 2)
      refuse(std::string("rope_scaling.") + (f == &s.short_factor ? "short" : "long") +
             "_factor holds " + std::to_string(f->size()) + " factors; longrope needs one per " +
             "rotated frequency (" + std::to_string(rotary / 2) + ")");
}

// Which layers slide, as the model class decides it; blend supports all or none.
void read_window(const json& j, Arch arch, ModelConfig& c) {
  const json* raw = find(j, "sliding_window");
  std::optional<int64_t> window = opt_int(j, "sliding_window");
  if (arch == Arch::kMistral && !j.contains("sliding_window")) window = 4096;  // MistralConfig
  // (Phi3Config's default is None: no window when the key is absent.)
  if (window && *window <= 0)
    refuse("sliding_window must be positive (null means no window), not " + raw->dump());

  std::optional<std::vector<std::string>> layer_types;
  if (const json* lt = find(j, "layer_types")) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_layers)
      refuse("layer_types must list one type per layer (" + std::to_string(c.num_layers) + ")");
    layer_types.emplace();
    for (const auto& t : *lt) {
      if (!t.is_string() || (t != "full_attention" && t != "sliding_attention"))
        refuse("layer_types holds " + t.dump() +
               " (supported: \"full_attention\", \"sliding_attention\")");
      layer_types->push_back(t.get<std::string>());
    }
  }
  // sliding[i]: whether layer i attends through the window.
  std::vector<bool> sliding(static_cast<size_t>(c.num_layers), false);
  if (arch == Arch::kQwen2 || arch == Arch::kQwen3) {
    const bool use = opt_bool(j, "use_sliding_window").value_or(false);
    // Qwen2Config's and Qwen3Config's default.
    const int64_t first = opt_int(j, "max_window_layers").value_or(28);
    for (int64_t i = 0; i < c.num_layers; ++i)
      sliding[i] =
          use && window && (layer_types ? (*layer_types)[i] == "sliding_attention" : i >= first);
  } else if (arch == Arch::kMistral || arch == Arch::kPhi3) {
    // MistralForCausalLM and Phi3ForCausalLM apply the window on every layer whatever
    // layer_types says; a config that lists other types was meant for another model class.
    for (int64_t i = 0; i < c.num_layers; ++i) {
      sliding[i] = window.has_value();
      if (layer_types && ((*layer_types)[i] == "sliding_attention") != sliding[i])
        refuse("layer_types disagrees with sliding_window (" + c.architecture +
               " uses one for all)");
    }
  } else {
    if (window)
      refuse(
          "sliding_window is set but LlamaForCausalLM does not use one (transformers ignores "
          "it); remove it, or use MistralForCausalLM for windowed attention");
    if (layer_types)
      for (const auto& t : *layer_types)
        if (t != "full_attention") refuse("layer_types: LlamaForCausalLM has no sliding layers");
  }
  const auto n_sliding = std::count(sliding.begin(), sliding.end(), true);
  if (n_sliding != 0 && n_sliding != c.num_layers)
    refuse("a sliding window on " + std::to_string(n_sliding) + " of " +
           std::to_string(c.num_layers) + " layers is not supported (all or none)");
  if (n_sliding == c.num_layers) c.sliding_window = window;
}

bool is_gemma(Arch arch) {
  return arch == Arch::kGemma2 || arch == Arch::kGemma3;
}

// Gemma's per-layer attention (which layers slide, their window and RoPE base), its attention
// scale and soft-capping, and its activation; the defaults are Gemma2Config's / Gemma3TextConfig's.
void read_gemma(const json& j, Arch arch, ModelConfig& c) {
  GemmaSettings& g = c.gemma;
  g.enabled = true;
  const std::string act = opt_string(j, "hidden_activation").value_or("gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    refuse("hidden_activation '" + act + "' is not supported (supported: gelu_pytorch_tanh)");
  if (opt_bool(j, "use_bidirectional_attention").value_or(false))
    refuse("use_bidirectional_attention=true (EmbeddingGemma) is not supported");
  const bool gemma2 = arch == Arch::kGemma2;
  g.query_pre_attn_scalar = opt_double(j, "query_pre_attn_scalar").value_or(256);
  // An explicit null turns capping off (find() reads null as absent, so look at the key).
  auto cap = [&](const char* key, double gemma2_default) {
    const double v = opt_double(j, key).value_or(j.contains(key) || !gemma2 ? 0 : gemma2_default);
    if (v < 0) refuse(std::string(key) + " must be positive (null means none)");
    return v;
  };
  g.attn_logit_softcapping = cap("attn_logit_softcapping", 50.0);
  g.final_logit_softcapping = cap("final_logit_softcapping", 30.0);
  if (!(g.query_pre_attn_scalar > 0)) refuse("query_pre_attn_scalar must be positive");

  const auto window =
      j.contains("sliding_window") ? opt_int(j, "sliding_window") : std::optional<int64_t>(4096);
  if (window && *window <= 0) refuse("sliding_window must be positive (null means no window)");
  g.sliding_window = window.value_or(0);
  const auto pattern = opt_int(j, "sliding_window_pattern").value_or(gemma2 ? 2 : 6);
  if (pattern <= 0) refuse("sliding_window_pattern must be positive");
  g.sliding_layers.assign(static_cast<size_t>(c.num_layers), false);
  const json* lt = find(j, "layer_types");
  if (lt && (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_layers))
    refuse("layer_types must list one type per layer (" + std::to_string(c.num_layers) + ")");
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (!lt) {
      // Gemma2Config: layer i slides when (i + 1) % 2 != 0; Gemma3TextConfig the same with
      // sliding_window_pattern (every pattern-th layer is global).
      g.sliding_layers[i] = (i + 1) % pattern != 0;
      continue;
    }
    const json& t = (*lt)[static_cast<size_t>(i)];
    if (!t.is_string() || (t != "full_attention" && t != "sliding_attention"))
      refuse("layer_types holds " + t.dump() +
             " (supported: \"full_attention\", \"sliding_attention\")");
    g.sliding_layers[i] = t == "sliding_attention";
  }
  if (g.sliding_window == 0 &&
      std::find(g.sliding_layers.begin(), g.sliding_layers.end(), true) != g.sliding_layers.end())
    refuse("sliding_window is null but layer_types (or the pattern) has sliding_attention layers");
  if (!gemma2) {
    g.rope_local_theta = opt_double(j, "rope_local_base_freq").value_or(10000.0);
    if (!(*g.rope_local_theta > 0)) refuse("rope_local_base_freq must be positive");
    // Gemma3TextConfig's rope_theta default (read_rope's is Llama's 10000).
    if (!find(j, "rope_theta") && !find(j, "rope_parameters")) c.rope_theta = 1000000.0;
  } else if (find(j, "rope_local_base_freq")) {
    refuse("rope_local_base_freq is set, but Gemma2ForCausalLM uses rope_theta on every layer");
  }
}

void read_bias_and_activation(const json& j, Arch arch, ModelConfig& c) {
  // Gemma's MLP reads hidden_activation (read_gemma), never hidden_act.
  const std::string act = opt_string(j, "hidden_act").value_or("silu");
  if (!is_gemma(arch) && act != "silu" && act != "swish")
    refuse("hidden_act '" + act + "' is not supported (supported: silu)");
  if (opt_bool(j, "mlp_bias").value_or(false)) refuse("mlp_bias=true is not supported");
  const auto attention_bias = opt_bool(j, "attention_bias");
  if (arch == Arch::kQwen2) {
    if (attention_bias == false)
      refuse("attention_bias=false, but Qwen2ForCausalLM always has q/k/v biases");
    c.attention_bias = true;
  } else if (arch == Arch::kMistral) {
    if (attention_bias == true)
      refuse("attention_bias=true, but MistralForCausalLM has no attention biases");
  } else if (attention_bias == true) {
    // transformers' Llama, Qwen3 and Gemma attention put the bias on o_proj too (a checkpoint that
    // has it would otherwise run without it).
    refuse("attention_bias=true (q/k/v and o_proj biases) is not supported for " + c.architecture);
  }
  c.qk_norm = arch == Arch::kQwen3 || arch == Arch::kGemma3;  // Gemma 3: (1 + w) ones
  c.fused_checkpoint_projections = arch == Arch::kPhi3;
  if (arch == Arch::kPhi3) {
    // Keys of Phi-3/4's remote code that transformers' own Phi3 class does not read; a value
    // that would change that code's output is refused rather than run as another model.
    if (opt_bool(j, "lm_head_bias").value_or(false))
      refuse("lm_head_bias=true is not supported (Phi3ForCausalLM's lm_head has no bias)");
    for (const char* key : {"full_attn_mod", "interpolate_factor"})
      if (auto v = opt_double(j, key); v && *v != 1.0)
        refuse(std::string(key) + " other than 1 is not supported");
  }
  for (const char* key : {"quantization_config", "compression_config"})
    if (find(j, key))
      refuse(std::string(key) + " is present: quantized checkpoints are not supported");
}

DType read_dtype(const json& j) {
  auto parse = [](const std::string& field, const std::string& s) {
    if (s == "float32") return DType::kF32;
    if (s == "float16") return DType::kF16;
    if (s == "bfloat16") return DType::kBF16;
    refuse(field + " '" + s + "' is not supported (supported: float32, float16, bfloat16)");
  };
  const auto v4 = opt_string(j, "torch_dtype");
  const auto v5 = opt_string(j, "dtype");
  if (v4 && v5 && *v4 != *v5)
    refuse("torch_dtype '" + *v4 + "' disagrees with dtype '" + *v5 + "'");
  if (v5) return parse("dtype", *v5);
  if (v4) return parse("torch_dtype", *v4);
  return DType::kBF16;
}

std::vector<int32_t> token_id_list(const json& value, const std::string& field) {
  std::vector<int32_t> ids;
  if (value.is_array()) {
    for (const auto& v : value) ids.push_back(token_id(v, field));
  } else if (!value.is_null()) {
    if (!value.is_number_integer()) refuse("'" + field + "' must be an integer or a list");
    ids.push_back(token_id(value, field));
  }
  return ids;
}

std::optional<int32_t> optional_token_id(const json& j, const char* field) {
  const json* v = find(j, field);
  if (!v) return std::nullopt;
  return token_id(*v, field);
}

// Reads a small JSON file; a FIFO or device named like one is refused before it is opened.
json read_json_file(const std::filesystem::path& path) {
  std::ifstream in = open_regular_file(path, 16u << 20);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
}

// Errors from the parsers above start with "config.json: "; name the actual file instead.
template <typename F>
auto naming(const std::filesystem::path& path, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind("config.json: ", 0) == 0) msg = path.string() + msg.substr(11);
    throw Error(msg);
  }
}

}  // namespace

namespace {

// Gemma3ForConditionalGeneration (model_type gemma3, Gemma3Config): an image encoder beside a
// Gemma 3 text model whose config is the nested text_config (a Gemma3TextConfig). blend serves
// the text model: the folder reads as the Gemma3ForCausalLM text_config describes, with the
// wrapper's own token ids and dtype (which describe the whole model) over the text config's,
// and its image fields (vision_config, mm_tokens_per_image, boi/eoi/image_token_index) ignored:
// they shape only image inputs, which every route refuses. The checkpoint's language-model
// tensors are read under the text model's names (TensorStore::open_dir); image-encoder tensors
// are refused by name (check_tensors), so a text-only checkpoint loads. nullopt: not a wrapper.
std::optional<json> unwrapped_text_config(const json& j) {
  const json* a = find(j, "architectures");
  const bool named = a && a->is_array() && a->size() == 1 && (*a)[0].is_string() &&
                     (*a)[0].get<std::string>() == "Gemma3ForConditionalGeneration";
  const auto type = opt_string(j, "model_type");
  if (!named && type != "gemma3") return std::nullopt;
  if (named && type && *type != "gemma3")
    refuse("model_type '" + *type +
           "' disagrees with architectures ['Gemma3ForConditionalGeneration'] (expected gemma3)");
  if (!named && a)
    refuse("model_type 'gemma3' disagrees with architectures " + a->dump() +
           " (expected Gemma3ForConditionalGeneration)");
  const json* text = find(j, "text_config");
  if (!text || !text->is_object())
    refuse("Gemma3ForConditionalGeneration needs a 'text_config' object (its text model)");
  json out = *text;
  if (const auto text_type = opt_string(*text, "model_type", "text_config.");
      text_type && *text_type != "gemma3_text")
    refuse("text_config.model_type '" + *text_type + "' is not gemma3_text");
  out["model_type"] = "gemma3_text";
  // Published wrappers (google/gemma-3-4b-it) give only what differs from Gemma3TextConfig's
  // defaults; the ones a bare Gemma3ForCausalLM config must state are these.
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"vocab_size", 262208},
                                   {"hidden_size", 2304},
                                   {"intermediate_size", 9216},
                                   {"num_hidden_layers", 26},
                                   {"num_attention_heads", 8}})
    if (!find(out, key)) out[key] = value;
  for (const char* key : {"bos_token_id", "eos_token_id", "torch_dtype", "dtype",
                          "quantization_config", "compression_config", "tie_word_embeddings"})
    if (const json* v = find(j, key)) out[key] = *v;
  return out;
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& j) {
  if (!j.is_object()) refuse("expected a JSON object");
  if (const std::optional<json> text = unwrapped_text_config(j)) {
    try {
      return from_json(*text);
    } catch (const Error& e) {  // name the nested object the field came from
      std::string msg = e.what();
      if (msg.rfind("config.json: ", 0) == 0 && msg.find("text_config") == std::string::npos)
        msg = "config.json: text_config: " + msg.substr(13);
      throw Error(msg);
    }
  }
  ModelConfig c;
  const Arch arch = read_architecture(j, c);

  c.hidden_size = required_int(j, "hidden_size");
  c.num_layers = required_int(j, "num_hidden_layers");
  c.num_heads = required_int(j, "num_attention_heads");
  c.intermediate_size = required_int(j, "intermediate_size");
  c.vocab_size = required_int(j, "vocab_size");
  // Defaults as each transformers class has them for an absent key.
  const bool qwen = arch == Arch::kQwen2 || arch == Arch::kQwen3;
  const bool gemma = is_gemma(arch);
  const int64_t default_kv = qwen ? 32 : arch == Arch::kMistral ? 8 : gemma ? 4 : c.num_heads;
  c.num_kv_heads = opt_int(j, "num_key_value_heads").value_or(default_kv);
  const auto head_dim = opt_int(j, "head_dim");
  if (arch == Arch::kQwen3 || gemma) {
    // Qwen3Config's and Gemma's defaults, not hidden / heads.
    c.head_dim = head_dim.value_or(gemma ? 256 : 128);
  } else {
    if (!head_dim && c.num_heads > 0 && c.hidden_size % c.num_heads != 0)
      refuse("hidden_size is not a multiple of num_attention_heads and head_dim is not given");
    c.head_dim = head_dim.value_or(c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  }
  const int64_t default_max_pos = qwen                     ? 32768
                                  : arch == Arch::kMistral ? 4096 * 32
                                  : arch == Arch::kPhi3    ? 4096
                                  : arch == Arch::kGemma2  ? 8192
                                  : arch == Arch::kGemma3  ? 131072
                                                           : 2048;
  c.max_position_embeddings = opt_int(j, "max_position_embeddings").value_or(default_max_pos);
  c.rms_norm_eps = opt_double(j, "rms_norm_eps").value_or(arch == Arch::kPhi3 ? 1e-5 : 1e-6);
  c.tie_word_embeddings = opt_bool(j, "tie_word_embeddings").value_or(gemma);
  // Bounds first: the window and layer_types checks walk the layers.
  c.validate();

  read_bias_and_activation(j, arch, c);
  read_rope(j, arch, c);
  if (gemma)
    read_gemma(j, arch, c);
  else
    read_window(j, arch, c);
  c.bos_token_id = optional_token_id(j, "bos_token_id");
  if (const json* eos = find(j, "eos_token_id"))
    c.eos_token_ids = token_id_list(*eos, "eos_token_id");
  c.dtype = read_dtype(j);
  c.validate();
  return c;
}

namespace {

// The sampling fields vLLM reads from generation_config.json. A value of the wrong type or out
// of range is refused (it would change every request that relies on it); null = unset.
SamplingDefaults read_sampling_defaults(const json& gen) {
  SamplingDefaults d;
  auto number = [&](const char* key, double lo, double hi) -> std::optional<double> {
    const json* v = find(gen, key);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_number() || !(v->get<double>() >= lo && v->get<double>() <= hi))
      refuse(std::string("'") + key + "' must be a number in [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]");
    return v->get<double>();
  };
  if (auto t = number("temperature", 0, 100)) d.temperature = static_cast<float>(*t);
  if (auto t = number("top_p", 1e-9, 1)) d.top_p = static_cast<float>(*t);
  if (auto t = number("min_p", 0, 1)) d.min_p = static_cast<float>(*t);
  if (auto t = number("repetition_penalty", 1e-9, 1e6))
    d.repetition_penalty = static_cast<float>(*t);
  if (auto t = number("top_k", -1, 1e9)) d.top_k = static_cast<int32_t>(*t);
  if (auto t = number("max_new_tokens", 0, 2147483647.0)) d.max_tokens = static_cast<int32_t>(*t);
  return d;
}

}  // namespace

ModelConfig ModelConfig::from_dir(const std::filesystem::path& dir) {
  const auto config_path = dir / "config.json";
  if (!path_exists(config_path))
    throw Error("not a model folder (no config.json): " + dir.string());
  ModelConfig c = naming(config_path, [&] { return from_json(read_json_file(config_path)); });
  const auto gen_path = dir / "generation_config.json";
  if (path_exists(gen_path)) {
    const json gen = read_json_file(gen_path);
    naming(gen_path, [&] {
      if (!gen.is_object()) refuse("expected a JSON object");
      if (const json* eos = find(gen, "eos_token_id"))
        c.eos_token_ids = token_id_list(*eos, "eos_token_id");
      if (auto bos = optional_token_id(gen, "bos_token_id")) c.bos_token_id = bos;
      c.sampling_defaults = read_sampling_defaults(gen);
      return 0;
    });
  }
  return c;
}

}  // namespace blend
