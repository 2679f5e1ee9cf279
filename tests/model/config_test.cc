#include "model/config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/presets.h"
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
  EXPECT_THROW(ModelConfig::from_dir(dir / "nowhere"), Error);
}

}  // namespace
}  // namespace blend
