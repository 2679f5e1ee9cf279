#include "model/config.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend {
namespace {

using nlohmann::json;

int64_t required_int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    throw Error(std::string("config.json: missing or non-integer field '") + key + "'");
  return it->get<int64_t>();
}

template <typename T>
T optional_value(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error(std::string("config.json: field '") + key + "' has the wrong type");
  }
}

std::vector<int32_t> token_id_list(const json& value) {
  std::vector<int32_t> ids;
  if (value.is_number_integer()) {
    ids.push_back(value.get<int32_t>());
  } else if (value.is_array()) {
    for (const auto& v : value) {
      if (!v.is_number_integer()) throw Error("eos_token_id: list holds a non-integer");
      ids.push_back(v.get<int32_t>());
    }
  } else if (!value.is_null()) {
    throw Error("eos_token_id: expected an integer or a list of integers");
  }
  return ids;
}

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open " + path.string());
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
}

}  // namespace

int64_t ModelConfig::num_matmul_parameters() const {
  const int64_t attn = hidden_size * (q_dim() + 2 * kv_dim()) + q_dim() * hidden_size;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  return num_layers * (attn + mlp) + vocab_size * hidden_size;  // + lm_head
}

int64_t ModelConfig::num_parameters() const {
  const int64_t bias = attention_bias ? q_dim() + 2 * kv_dim() : 0;
  const int64_t norms = num_layers * 2 * hidden_size + hidden_size;
  const int64_t embed = vocab_size * hidden_size;
  return num_matmul_parameters() - embed + embed * (tie_word_embeddings ? 1 : 2) +
         num_layers * bias + norms;
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* what) {
    if (v <= 0) throw Error(std::string("config.json: ") + what + " must be positive");
  };
  positive(hidden_size, "hidden_size");
  positive(num_layers, "num_hidden_layers");
  positive(num_heads, "num_attention_heads");
  positive(num_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(intermediate_size, "intermediate_size");
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
  if (num_heads % num_kv_heads != 0)
    throw Error("config.json: num_attention_heads must be a multiple of num_key_value_heads");
  if (head_dim % 2 != 0) throw Error("config.json: head_dim must be even for RoPE");
  if (rms_norm_eps <= 0) throw Error("config.json: rms_norm_eps must be positive");
  if (rope_theta <= 0) throw Error("config.json: rope_theta must be positive");
}

ModelConfig ModelConfig::from_json(const json& j) {
  if (!j.is_object()) throw Error("config.json: expected a JSON object");
  ModelConfig c;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty())
    c.architecture = (*it)[0].get<std::string>();
  c.model_type = optional_value<std::string>(j, "model_type", "");
  if (c.architecture.empty()) {
    if (c.model_type == "llama") c.architecture = "LlamaForCausalLM";
    if (c.model_type == "qwen2") c.architecture = "Qwen2ForCausalLM";
    if (c.model_type == "mistral") c.architecture = "MistralForCausalLM";
  }
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  if (c.architecture != "LlamaForCausalLM" && !qwen2 && c.architecture != "MistralForCausalLM")
    throw Error("config.json: unsupported architecture '" + c.architecture +
                "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)");

  c.hidden_size = required_int(j, "hidden_size");
  c.num_layers = required_int(j, "num_hidden_layers");
  c.num_heads = required_int(j, "num_attention_heads");
  c.num_kv_heads = optional_value<int64_t>(j, "num_key_value_heads", c.num_heads);
  c.intermediate_size = required_int(j, "intermediate_size");
  c.vocab_size = required_int(j, "vocab_size");
  c.head_dim =
      optional_value<int64_t>(j, "head_dim", c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.max_position_embeddings = optional_value<int64_t>(j, "max_position_embeddings", 2048);
  c.rope_theta = optional_value<double>(j, "rope_theta", 10000.0);
  c.rms_norm_eps = optional_value<double>(j, "rms_norm_eps", 1e-6);
  c.tie_word_embeddings = optional_value<bool>(j, "tie_word_embeddings", false);
  c.attention_bias = qwen2 || optional_value<bool>(j, "attention_bias", false);
  if (optional_value<bool>(j, "mlp_bias", false))
    throw Error("config.json: mlp_bias=true is not supported");
  if (auto it = j.find("sliding_window"); it != j.end() && it->is_number_integer()) {
    // Qwen2 configs carry a window but only apply it when use_sliding_window is set.
    if (!qwen2 || optional_value<bool>(j, "use_sliding_window", false))
      c.sliding_window = it->get<int64_t>();
  }
  if (auto it = j.find("bos_token_id"); it != j.end() && it->is_number_integer())
    c.bos_token_id = it->get<int32_t>();
  if (auto it = j.find("eos_token_id"); it != j.end()) c.eos_token_ids = token_id_list(*it);

  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    const json& rs = *it;
    std::string type = optional_value<std::string>(rs, "rope_type", "");
    if (type.empty()) type = optional_value<std::string>(rs, "type", "");
    if (type == "llama3") {
      c.rope_scaling.type = "llama3";
      c.rope_scaling.factor = optional_value<double>(rs, "factor", 8.0);
      c.rope_scaling.low_freq_factor = optional_value<double>(rs, "low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = optional_value<double>(rs, "high_freq_factor", 4.0);
      c.rope_scaling.original_max_position_embeddings =
          optional_value<int64_t>(rs, "original_max_position_embeddings", 8192);
    } else if (type == "linear") {
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = optional_value<double>(rs, "factor", 1.0);
    } else if (type != "default" && !type.empty()) {
      throw Error("config.json: unsupported rope_scaling type '" + type +
                  "' (supported: llama3, linear)");
    }
  }

  const std::string dtype = optional_value<std::string>(j, "torch_dtype", "bfloat16");
  if (dtype == "float32") {
    c.dtype = DType::kF32;
  } else if (dtype == "float16") {
    c.dtype = DType::kF16;
  } else {
    c.dtype = DType::kBF16;
  }
  c.validate();
  return c;
}

ModelConfig ModelConfig::from_dir(const std::filesystem::path& dir) {
  const auto config_path = dir / "config.json";
  if (!std::filesystem::exists(config_path))
    throw Error("not a model folder (no config.json): " + dir.string());
  ModelConfig c;
  try {
    c = from_json(read_json_file(config_path));
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind("config.json", 0) == 0) msg = config_path.string() + msg.substr(11);
    throw Error(msg);
  }
  const auto gen_path = dir / "generation_config.json";
  if (std::filesystem::exists(gen_path)) {
    const json gen = read_json_file(gen_path);
    if (auto it = gen.find("eos_token_id"); it != gen.end() && !it->is_null())
      c.eos_token_ids = token_id_list(*it);
    if (auto it = gen.find("bos_token_id"); it != gen.end() && it->is_number_integer())
      c.bos_token_id = it->get<int32_t>();
  }
  return c;
}

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
  if (sliding_window) j["sliding_window"] = *sliding_window;
  if (rope_scaling.type == "llama3") {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  } else if (rope_scaling.type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
  } else {
    j["rope_scaling"] = nullptr;
  }
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

}  // namespace blend
