#include "model/config.h"

#include <sys/stat.h>

#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/presets.h"
#include "model/rope.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

json llama32_1b_config() {
  // The config.json of meta-llama/Llama-3.2-1B-Instruct (abridged to the fields we read).
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
}

TEST(ModelConfig, ParsesLlama32) {
  const ModelConfig c = ModelConfig::from_json(llama32_1b_config());
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 16);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.kv_dim(), 512);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  // Llama-3.2-1B has 1.236B parameters (tied embeddings).
  EXPECT_EQ(c.num_parameters(), 1235814400);
}

TEST(ModelConfig, Qwen2HasQkvBiasAndIgnoresUnusedWindow) {
  json j = json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "sliding_window": 32768, "use_sliding_window": false, "tie_word_embeddings": true,
    "max_position_embeddings": 32768, "eos_token_id": 151645})");
  const ModelConfig c = ModelConfig::from_json(j);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 64);  // derived from hidden / heads
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151645});
  // Qwen2.5-0.5B: 494M parameters.
  EXPECT_EQ(c.num_parameters(), 494032768);
}

// Qwen3-0.6B's config.json as published: per-head q/k norms, head_dim 128 over hidden 1024.
json qwen3_06b_config() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(ModelConfig, MistralSlidingWindow) {
  json j = json::parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
    "sliding_window": 4096, "max_position_embeddings": 32768})");
  const ModelConfig c = ModelConfig::from_json(j);
  ASSERT_TRUE(c.sliding_window.has_value());
  EXPECT_EQ(*c.sliding_window, 4096);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ModelConfig, ClearErrors) {
  json j = llama32_1b_config();
  j["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_THROW(ModelConfig::from_json(j), Error);

  j = llama32_1b_config();
  j.erase("hidden_size");
  try {
    ModelConfig::from_json(j);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
  }

  j = llama32_1b_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THROW(ModelConfig::from_json(j), Error);

  j = llama32_1b_config();
  j["num_key_value_heads"] = 5;  // 32 heads are not a multiple of 5
  EXPECT_THROW(ModelConfig::from_json(j), Error);

  j = llama32_1b_config();
  j["hidden_size"] = "2048";
  EXPECT_THROW(ModelConfig::from_json(j), Error);
}

// The same model as transformers 5 saves it: rope_parameters (theta inside) instead of
// rope_theta + rope_scaling, dtype instead of torch_dtype.
json llama32_1b_config_v5() {
  json j = llama32_1b_config();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["rope_parameters"] = {{"rope_type", "llama3"},  {"rope_theta", 500000.0},
                          {"factor", 32.0},         {"high_freq_factor", 4.0},
                          {"low_freq_factor", 1.0}, {"original_max_position_embeddings", 8192}};
  j["dtype"] = "bfloat16";
  j["transformers_version"] = "5.0.0";
  return j;
}

// What from_json makes of `j`, as comparable JSON (every field of ModelConfig is in to_json).
std::string parsed(const json& j) {
  return ModelConfig::from_json(j).to_json().dump();
}

std::string error_of(const json& j) {
  try {
    ModelConfig::from_json(j);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a blend::Error: ") + e.what();
  }
  return "(accepted)";
}

// `edit` applied to the Llama-3.2 config must be refused with a blend::Error naming `expect`.
void expect_refused(const std::function<void(json&)>& edit, const std::string& expect,
                    json base = llama32_1b_config()) {
  edit(base);
  const std::string msg = error_of(base);
  EXPECT_EQ(msg.rfind("config.json: ", 0), 0u) << base.dump() << " -> " << msg;
  EXPECT_NE(msg.find(expect), std::string::npos) << base.dump() << " -> " << msg;
}

TEST(ModelConfig, Qwen3HasHeadNormsAndItsOwnHeadDim) {
  const ModelConfig c = ModelConfig::from_json(qwen3_06b_config());
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 2048);  // twice the residual stream
  EXPECT_FALSE(c.sliding_window.has_value());
  // Qwen3-0.6B: 596,049,920 parameters, 440M outside the embedding (its model card).
  EXPECT_EQ(c.num_parameters(), 596049920);
  // Qwen3Config's head_dim defaults to 128, not hidden / heads (which would be 64 here).
  json no_head_dim = qwen3_06b_config();
  no_head_dim.erase("head_dim");
  EXPECT_EQ(ModelConfig::from_json(no_head_dim).head_dim, 128);
  // Llama and Qwen3 attention put a bias on o_proj as well as q/k/v: refused, not run without it.
  expect_refused([](json& j) { j["attention_bias"] = true; }, "o_proj", qwen3_06b_config());
  expect_refused([](json& j) { j["attention_bias"] = true; }, "o_proj");
  // A window on some layers only is refused as for Qwen2.
  expect_refused(
      [](json& j) {
        j["use_sliding_window"] = true;
        j["sliding_window"] = 4096;
        j["max_window_layers"] = 14;
      },
      "sliding window on 14 of 28 layers", qwen3_06b_config());
}

// Phi-4-mini-instruct's config.json as published (its 48 short and long factors replaced by
// stand-ins of the same count): fused projections, 3/4 of each head rotated, longrope.
json phi4_mini_config() {
  json j = json::parse(R"({
    "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1,
    "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 8192, "interpolate_factor": 1, "lm_head_bias": false,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "phi3",
    "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "original_max_position_embeddings": 4096, "pad_token_id": 199999,
    "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"type": "longrope"}, "rope_theta": 10000.0, "sliding_window": 262144,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.45.0",
    "use_cache": true, "vocab_size": 200064})");
  for (int i = 0; i < 48; ++i) {
    j["rope_scaling"]["short_factor"].push_back(1.0 + 0.001 * i);
    j["rope_scaling"]["long_factor"].push_back(1.0 + 0.5 * i);
  }
  return j;
}

TEST(ModelConfig, Phi4MiniHasFusedProjectionsPartialRopeAndLongrope) {
  const ModelConfig c = ModelConfig::from_json(phi4_mini_config());
  EXPECT_EQ(c.architecture, "Phi3ForCausalLM");
  EXPECT_TRUE(c.fused_checkpoint_projections);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim(), 96);
  EXPECT_EQ(c.rope_scaling.type, "longrope");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope_scaling.long_factor.size(), 48u);
  EXPECT_DOUBLE_EQ(c.rope_scaling.long_factor[2], 2.0);
  // scale 131072 / 4096 = 32: sqrt(1 + ln 32 / ln 4096) = sqrt(1 + 5/12).
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_NEAR(c.rope_scaling.attention_factor, std::sqrt(17.0 / 12.0), 1e-15);
  EXPECT_EQ(*c.sliding_window, 262144);
  EXPECT_TRUE(c.tie_word_embeddings);
  // A given attention_factor wins; Phi3Config's defaults (eps 1e-5, no window).
  json j = phi4_mini_config();
  j["rope_scaling"]["attention_factor"] = 1.5;
  j.erase("rms_norm_eps");
  j.erase("sliding_window");
  const ModelConfig d = ModelConfig::from_json(j);
  EXPECT_EQ(d.rope_scaling.attention_factor, 1.5);
  EXPECT_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_FALSE(d.sliding_window.has_value());
  // Phi-3-mini-4k: no scaling, full rotary, its window.
  j = phi4_mini_config();
  j["rope_scaling"] = nullptr;
  j.erase("partial_rotary_factor");
  j["sliding_window"] = 2047;
  const ModelConfig mini = ModelConfig::from_json(j);
  EXPECT_EQ(mini.rotary_dim(), 128);
  EXPECT_EQ(mini.rope_scaling.type, "none");
  EXPECT_EQ(*mini.sliding_window, 2047);
  // The config.json model init writes reads back as the same network.
  EXPECT_EQ(architecture_difference(ModelConfig::from_json(c.to_json()), c), "");
  // transformers 5's layout: RoPE, partial_rotary_factor and the original length folded into
  // rope_parameters.
  json v5 = phi4_mini_config();
  v5["rope_parameters"] = v5["rope_scaling"];
  v5["rope_parameters"].erase("type");
  v5["rope_parameters"]["rope_type"] = "longrope";
  v5["rope_parameters"]["rope_theta"] = 10000.0;
  v5["rope_parameters"]["partial_rotary_factor"] = 0.75;
  v5["rope_parameters"]["original_max_position_embeddings"] = 4096;
  for (const char* key :
       {"rope_scaling", "rope_theta", "partial_rotary_factor", "original_max_position_embeddings"})
    v5.erase(key);
  EXPECT_EQ(architecture_difference(ModelConfig::from_json(v5), c), "");
}

TEST(ModelConfig, Phi3FieldsThatWouldChangeTheResultAreRefusedByName) {
  // Partial RoPE and longrope elsewhere than on Phi3.
  expect_refused([](json& j) { j["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor");
  expect_refused(
      [](json& j) {
        j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1}}, {"long_factor", {1}}};
      },
      "'longrope' in 'rope_scaling' (supported for Phi3ForCausalLM only)");
  const json phi = phi4_mini_config();
  expect_refused([](json& j) { j["rope_scaling"]["short_factor"].erase(0); },
                 "rope_scaling.short_factor holds 47 factors", phi);
  expect_refused([](json& j) { j["rope_scaling"].erase("long_factor"); }, "long_factor", phi);
  expect_refused([](json& j) { j["rope_scaling"]["long_factor"][3] = -1; }, "long_factor", phi);
  expect_refused([](json& j) { j["rope_scaling"]["type"] = "su"; }, "unsupported RoPE type 'su'",
                 phi);
  expect_refused([](json& j) { j["rope_scaling"]["mscale"] = 2; }, "mscale", phi);
  expect_refused([](json& j) { j["rope_scaling"]["factor"] = 16; }, "'rope_scaling.factor' (16.0)",
                 phi);
  expect_refused([](json& j) { j["partial_rotary_factor"] = 0.7; },
                 "partial_rotary_factor 0.7 gives 89 rotary dims", phi);
  expect_refused([](json& j) { j["partial_rotary_factor"] = 1.5; }, "(0, 1]", phi);
  expect_refused([](json& j) { j["lm_head_bias"] = true; }, "lm_head_bias", phi);
  expect_refused([](json& j) { j["interpolate_factor"] = 2; }, "interpolate_factor", phi);
  expect_refused([](json& j) { j["full_attn_mod"] = 2; }, "full_attn_mod", phi);
  expect_refused([](json& j) { j["attention_bias"] = true; }, "attention_bias", phi);
  expect_refused([](json& j) { j["layer_types"] = std::vector<std::string>(32, "full_attention"); },
                 "layer_types disagrees with sliding_window (Phi3ForCausalLM", phi);
}

// Hand-computed: head_dim 8 at partial_rotary_factor 0.5 rotates 4 dims, frequencies
// 10000^(-0/4) = 1 and 10000^(-2/4) = 0.01, divided by the short factors (1, 2) or the long ones
// (4, 8); 4096 positions over an original 1024 give sqrt(1 + ln 4 / ln 1024) = sqrt(1.2).
TEST(Rope, LongropeFrequenciesAndTheirBatchInvariantChoice) {
  json j = phi4_mini_config();
  j["hidden_size"] = 32;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["partial_rotary_factor"] = 0.5;
  j["max_position_embeddings"] = 4096;
  j["original_max_position_embeddings"] = 1024;
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1, 2}}, {"long_factor", {4, 8}}};
  const ModelConfig c = ModelConfig::from_json(j);
  ASSERT_EQ(c.rotary_dim(), 4);
  EXPECT_NEAR(rope_attention_factor(c), std::sqrt(1.2), 1e-15);
  // The engine's longest sequence decides, not the batch: 4096 (the default) and 1025 take
  // the long factors, 1024 and less the short ones.
  EXPECT_TRUE(rope_uses_long_factors(c, 0));
  EXPECT_TRUE(rope_uses_long_factors(c, 1025));
  EXPECT_FALSE(rope_uses_long_factors(c, 1024));
  const std::vector<double> lng = rope_inv_freq(c), shrt = rope_inv_freq(c, 1024);
  ASSERT_EQ(lng.size(), 2u);
  EXPECT_NEAR(lng[0], 0.25, 1e-15);
  EXPECT_NEAR(lng[1], 0.00125, 1e-15);
  EXPECT_NEAR(shrt[0], 1.0, 1e-15);
  EXPECT_NEAR(shrt[1], 0.005, 1e-15);
  // Full rotary without scaling: head_dim / 2 frequencies and no cos/sin factor.
  j["rope_scaling"] = nullptr;
  j.erase("partial_rotary_factor");
  const ModelConfig full = ModelConfig::from_json(j);
  EXPECT_EQ(rope_inv_freq(full).size(), 4u);
  EXPECT_EQ(rope_attention_factor(full), 1.0);
}

TEST(ModelConfig, TransformersFiveLayoutReadsAsFour) {
  const ModelConfig v5 = ModelConfig::from_json(llama32_1b_config_v5());
  EXPECT_EQ(v5.rope_scaling.type, "llama3");  // the old reader ran default RoPE here
  EXPECT_DOUBLE_EQ(v5.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(v5.rope_theta, 500000.0);
  EXPECT_EQ(parsed(llama32_1b_config_v5()), parsed(llama32_1b_config()));

  // Both layouts at once (transformers 5 reading a 4 folder keeps rope_scaling) agree.
  json both = llama32_1b_config();
  both["rope_parameters"] = llama32_1b_config_v5()["rope_parameters"];
  both["dtype"] = "bfloat16";
  EXPECT_EQ(parsed(both), parsed(llama32_1b_config()));

  // transformers 5 defaults original_max_position_embeddings to max_position_embeddings, and
  // the top-level key (Phi-3 style) wins.
  json j = llama32_1b_config_v5();
  j["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(ModelConfig::from_json(j).rope_scaling.original_max_position_embeddings, 131072);
  j["original_max_position_embeddings"] = 8192;
  EXPECT_EQ(parsed(j), parsed(llama32_1b_config()));

  // Linear scaling, legacy "type" key, float32 (v4) against rope_type + dtype (v5).
  json v4 = llama32_1b_config();
  v4["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  v4["rope_theta"] = 10000.0;
  v4["torch_dtype"] = "float32";
  json v5l = llama32_1b_config_v5();
  v5l["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 10000.0}};
  v5l["dtype"] = "float32";
  EXPECT_EQ(parsed(v5l), parsed(v4));
  EXPECT_EQ(ModelConfig::from_json(v5l).dtype, DType::kF32);

  // Default RoPE: rope_parameters carries only the theta.
  json plain4 = llama32_1b_config();
  plain4.erase("rope_scaling");
  json plain5 = llama32_1b_config_v5();
  plain5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  EXPECT_EQ(parsed(plain5), parsed(plain4));

  // Qwen2 and Mistral as transformers 5 writes them.
  json qwen = json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-06,
    "sliding_window": null, "use_sliding_window": false, "max_window_layers": 24,
    "layer_types": null, "tie_word_embeddings": true, "max_position_embeddings": 32768,
    "eos_token_id": 151645, "dtype": "bfloat16",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})");
  json qwen4 = qwen;
  qwen4.erase("rope_parameters");
  qwen4.erase("dtype");
  qwen4["rope_theta"] = 1000000.0;
  qwen4["rope_scaling"] = nullptr;
  qwen4["torch_dtype"] = "bfloat16";
  EXPECT_EQ(parsed(qwen), parsed(qwen4));
  EXPECT_DOUBLE_EQ(ModelConfig::from_json(qwen).rope_theta, 1000000.0);

  json mistral = json::parse(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 32000, "rms_norm_eps": 1e-05,
    "sliding_window": 4096, "max_position_embeddings": 32768, "dtype": "bfloat16",
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})");
  json mistral4 = mistral;
  mistral4.erase("rope_parameters");
  mistral4.erase("dtype");
  mistral4["rope_theta"] = 1000000.0;
  mistral4["torch_dtype"] = "bfloat16";
  EXPECT_EQ(parsed(mistral), parsed(mistral4));
  EXPECT_EQ(ModelConfig::from_json(mistral).sliding_window, 4096);
}

TEST(ModelConfig, LayoutsThatDisagreeAreRefused) {
  expect_refused(
      [](json& j) {
        j["rope_parameters"] = {{"rope_type", "default"}};
      },
      "disagrees with rope_parameters");
  expect_refused(
      [](json& j) {
        j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}};
      },
      "rope_theta");
  expect_refused([](json& j) { j["dtype"] = "float32"; }, "disagrees with dtype");
  expect_refused([](json& j) { j["rope_scaling"]["type"] = "linear"; }, "disagrees with type");
  expect_refused([](json& j) { j["original_max_position_embeddings"] = 4096; },
                 "original_max_position_embeddings");
  expect_refused(
      [](json& j) {
        j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}},
                                {"sliding_attention", {{"rope_type", "linear"}, {"factor", 2}}}};
        j.erase("rope_scaling");
      },
      "differ between layer types");
}

TEST(ModelConfig, FieldsThatChangeTheMathAreRefused) {
  expect_refused([](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act");
  expect_refused(
      [](json& j) {
        j["quantization_config"] = {{"quant_method", "gptq"}};
      },
      "quantization_config");
  for (const char* type : {"yarn", "dynamic", "longrope", "ntk", "mrope"})
    expect_refused(
        [&](json& j) {
          j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
        },
        std::string("unsupported RoPE type '") + type + "'");
  expect_refused([](json& j) { j["rope_scaling"]["attention_factor"] = 1.2; }, "attention_factor");
  expect_refused(
      [](json& j) {
        j["rope_scaling"] = {{"type", "linear"}, {"beta_fast", 32}};
      },
      "beta_fast");
  expect_refused([](json& j) { j["rope_scaling"].erase("low_freq_factor"); }, "low_freq_factor");
  expect_refused([](json& j) { j["partial_rotary_factor"] = 0.5; }, "partial_rotary_factor");
  expect_refused([](json& j) { j["rope_scaling"]["partial_rotary_factor"] = 0.5; },
                 "partial_rotary_factor");
  expect_refused([](json& j) { j["mlp_bias"] = true; }, "mlp_bias");
  expect_refused([](json& j) { j["sliding_window"] = 4096; }, "LlamaForCausalLM");
  expect_refused([](json& j) { j["head_dim"] = 63; }, "head_dim");
  expect_refused([](json& j) { j["tie_word_embeddings"] = "true"; }, "tie_word_embeddings");
  expect_refused([](json& j) { j["tie_word_embeddings"] = 1; }, "tie_word_embeddings");
  expect_refused([](json& j) { j["attention_bias"] = "no"; }, "attention_bias");
  expect_refused([](json& j) { j["model_type"] = "qwen2"; }, "disagrees with architectures");
  expect_refused(
      [](json& j) {
        j["architectures"] = {"LlamaForCausalLM", "Qwen2ForCausalLM"};
      },
      "architectures");

  json mistral = llama32_1b_config();
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  expect_refused([](json& j) { j["attention_bias"] = true; }, "attention_bias", mistral);
  expect_refused(
      [](json& j) {
        j["sliding_window"] = 4096;
        j["layer_types"] = json::array();
        for (int i = 0; i < 16; ++i)
          j["layer_types"].push_back(i % 2 ? "sliding_attention" : "full_attention");
      },
      "layer_types", mistral);

  json qwen = llama32_1b_config();
  qwen["architectures"] = {"Qwen2ForCausalLM"};
  qwen["model_type"] = "qwen2";
  qwen.erase("attention_bias");
  expect_refused([](json& j) { j["attention_bias"] = false; }, "attention_bias", qwen);
  // Qwen2 slides only from max_window_layers on: half the layers is not supported.
  expect_refused(
      [](json& j) {
        j["sliding_window"] = 4096;
        j["use_sliding_window"] = true;
        j["max_window_layers"] = 8;
      },
      "8 of 16 layers", qwen);
}

TEST(ModelConfig, WindowsFollowEachModelClass) {
  json mistral = llama32_1b_config();
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  mistral.erase("rope_scaling");
  EXPECT_EQ(ModelConfig::from_json(mistral).sliding_window, 4096);  // MistralConfig's default
  mistral["sliding_window"] = nullptr;
  EXPECT_FALSE(ModelConfig::from_json(mistral).sliding_window.has_value());
  mistral["sliding_window"] = 128;
  EXPECT_EQ(ModelConfig::from_json(mistral).sliding_window, 128);

  json qwen = mistral;
  qwen["architectures"] = {"Qwen2ForCausalLM"};
  qwen["model_type"] = "qwen2";
  qwen.erase("attention_bias");
  qwen["use_sliding_window"] = true;
  qwen["max_window_layers"] = 0;  // every layer slides
  EXPECT_EQ(ModelConfig::from_json(qwen).sliding_window, 128);
  qwen["max_window_layers"] = 16;  // none does
  EXPECT_FALSE(ModelConfig::from_json(qwen).sliding_window.has_value());
  qwen["layer_types"] = std::vector<std::string>(16, "sliding_attention");  // wins (v5)
  EXPECT_EQ(ModelConfig::from_json(qwen).sliding_window, 128);

  // Round trip through to_json keeps "no window" and "window on every layer".
  for (const json& j : {mistral, qwen}) {
    for (const json& window : {json(nullptr), json(64)}) {
      json k = j;
      k["sliding_window"] = window;
      k.erase("layer_types");
      k["max_window_layers"] = 0;
      const ModelConfig c = ModelConfig::from_json(k);
      EXPECT_EQ(ModelConfig::from_json(c.to_json()).sliding_window, c.sliding_window) << k.dump();
    }
  }
}

TEST(ModelConfig, AcceptedNonsenseIsRefused) {
  // Sizes far beyond any model are refused before anything is built from them (this one grew
  // to 6.6 GB of tensor specs before).
  expect_refused([](json& j) { j["num_hidden_layers"] = 1000000000; }, "num_hidden_layers");
  expect_refused([](json& j) { j["hidden_size"] = json::number_unsigned_t{1} << 63; },
                 "hidden_size");
  expect_refused([](json& j) { j["vocab_size"] = int64_t{1} << 40; }, "vocab_size");
  expect_refused([](json& j) { j["num_key_value_heads"] = 2.5; }, "num_key_value_heads");
  // Token ids are range-checked before narrowing (2^40 used to wrap to 0).
  expect_refused([](json& j) { j["bos_token_id"] = int64_t{1} << 40; }, "bos_token_id");
  expect_refused([](json& j) { j["eos_token_id"] = int64_t{1} << 40; }, "eos_token_id");
  expect_refused([](json& j) { j["eos_token_id"] = {128001, int64_t{1} << 40}; }, "eos_token_id");
  expect_refused([](json& j) { j["eos_token_id"] = -1; }, "eos_token_id");
  expect_refused([](json& j) { j["eos_token_id"] = "</s>"; }, "eos_token_id");
  expect_refused([](json& j) { j["torch_dtype"] = "int8"; }, "int8");
  expect_refused([](json& j) { j["rope_scaling"]["factor"] = 0.0; }, "factor");
  expect_refused([](json& j) { j["rope_scaling"]["factor"] = -2.0; }, "factor");
  expect_refused([](json& j) { j["rope_scaling"]["high_freq_factor"] = 1.0; }, "high_freq_factor");
  expect_refused([](json& j) { j["rope_scaling"] = "llama3"; }, "rope_scaling");
  expect_refused([](json& j) { j["rms_norm_eps"] = 1e300; }, "rms_norm_eps");
  expect_refused([](json& j) { j["rms_norm_eps"] = 0.0; }, "rms_norm_eps");
  expect_refused([](json& j) { j["rope_theta"] = -1.0; }, "rope_theta");
  json mistral = llama32_1b_config();
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  expect_refused([](json& j) { j["sliding_window"] = 0; }, "sliding_window", mistral);
  expect_refused([](json& j) { j["sliding_window"] = -4096; }, "sliding_window", mistral);
  // Wrong JSON types name the field instead of escaping as an internal JSON error.
  expect_refused([](json& j) { j["architectures"] = {1}; }, "architectures");
  expect_refused([](json& j) { j["architectures"] = "LlamaForCausalLM"; }, "architectures");
  expect_refused([](json& j) { j["model_type"] = 7; }, "model_type");
  expect_refused([](json& j) { j["use_sliding_window"] = "yes"; }, "use_sliding_window",
                 [] {
                   json q = llama32_1b_config();
                   q["architectures"] = {"Qwen2ForCausalLM"};
                   q["model_type"] = "qwen2";
                   q.erase("attention_bias");
                   return q;
                 }());
}

TEST(ModelConfig, FifoAndBadGenerationConfigAreRefused) {
  testing::TempDir dir;
  testing::write_file(dir / "config.json", llama32_1b_config().dump());
  testing::write_file(dir / "generation_config.json", R"({"eos_token_id": 1099511627776})");
  try {
    ModelConfig::from_dir(dir.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json: 'eos_token_id'"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(dir / "generation_config.json");
  std::filesystem::remove(dir / "config.json");
  ASSERT_EQ(::mkfifo((dir / "config.json").c_str(), 0600), 0);
  // Would block in open() for a writer that never comes; refused at once instead.
  EXPECT_THROW(ModelConfig::from_dir(dir.path()), Error);
}

// generation_config.json's sampling defaults (the fields vLLM takes from it); a value of the
// wrong type is refused, naming the file and the field.
TEST(ModelConfig, GenerationConfigSamplingDefaults) {
  testing::TempDir dir;
  testing::write_file(dir / "config.json", llama32_1b_config().dump());
  testing::write_file(dir / "generation_config.json",
                      R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 20,)"
                      R"( "repetition_penalty": 1.05, "max_new_tokens": 64})");
  const SamplingDefaults d = ModelConfig::from_dir(dir.path()).sampling_defaults;
  EXPECT_FLOAT_EQ(*d.temperature, 0.6f);
  EXPECT_FLOAT_EQ(*d.top_p, 0.9f);
  EXPECT_EQ(*d.top_k, 20);
  EXPECT_FLOAT_EQ(*d.repetition_penalty, 1.05f);
  EXPECT_EQ(*d.max_tokens, 64);
  EXPECT_FALSE(d.min_p);

  testing::write_file(dir / "generation_config.json", R"({"temperature": "hot"})");
  try {
    ModelConfig::from_dir(dir.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json: 'temperature'"),
              std::string::npos)
        << e.what();
  }
  testing::write_file(dir / "generation_config.json", R"({"eos_token_id": 1})");
  EXPECT_TRUE(ModelConfig::from_dir(dir.path()).sampling_defaults.empty());
}

TEST(ModelConfig, FromDirPrefersGenerationConfigAndRoundTrips) {
  testing::TempDir dir;
  ModelConfig c = *find_model_preset("smollm-135m");
  c.eos_token_ids = {128001};
  testing::write_file(dir / "config.json", c.to_json().dump());
  testing::write_file(dir / "generation_config.json", R"({"eos_token_id": [128001, 128009]})");
  const ModelConfig back = ModelConfig::from_dir(dir.path());
  EXPECT_EQ(back.eos_token_ids, (std::vector<int32_t>{128001, 128009}));
  EXPECT_EQ(back.hidden_size, c.hidden_size);
  EXPECT_EQ(back.num_kv_heads, c.num_kv_heads);
  EXPECT_EQ(back.num_parameters(), c.num_parameters());

  testing::write_file(dir / "config.json", "{not json");
  try {
    ModelConfig::from_dir(dir.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  // A number too large for a double is JSON's out_of_range, not a parse_error: it used to escape
  // as an uncaught exception (the safetensors fuzzer found the same in a header).
  testing::write_file(dir / "config.json", R"({"hidden_size": 1e999})");
  try {
    ModelConfig::from_dir(dir.path());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("number overflow"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ModelConfig::from_dir(dir / "nowhere"), Error);
}

}  // namespace
}  // namespace blend
