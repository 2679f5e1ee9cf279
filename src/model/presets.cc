#include "model/presets.h"

namespace blend {
namespace {

ModelConfig llama_like(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn,
                       bool tied) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.hidden_size = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.intermediate_size = ffn;
  c.vocab_size = kLlama3VocabSize;
  c.max_position_embeddings = 8192;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};  // end_of_text, eom, eot (Llama-3 instruct)
  return c;
}

}  // namespace

std::optional<ModelConfig> find_model_preset(std::string_view name) {
  if (name == "tiny") {
    // Untied so the separate lm_head path is exercised by the tests.
    return llama_like(/*hidden=*/64, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2, /*ffn=*/128,
                      /*tied=*/false);
  }
  if (name == "smollm-135m") return llama_like(576, 30, 9, 3, 1536, true);
  if (name == "llama-3.2-1b") {
    ModelConfig c = llama_like(2048, 16, 32, 8, 8192, true);
    c.max_position_embeddings = 131072;
    c.rope_scaling = {.type = "llama3",
                      .factor = 32.0,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0,
                      .original_max_position_embeddings = 8192};
    return c;
  }
  return std::nullopt;
}

std::vector<std::string> model_preset_names() {
  return {"tiny", "smollm-135m", "llama-3.2-1b"};
}

}  // namespace blend
