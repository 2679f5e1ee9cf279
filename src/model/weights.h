// The tensor layout of a Llama-family checkpoint (Hugging Face names and shapes), shared by the
// loader and by `blend model init`, so that what we write is exactly what we expect to read.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace blend {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  enum class Kind { kEmbedding, kNorm, kBias, kLinear, kResidualOutput, kLmHead } kind;
  int64_t fan_in = 0;  // input features of a linear layer (0 for others)
};

// Every tensor a LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM / Phi3ForCausalLM /
// MistralForCausalLM / Gemma2ForCausalLM / Gemma3ForCausalLM folder holds, in the order HF
// writes them (embedding, layers 0..L-1, final norm, lm_head unless tied).
std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& config);
// llama_tensor_specs(config).size(), computed without building the list.
int64_t llama_tensor_count(const ModelConfig& config);

std::string layer_tensor_name(int64_t layer, const char* suffix);  // model.layers.{i}.{suffix}

}  // namespace blend

namespace blend {

class TensorStore;
struct TensorView;

// A Llama-family checkpoint's tensors grouped as the forward pass uses them: Q, K and V (and
// their biases when the config has them) fused into one projection, gate and up into one; the
// lm_head is the embedding when the config ties them. Every backend binds its weights from
// this one reading of the names (issue 24: the model described once).
struct LlamaLayerTensors {
  const TensorView* attention_norm = nullptr;
  std::vector<const TensorView*> qkv;       // q_proj, k_proj, v_proj; or Phi-3's qkv_proj
  std::vector<const TensorView*> qkv_bias;  // their biases, or empty
  const TensorView* q_norm = nullptr;       // per-head norms (ModelConfig::qk_norm), or null
  const TensorView* k_norm = nullptr;
  const TensorView* o = nullptr;
  const TensorView* ffn_norm = nullptr;
  // Gemma's norms of the attention and MLP outputs before their residual adds, or null.
  const TensorView* post_attention_norm = nullptr;
  const TensorView* post_ffn_norm = nullptr;
  std::vector<const TensorView*> gate_up;  // gate_proj, up_proj; or Phi-3's gate_up_proj
  const TensorView* down = nullptr;
};
struct LlamaTensors {
  const TensorView* embedding = nullptr;
  std::vector<LlamaLayerTensors> layers;
  const TensorView* final_norm = nullptr;
  const TensorView* lm_head = nullptr;
};
// The tensors of `store` by the names of `config`'s layout; throws blend::Error (the store's)
// for a missing one. The views point into `store`.
LlamaTensors bind_llama_tensors(const ModelConfig& config, const TensorStore& store);

// Checks that `store` holds exactly the tensors of llama_tensor_specs(config), with the right
// shapes and one dtype; throws blend::Error naming the first offender. Returns the dtype. A
// tensor the config does not use (a layer past num_hidden_layers, a q_norm on a model without
// one) is refused by name: running without it would be another model. The tensor count is
// compared first, so a config that claims more layers than the checkpoint holds is refused
// before its tensor list is built.
//
// Block-quantized matrices (Q8_0, Q5_0, Q4_K, Q6_K, from a GGUF file) are refused by name
// unless `quantized` is kAllowMatrices, where the embedding and the linear layers may be of
// those types while the rest share one float dtype, which is returned. Only the cpu backend
// runs them.
enum class QuantizedWeights { kRefuse, kAllowMatrices };
DType check_tensors(const ModelConfig& config, const TensorStore& store,
                    QuantizedWeights quantized = QuantizedWeights::kRefuse);

}  // namespace blend
