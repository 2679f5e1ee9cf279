// Small random models for backend tests, generated once per test program: the "tiny" preset
// (hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16, untied lm_head) with a 4,096-token
// vocabulary, and variants of it for each feature the backends must get right.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "model/config.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace blend::testing {

struct TestModel {
  TempDir dir;
  ModelConfig config;
  TensorStore store;
};

// "base", or: "qwen2" (QKV bias), "llama3" (llama3 RoPE scaling in all three bands, tied
// embeddings), "linear" (linear RoPE scaling), "hd64" (head_dim 64, 2 query heads per KV head),
// "hd128" (Llama-3-8B's head geometry: head_dim 128, 4 query heads per KV head), "mistral"
// (sliding window 6), "mistral-hd128" (both), "qwen3" (per-head q/k norms; head_dim 32, so q
// is twice as wide as the residual stream), "phi3" (the tiny-phi3 preset: fused qkv_proj and
// gate_up_proj, 12 of 16 dims rotated, longrope over an original 1024 positions), "gemma2" /
// "gemma3" (the tiny-gemma2 / tiny-gemma3 presets, query_pre_attn_scalar apart from head_dim).
inline ModelConfig test_model_config(const std::string& variant) {
  if (variant == "gemma2" || variant == "gemma3") {
    ModelConfig g = *find_model_preset("tiny-" + variant);
    g.vocab_size = 4096;
    g.gemma.query_pre_attn_scalar = 24;
    return g;
  }
  ModelConfig c = *find_model_preset(variant == "phi3" ? "tiny-phi3" : "tiny");
  // A small vocabulary keeps generation, loading and the references' lm_heads cheap (the tests
  // also run under sanitizers); the lm_head code path does not depend on the vocabulary size.
  c.vocab_size = 4096;
  if (variant == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
    c.attention_bias = true;
  } else if (variant == "llama3") {
    // Small original context so that head_dim 16's frequencies fall in all three bands
    // (kept, interpolated, divided by factor).
    c.rope_scaling = {.type = "llama3",
                      .factor = 8.0,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0,
                      .original_max_position_embeddings = 64};
    c.tie_word_embeddings = true;
  } else if (variant == "linear") {
    c.rope_scaling = {.type = "linear", .factor = 4.0};
  } else if (variant == "hd64") {
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 64;
  } else if (variant == "hd128") {
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = 128;
  } else if (variant == "qwen3") {
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.qk_norm = true;
    c.head_dim = 32;
    c.rms_norm_eps = 1e-6;
  } else if (variant == "mistral" || variant == "mistral-hd128") {
    c.architecture = "MistralForCausalLM";
    c.model_type = "mistral";
    c.sliding_window = 6;
    if (variant == "mistral-hd128") {
      c.num_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim = 128;
    }
  }
  return c;
}

// The "tiny" preset with the real Llama-3 tokenizer (its full vocabulary), written to `dir`:
// the model the engine, server and CLI tests serve.
inline void write_tiny_model(const std::filesystem::path& dir, uint64_t seed) {
  RandomInitOptions o;
  o.seed = seed;
  o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  write_random_model(*find_model_preset("tiny"), dir, o);
}

// The variant written once (seed 11) in `dtype` and loaded; kept for the whole program.
inline const TestModel& test_model(const std::string& variant, DType dtype) {
  static std::map<std::pair<std::string, DType>, std::unique_ptr<TestModel>> cache;
  auto& slot = cache[{variant, dtype}];
  if (!slot) {
    auto m = std::make_unique<TestModel>();
    RandomInitOptions o;
    o.seed = 11;
    o.dtype = dtype;
    o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
    write_random_model(test_model_config(variant), m->dir.path(), o);
    m->config = ModelConfig::from_dir(m->dir.path());
    m->store = TensorStore::open_dir(m->dir.path());
    slot = std::move(m);
  }
  return *slot;
}

}  // namespace blend::testing
