// Gemma 2 / Gemma 3 config.json as transformers reads it (model/config_json.cc read_gemma).
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/presets.h"

namespace blend {
namespace {

using nlohmann::json;

// google/gemma-2-2b's config.json as published.
json gemma2_2b_config() {
  return json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
    "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4",
    "use_cache": true, "vocab_size": 256000})");
}

// google/gemma-3-1b-it's config.json as published.
json gemma3_1b_config() {
  return json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})");
}

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

void expect_refused(json j, const std::string& key, const json& value, const std::string& expect) {
  j[key] = value;
  const std::string msg = error_of(j);
  EXPECT_NE(msg.find(expect), std::string::npos) << key << " -> " << msg;
}

std::vector<bool> sliding_of(const std::vector<int64_t>& global, int64_t layers) {
  std::vector<bool> s(static_cast<size_t>(layers), true);
  for (int64_t g : global) s[static_cast<size_t>(g)] = false;
  return s;
}

TEST(GemmaConfig, Gemma2ReadsItsCapsScaleAndAlternatingWindows) {
  const ModelConfig c = ModelConfig::from_json(gemma2_2b_config());
  const GemmaSettings& g = c.gemma;
  EXPECT_TRUE(g.enabled);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);  // Gemma2Config's default: the checkpoint has no lm_head
  EXPECT_EQ(g.query_pre_attn_scalar, 256);
  EXPECT_EQ(g.attn_logit_softcapping, 50);
  EXPECT_EQ(g.final_logit_softcapping, 30);
  EXPECT_EQ(g.sliding_window, 4096);
  EXPECT_FALSE(g.rope_local_theta.has_value());
  EXPECT_FALSE(c.sliding_window.has_value());  // the all-layers window stays Mistral's
  // Gemma2Config: layer i slides when (i + 1) % 2 != 0, so 0, 2, 4, ... slide.
  std::vector<int64_t> odd;
  for (int64_t i = 1; i < 26; i += 2) odd.push_back(i);
  EXPECT_EQ(g.sliding_layers, sliding_of(odd, 26));
  EXPECT_TRUE(g.sliding(0));
  EXPECT_FALSE(g.sliding(1));
  // gemma-2-2b's 2,614,341,888 parameters: four norms a layer, tied head.
  EXPECT_EQ(c.num_parameters(), 2614341888);

  // Gemma2Config's defaults when the keys are absent; null turns a cap off.
  json bare = gemma2_2b_config();
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping",
                          "query_pre_attn_scalar", "head_dim", "hidden_activation"})
    bare.erase(key);
  const ModelConfig d = ModelConfig::from_json(bare);
  EXPECT_EQ(d.gemma.attn_logit_softcapping, 50);
  EXPECT_EQ(d.gemma.final_logit_softcapping, 30);
  EXPECT_EQ(d.gemma.query_pre_attn_scalar, 256);
  EXPECT_EQ(d.head_dim, 256);
  json off = gemma2_2b_config();
  off["attn_logit_softcapping"] = nullptr;
  EXPECT_EQ(ModelConfig::from_json(off).gemma.attn_logit_softcapping, 0);
}

TEST(GemmaConfig, Gemma3ReadsThePatternLocalRopeAndHeadNorms) {
  const ModelConfig c = ModelConfig::from_json(gemma3_1b_config());
  const GemmaSettings& g = c.gemma;
  EXPECT_EQ(c.architecture, "Gemma3ForCausalLM");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(g.attn_logit_softcapping, 0);
  EXPECT_EQ(g.final_logit_softcapping, 0);
  EXPECT_EQ(g.sliding_window, 512);
  EXPECT_EQ(g.rope_local_theta, 10000.0);
  EXPECT_EQ(c.rope_theta, 1000000.0);
  // Every 6th layer is global: 5, 11, 17, 23.
  EXPECT_EQ(g.sliding_layers, sliding_of({5, 11, 17, 23}, 26));
  // gemma-3-1b's 999,885,952 parameters (q/k norms of head_dim, tied head).
  EXPECT_EQ(c.num_parameters(), 999885952);

  // layer_types wins over the pattern; another pattern moves the global layers.
  json types = gemma3_1b_config();
  types["num_hidden_layers"] = 3;
  types["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  EXPECT_EQ(ModelConfig::from_json(types).gemma.sliding_layers, sliding_of({0, 2}, 3));
  json pattern = gemma3_1b_config();
  pattern["sliding_window_pattern"] = 3;
  pattern["num_hidden_layers"] = 6;
  EXPECT_EQ(ModelConfig::from_json(pattern).gemma.sliding_layers, sliding_of({2, 5}, 6));
  // Gemma3TextConfig's defaults: rope_theta 1e6, local base 10000.
  json bare = gemma3_1b_config();
  bare.erase("rope_theta");
  bare.erase("rope_local_base_freq");
  const ModelConfig d = ModelConfig::from_json(bare);
  EXPECT_EQ(d.rope_theta, 1000000.0);
  EXPECT_EQ(d.gemma.rope_local_theta, 10000.0);
  // A linear rope_scaling (Gemma 3 4B and up) is read; it applies to the global layers.
  json scaled = gemma3_1b_config();
  scaled["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  EXPECT_EQ(ModelConfig::from_json(scaled).rope_scaling.type, "linear");
}

// google/gemma-3-4b-it's config.json as published: a Gemma3ForConditionalGeneration whose
// text_config states only what differs from Gemma3TextConfig's defaults.
json gemma3_4b_wrapper_config() {
  return json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}})");
}

// Issue 56: the text part of a Gemma3ForConditionalGeneration folder is the Gemma3ForCausalLM
// its text_config describes, with Gemma3TextConfig's defaults for what it leaves out and the
// wrapper's EOS ids and dtype.
TEST(GemmaConfig, Gemma3ConditionalGenerationReadsItsTextConfig) {
  const ModelConfig c = ModelConfig::from_json(gemma3_4b_wrapper_config());
  EXPECT_EQ(c.architecture, "Gemma3ForCausalLM");
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.intermediate_size, 10240);
  EXPECT_EQ(c.num_layers, 34);
  EXPECT_EQ(c.num_heads, 8);  // Gemma3TextConfig's defaults from here on
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 262208);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.gemma.sliding_window, 1024);
  EXPECT_EQ(c.gemma.query_pre_attn_scalar, 256);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1, 106}));
  // The wrapper's dtype describes the whole checkpoint: it wins over the text config's.
  json f32 = gemma3_4b_wrapper_config();
  f32["torch_dtype"] = "float32";
  f32["text_config"]["torch_dtype"] = "bfloat16";
  EXPECT_EQ(ModelConfig::from_json(f32).dtype, DType::kF32);
  // The same text model written as a Gemma3ForCausalLM config reads the same.
  json text = gemma3_4b_wrapper_config()["text_config"];
  text["architectures"] = {"Gemma3ForCausalLM"};
  for (const char* key : {"vocab_size", "num_attention_heads"}) text.erase(key);
  text["vocab_size"] = 262208;
  text["num_attention_heads"] = 8;
  text["eos_token_id"] = {1, 106};
  text["torch_dtype"] = "bfloat16";
  const ModelConfig direct = ModelConfig::from_json(text);
  EXPECT_EQ(direct.gemma, c.gemma);
  EXPECT_EQ(direct.num_parameters(), c.num_parameters());
  EXPECT_EQ(direct.rope_theta, c.rope_theta);

  // What it cannot be: no text model, another text model, a disagreeing pair of names; and a
  // text_config field refused as a bare config's would be, naming text_config.
  json no_text = gemma3_4b_wrapper_config();
  no_text.erase("text_config");
  EXPECT_NE(error_of(no_text).find("needs a 'text_config' object"), std::string::npos)
      << error_of(no_text);
  json other = gemma3_4b_wrapper_config();
  other["text_config"]["model_type"] = "gemma2";
  EXPECT_NE(error_of(other).find("text_config.model_type 'gemma2' is not gemma3_text"),
            std::string::npos)
      << error_of(other);
  json disagreeing = gemma3_4b_wrapper_config();
  disagreeing["model_type"] = "paligemma";
  EXPECT_NE(error_of(disagreeing).find("model_type 'paligemma' disagrees"), std::string::npos)
      << error_of(disagreeing);
  json bias = gemma3_4b_wrapper_config();
  bias["text_config"]["attention_bias"] = true;
  EXPECT_NE(error_of(bias).find("config.json: text_config: "), std::string::npos) << error_of(bias);
  EXPECT_NE(error_of(bias).find("attention_bias"), std::string::npos) << error_of(bias);
  json quantized = gemma3_4b_wrapper_config();
  quantized["quantization_config"] = {{"quant_method", "bitsandbytes"}};
  EXPECT_NE(error_of(quantized).find("quantization_config"), std::string::npos)
      << error_of(quantized);
}

TEST(GemmaConfig, WhatGemmaNeedsAndIsNotImplementedIsRefusedByName) {
  expect_refused(gemma2_2b_config(), "hidden_activation", "gelu", "hidden_activation 'gelu'");
  expect_refused(gemma3_1b_config(), "use_bidirectional_attention", true,
                 "use_bidirectional_attention");
  expect_refused(gemma3_1b_config(), "attention_bias", true, "attention_bias=true");
  expect_refused(gemma3_1b_config(), "layer_types", json::array({"full_attention"}),
                 "layer_types must list one type per layer (26)");
  expect_refused(gemma3_1b_config(), "sliding_window", nullptr, "sliding_window is null");
  expect_refused(gemma2_2b_config(), "rope_local_base_freq", 10000, "rope_local_base_freq");
  expect_refused(gemma2_2b_config(), "final_logit_softcapping", -1, "final_logit_softcapping");
  // A model_type naming another class than architectures.
  expect_refused(gemma3_1b_config(), "model_type", "gemma2", "disagrees with architectures");
}

TEST(GemmaConfig, PresetsRoundTripThroughConfigJson) {
  for (const char* name :
       {"tiny-gemma2", "tiny-gemma3", "gemma3-1b-6l", "gemma2-9b", "gemma3-27b"}) {
    const ModelConfig c = *find_model_shape(name);
    const ModelConfig back = ModelConfig::from_json(c.to_json());
    EXPECT_EQ(architecture_difference(c, back), "") << name;
    EXPECT_EQ(back.gemma, c.gemma) << name;
    EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings) << name;
  }
  const ModelConfig g3 = *find_model_preset("tiny-gemma3");
  EXPECT_EQ(g3.rope_scaling.type, "linear");
  EXPECT_EQ(g3.gemma.sliding_layers, (std::vector<bool>{true, false}));
  EXPECT_FALSE(find_model_preset("gemma2-9b").has_value());  // a shape only
}

}  // namespace
}  // namespace blend
