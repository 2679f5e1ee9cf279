#include "model/weights.h"

namespace blend {

std::string layer_tensor_name(int64_t layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& c) {
  using K = TensorSpec::Kind;
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}, K::kEmbedding, 0});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto name = [&](const char* s) { return layer_tensor_name(i, s); };
    specs.push_back({name("input_layernorm.weight"), {h}, K::kNorm, 0});
    if (c.fused_checkpoint_projections) {
      specs.push_back({name("self_attn.qkv_proj.weight"), {q + 2 * kv, h}, K::kLinear, h});
    } else {
      specs.push_back({name("self_attn.q_proj.weight"), {q, h}, K::kLinear, h});
      specs.push_back({name("self_attn.k_proj.weight"), {kv, h}, K::kLinear, h});
      specs.push_back({name("self_attn.v_proj.weight"), {kv, h}, K::kLinear, h});
    }
    if (c.attention_bias) {
      specs.push_back({name("self_attn.q_proj.bias"), {q}, K::kBias, 0});
      specs.push_back({name("self_attn.k_proj.bias"), {kv}, K::kBias, 0});
      specs.push_back({name("self_attn.v_proj.bias"), {kv}, K::kBias, 0});
    }
    specs.push_back({name("self_attn.o_proj.weight"), {h, q}, K::kResidualOutput, q});
    if (c.qk_norm) {  // (after o_proj, in the name order safetensors files list them)
      specs.push_back({name("self_attn.q_norm.weight"), {c.head_dim}, K::kNorm, 0});
      specs.push_back({name("self_attn.k_norm.weight"), {c.head_dim}, K::kNorm, 0});
    }
    specs.push_back({name("post_attention_layernorm.weight"), {h}, K::kNorm, 0});
    if (c.gemma.enabled) {  // Gemma: post_attention_layernorm is the attention output's norm
      specs.push_back({name("pre_feedforward_layernorm.weight"), {h}, K::kNorm, 0});
      specs.push_back({name("post_feedforward_layernorm.weight"), {h}, K::kNorm, 0});
    }
    if (c.fused_checkpoint_projections) {
      specs.push_back({name("mlp.gate_up_proj.weight"), {2 * f, h}, K::kLinear, h});
    } else {
      specs.push_back({name("mlp.gate_proj.weight"), {f, h}, K::kLinear, h});
      specs.push_back({name("mlp.up_proj.weight"), {f, h}, K::kLinear, h});
    }
    specs.push_back({name("mlp.down_proj.weight"), {h, f}, K::kResidualOutput, f});
  }
  specs.push_back({"model.norm.weight", {h}, K::kNorm, 0});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}, K::kLmHead, h});
  return specs;
}

int64_t llama_tensor_count(const ModelConfig& c) {
  const int64_t per_layer = (c.fused_checkpoint_projections ? 6 : 9) + (c.attention_bias ? 3 : 0) +
                            (c.qk_norm ? 2 : 0) + (c.gemma.enabled ? 2 : 0);
  return 1 + c.num_layers * per_layer + 1 + (c.tie_word_embeddings ? 0 : 1);
}

}  // namespace blend

#include <unordered_set>

#include "core/error.h"
#include "model/safetensors.h"

namespace blend {

DType check_tensors(const ModelConfig& config, const TensorStore& store,
                    QuantizedWeights quantized) {
  const int64_t expected = llama_tensor_count(config);
  const auto held = static_cast<int64_t>(store.tensors().size());
  if (expected > held)
    throw Error("config.json describes " + std::to_string(config.num_layers) + " layers (" +
                std::to_string(expected) + " tensors) but the checkpoint holds only " +
                std::to_string(held) + " tensors");
  std::optional<DType> dtype;
  const std::vector<TensorSpec> specs = llama_tensor_specs(config);
  if (held > expected) {
    std::unordered_set<std::string> used;
    for (const TensorSpec& spec : specs) used.insert(spec.name);
    for (const auto& [name, view] : store.tensors())
      // (RoPE's inverse frequencies, which old checkpoints saved and transformers ignores)
      if (!used.count(name) && !name.ends_with(".rotary_emb.inv_freq")) {
        for (const char* image : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                  "model.multi_modal_projector."})
          if (name.starts_with(image))
            throw Error(view->file->string() + ": tensor '" + name +
                        "' belongs to the image encoder, which blend does not serve; the text "
                        "part of a multimodal model loads from a checkpoint of its language model "
                        "alone");
        throw Error(view->file->string() + ": tensor '" + name + "' is not used by " +
                    config.architecture + " as config.json describes it (" +
                    std::to_string(config.num_layers) +
                    " layers); a checkpoint of another model or config is refused rather than run "
                    "without it");
      }
  }
  for (const auto& spec : specs) {
    const TensorView& t = store.get(spec.name, spec.shape);
    if (is_block_type(t.dtype)) {
      if (quantized == QuantizedWeights::kRefuse)
        throw Error(t.file->string() + ": tensor '" + spec.name + "' is " +
                    std::string(dtype_name(t.dtype)) +
                    " (block-quantized, from a GGUF file); only the cpu backend runs quantized "
                    "weights, and this use of the model takes f32, bf16 or f16 tensors");
      if (spec.kind == TensorSpec::Kind::kNorm || spec.kind == TensorSpec::Kind::kBias)
        throw Error(t.file->string() + ": tensor '" + spec.name + "' is " +
                    std::string(dtype_name(t.dtype)) +
                    "; norms and biases are read as floats, only matrices may be quantized");
      continue;
    }
    if (dtype && t.dtype != *dtype)
      throw Error(t.file->string() + ": tensor '" + spec.name + "' is " +
                  std::string(dtype_name(t.dtype)) + " but earlier tensors are " +
                  std::string(dtype_name(*dtype)) + " (mixed dtypes are not supported)");
    dtype = t.dtype;
  }
  return *dtype;
}

LlamaTensors bind_llama_tensors(const ModelConfig& config, const TensorStore& store) {
  auto get = [&](const std::string& name) { return &store.get(name); };
  LlamaTensors t;
  t.embedding = get("model.embed_tokens.weight");
  for (int64_t i = 0; i < config.num_layers; ++i) {
    auto name = [&](const char* suffix) { return get(layer_tensor_name(i, suffix)); };
    LlamaLayerTensors& l = t.layers.emplace_back();
    l.attention_norm = name("input_layernorm.weight");
    // A fused checkpoint tensor is blend's fused layout already (rows q, k, v; gate, up).
    if (config.fused_checkpoint_projections)
      l.qkv = {name("self_attn.qkv_proj.weight")};
    else
      l.qkv = {name("self_attn.q_proj.weight"), name("self_attn.k_proj.weight"),
               name("self_attn.v_proj.weight")};
    if (config.attention_bias)
      l.qkv_bias = {name("self_attn.q_proj.bias"), name("self_attn.k_proj.bias"),
                    name("self_attn.v_proj.bias")};
    if (config.qk_norm) {
      l.q_norm = name("self_attn.q_norm.weight");
      l.k_norm = name("self_attn.k_norm.weight");
    }
    l.o = name("self_attn.o_proj.weight");
    if (config.gemma.enabled) {
      l.post_attention_norm = name("post_attention_layernorm.weight");
      l.ffn_norm = name("pre_feedforward_layernorm.weight");
      l.post_ffn_norm = name("post_feedforward_layernorm.weight");
    } else {
      l.ffn_norm = name("post_attention_layernorm.weight");
    }
    if (config.fused_checkpoint_projections)
      l.gate_up = {name("mlp.gate_up_proj.weight")};
    else
      l.gate_up = {name("mlp.gate_proj.weight"), name("mlp.up_proj.weight")};
    l.down = name("mlp.down_proj.weight");
  }
  t.final_norm = get("model.norm.weight");
  t.lm_head = config.tie_word_embeddings ? t.embedding : get("lm_head.weight");
  return t;
}

}  // namespace blend
