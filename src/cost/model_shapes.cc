#include "cost/model_shapes.h"

#include "model/presets.h"

namespace blend {
namespace {

ModelConfig shape(std::string arch, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t ffn, int64_t vocab, double theta, int64_t max_pos) {
  ModelConfig c;
  c.architecture = std::move(arch);
  c.model_type = c.architecture == "Qwen2ForCausalLM" ? "qwen2" : "llama";
  c.hidden_size = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.intermediate_size = ffn;
  c.vocab_size = vocab;
  c.rope_theta = theta;
  c.max_position_embeddings = max_pos;
  c.attention_bias = c.architecture == "Qwen2ForCausalLM";
  return c;
}

}  // namespace

std::optional<ModelConfig> find_model_shape(std::string_view name) {
  if (auto small = find_model_preset(name)) return small;
  if (name == "llama-3-8b")
    return shape("LlamaForCausalLM", 4096, 32, 32, 8, 14336, 128256, 500000, 8192);
  if (name == "llama-3-70b")
    return shape("LlamaForCausalLM", 8192, 80, 64, 8, 28672, 128256, 500000, 8192);
  if (name == "llama-2-7b")
    return shape("LlamaForCausalLM", 4096, 32, 32, 32, 11008, 32000, 10000, 4096);
  if (name == "qwen2.5-7b")
    return shape("Qwen2ForCausalLM", 3584, 28, 28, 4, 18944, 152064, 1000000, 32768);
  if (name == "qwen2.5-72b")
    return shape("Qwen2ForCausalLM", 8192, 80, 64, 8, 29568, 152064, 1000000, 32768);
  if (name == "deepseek-67b")
    return shape("LlamaForCausalLM", 8192, 95, 64, 8, 22016, 102400, 10000, 4096);
  return std::nullopt;
}

std::vector<std::string> shape_only_preset_names() {
  return {"llama-3-8b", "llama-3-70b", "llama-2-7b", "qwen2.5-7b", "qwen2.5-72b", "deepseek-67b"};
}

}  // namespace blend
