#include "model/presets.h"

#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace blend {
namespace {

// One table serves `model init` (materialisable presets) and the cost model (every preset).
TEST(ModelPresets, OneTableForInitAndTheCostModel) {
  std::set<std::string> names;
  for (const ModelPreset& p : model_presets()) {
    EXPECT_TRUE(names.insert(p.name).second) << "duplicate preset " << p.name;
    EXPECT_NO_THROW(p.config.validate()) << p.name;
    ASSERT_TRUE(find_model_shape(p.name).has_value()) << p.name;
    EXPECT_EQ(find_model_shape(p.name)->to_json(), p.config.to_json()) << p.name;
    EXPECT_EQ(find_model_preset(p.name).has_value(), p.materialisable) << p.name;
  }
  EXPECT_EQ(model_preset_names(),
            (std::vector<std::string>{"tiny", "smollm-135m", "llama-3.2-1b", "tiny-qwen3",
                                      "qwen3-0.6b", "tiny-qwen2", "qwen2.5-0.5b", "tiny-phi3",
                                      "phi4-mini", "tiny-gemma2", "tiny-gemma3", "gemma3-1b-6l"}));
  EXPECT_EQ(shape_only_preset_names(),
            (std::vector<std::string>{"llama-3-8b", "llama-3-70b", "llama-2-7b", "qwen2.5-7b",
                                      "qwen2.5-72b", "qwen3-8b", "phi3-mini", "gemma2-9b",
                                      "gemma3-27b", "deepseek-67b"}));
  EXPECT_EQ(large_model_preset_names(), (std::vector<std::string>{"llama-3-8b", "llama-3-70b"}));
  EXPECT_FALSE(find_model_shape("opt-13b").has_value());  // the cost model's own OPT formula
  // Figures the cost model reads, pinned: Llama-3-8B's 8.03B parameters, Qwen2.5-7B's bias.
  EXPECT_EQ(find_model_shape("llama-3-8b")->num_parameters(), 8030261248);
  EXPECT_TRUE(find_model_shape("qwen2.5-7b")->attention_bias);
  EXPECT_EQ(find_model_preset("smollm-135m")->num_parameters(), 180078912);
  // Qwen3-8B's 8.19B (head_dim 128, per-head q/k norms, untied head).
  EXPECT_EQ(find_model_shape("qwen3-8b")->num_parameters(), 8190735360);
  EXPECT_TRUE(find_model_preset("qwen3-0.6b")->qk_norm);
  EXPECT_TRUE(find_model_preset("tiny-qwen2")->attention_bias);
  // Phi-3-mini's 3,821,079,552 (its model card's 3.8B; fused projections count as the split ones).
  EXPECT_EQ(find_model_shape("phi3-mini")->num_parameters(), 3821079552);
  // Phi-4-mini's layers: 96 of 128 dims rotated, longrope's 48 factors, tied.
  const ModelConfig phi4 = *find_model_preset("phi4-mini");
  EXPECT_TRUE(phi4.fused_checkpoint_projections);
  EXPECT_EQ(phi4.rotary_dim(), 96);
  EXPECT_EQ(phi4.rope_scaling.long_factor.size(), 48u);
  // Its layers hold Phi-4-mini's 3,836,021,760 less the 200,064 x 3072 tied embedding and the
  // final norm (the preset's vocabulary is Llama-3's).
  EXPECT_EQ(phi4.num_parameters() - phi4.vocab_size * phi4.hidden_size - phi4.hidden_size,
            3836021760 - 200064 * 3072 - 3072);
  // Gemma-2-9B's 9,241,705,984 (four norms a layer, tied head).
  EXPECT_EQ(find_model_shape("gemma2-9b")->num_parameters(), 9241705984);
}

// `model init --allow-large` writes the shapes with the Llama-3 vocabulary, with the Llama-3
// tokenizer's token ids added; the shape table the cost model reads keeps none.
TEST(ModelPresets, LargePresetsAreTheShapesWithLlama3Tokens) {
  const ModelConfig shape = *find_model_shape("llama-3-8b");
  const ModelConfig large = *find_large_model_preset("llama-3-8b");
  EXPECT_FALSE(shape.bos_token_id.has_value());
  EXPECT_EQ(large.bos_token_id, 128000);
  EXPECT_EQ(large.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(large.num_parameters(), shape.num_parameters());
  EXPECT_EQ(large.hidden_size, 4096);
  EXPECT_NO_THROW(large.validate());
  EXPECT_EQ(find_large_model_preset("tiny")->to_json(), find_model_preset("tiny")->to_json());
  EXPECT_FALSE(find_large_model_preset("qwen2.5-7b").has_value());  // another vocabulary
  EXPECT_FALSE(find_large_model_preset("llama-2-7b").has_value());
  EXPECT_FALSE(find_large_model_preset("nope").has_value());
}

}  // namespace
}  // namespace blend
