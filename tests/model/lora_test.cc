// model/lora: reading PEFT adapters (what is understood, what is refused with which message),
// `blend model derive --lora`, and how a zoo finds an adapter's base model.
#include "model/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "model/zoo.h"
#include "test_util.h"

namespace blend {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class LoraAdapterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    RandomInitOptions o;
    o.seed = 6;
    o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
    write_random_model(*find_model_preset("tiny"), base(), o);
    derive_lora(base(), good(), {.seed = 1, .rank = 4, .alpha = 8});
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path base() { return *dir_ / "zoo" / "base"; }
  static fs::path good() { return *dir_ / "zoo" / "tenant"; }
  static ModelConfig config() { return ModelConfig::from_dir(base()); }

  // A copy of the good adapter with its config edited by `edit`.
  fs::path edited(const std::string& name, const std::function<void(json&)>& edit) {
    const fs::path out = scratch_ / name;
    fs::create_directories(out);
    fs::copy_file(good() / "adapter_model.safetensors", out / "adapter_model.safetensors",
                  fs::copy_options::overwrite_existing);
    json j = json::parse(testing::read_file(good() / "adapter_config.json"));
    edit(j);
    testing::write_file(out / "adapter_config.json", j.dump());
    return out;
  }
  // A copy of the good adapter whose tensors are `tensors` (name -> shape, bf16 zeros).
  fs::path with_tensors(const std::string& name,
                        const std::map<std::string, std::vector<int64_t>>& tensors) {
    const fs::path out = edited(name, [](json&) {});
    std::vector<TensorToWrite> list;
    for (const auto& [tensor, shape] : tensors)
      list.push_back({tensor, DType::kBF16, shape, [](size_t, std::span<std::byte> b) {
                        std::fill(b.begin(), b.end(), std::byte{0});
                      }});
    write_safetensors(out / "adapter_model.safetensors", list);
    return out;
  }
  std::string error_of(const fs::path& adapter) {
    try {
      LoraAdapter::open(adapter, config());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  static testing::TempDir* dir_;
  testing::TempDir scratch_;
};
testing::TempDir* LoraAdapterTest::dir_ = nullptr;

TEST_F(LoraAdapterTest, ReadsWhatDeriveWrites) {
  const auto a = LoraAdapter::open(good(), config());
  EXPECT_EQ(a->rank(), 4);
  EXPECT_DOUBLE_EQ(a->scale(), 2.0);
  for (int64_t layer = 0; layer < config().num_layers; ++layer) {
    EXPECT_TRUE(a->factors(layer, LoraModule::kQ));
    EXPECT_TRUE(a->factors(layer, LoraModule::kV));
    EXPECT_FALSE(a->factors(layer, LoraModule::kK));
    EXPECT_FALSE(a->factors(layer, LoraModule::kDown));
    EXPECT_EQ(a->factors(layer, LoraModule::kQ).a->shape,
              (std::vector<int64_t>{4, config().hidden_size}));
    EXPECT_EQ(a->factors(layer, LoraModule::kV).b->shape,
              (std::vector<int64_t>{config().kv_dim(), 4}));
  }
  // B is not zero (a fresh PEFT adapter's is): the tenant must differ from its base.
  const TensorView& b = *a->factors(0, LoraModule::kQ).b;
  double sum = 0;
  for (int64_t i = 0; i < b.numel(); ++i) sum += std::abs(b.at(i));
  EXPECT_GT(sum / static_cast<double>(b.numel()), 0.05);
  EXPECT_EQ(lora_base_model(good()), fs::absolute(base()).lexically_normal().string());
  // rsLoRA scales by alpha / sqrt(r).
  const auto rs =
      LoraAdapter::open(edited("rs", [](json& j) { j["use_rslora"] = true; }), config());
  EXPECT_DOUBLE_EQ(rs->scale(), 4.0);
  // Ignored fields (training-time only) and neutral values pass.
  EXPECT_EQ(error_of(edited("ok",
                            [](json& j) {
                              j["lora_dropout"] = 0.1;
                              j["target_modules"] = "all-linear";
                              j["layers_to_transform"] = json::array({0, 1});
                              j["use_dora"] = false;
                              j["rank_pattern"] = json::object();
                            })),
            "");
}

TEST_F(LoraAdapterTest, FieldsThatChangeTheMathAreRefused) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["use_dora"] = true; }, "'use_dora' is true"},
      {[](json& j) { j["bias"] = "all"; }, "'bias' is \"all\""},
      {[](json& j) { j["modules_to_save"] = json::array({"lm_head"}); }, "'modules_to_save'"},
      {[](json& j) {
         j["rank_pattern"] = {{"q_proj", 2}};
       },
       "'rank_pattern'"},
      {[](json& j) {
         j["alpha_pattern"] = {{"q_proj", 2}};
       },
       "'alpha_pattern'"},
      {[](json& j) { j["fan_in_fan_out"] = true; }, "'fan_in_fan_out'"},
      {[](json& j) {
         j["layer_replication"] = json::array({json::array({0, 2})});
       },
       "'layer_replication'"},
      {[](json& j) { j["a_future_peft_field"] = 1; }, "unknown field 'a_future_peft_field'"},
      {[](json& j) { j["peft_type"] = "IA3"; }, "only LORA"},
      {[](json& j) { j["task_type"] = "SEQ_CLS"; }, "only CAUSAL_LM"},
      {[](json& j) { j["r"] = 0; }, "'r' must be a positive integer"},
      {[](json& j) { j.erase("lora_alpha"); }, "'lora_alpha' must be a number"},
      {[](json& j) { j["r"] = 8; }, "expected [8, 64]"},
      {[](json& j) {
         j["target_modules"] = json::array({"q_proj", "embed_tokens"});
       },
       "target_modules names \"embed_tokens\""},
      {[](json& j) { j["target_modules"] = json::array({"q_proj"}); },
       "target_modules does not name v_proj"},
      {[](json& j) { j["layers_to_transform"] = json::array({0}); },
       "layers_to_transform does not name layer 1"},
  };
  int i = 0;
  for (const auto& [edit, message] : cases) {
    const std::string error = error_of(edited("case" + std::to_string(i++), edit));
    EXPECT_NE(error.find(message), std::string::npos) << "want '" << message << "', got: " << error;
  }
}

// Phi-3's adapters name its fused qkv_proj / gate_up_proj: refused for the model, not applied
// to module names its checkpoint does not have.
TEST_F(LoraAdapterTest, AdaptersOnPhi3AreRefusedByName) {
  ModelConfig phi3 = *find_model_preset("tiny-phi3");
  try {
    LoraAdapter::open(good(), phi3);
    FAIL() << "opened a LoRA adapter on Phi-3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Phi3ForCausalLM (fused qkv_proj / gate_up_proj)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(LoraAdapterTest, BadTensorsAreRefused) {
  const ModelConfig c = config();
  const std::string q = "base_model.model.model.layers.0.self_attn.q_proj.";
  const std::vector<int64_t> a{4, c.hidden_size}, b{c.q_dim(), 4};
  auto expect = [&](const fs::path& adapter, const std::string& message) {
    const std::string error = error_of(adapter);
    EXPECT_NE(error.find(message), std::string::npos) << "want '" << message << "', got: " << error;
  };
  expect(with_tensors("noB", {{q + "lora_A.weight", a}}), "has lora_A but no lora_B");
  expect(with_tensors("shape", {{q + "lora_A.weight", a}, {q + "lora_B.weight", {c.q_dim(), 3}}}),
         "expected [" + std::to_string(c.q_dim()) + ", 4]");
  expect(with_tensors("dora", {{q + "lora_A.weight", a},
                               {q + "lora_B.weight", b},
                               {q + "lora_magnitude_vector", {c.q_dim()}}}),
         "DoRA");
  expect(
      with_tensors("deep", {{"base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight", a},
                            {"base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight", b}}),
      "for layer 7");
  expect(with_tensors("embed", {{"base_model.model.model.embed_tokens.lora_embedding_A", {4, 8}}}),
         "embedding");
  expect(with_tensors("attn_as_mlp",
                      {{"base_model.model.model.layers.0.mlp.q_proj.lora_A.weight", a},
                       {"base_model.model.model.layers.0.mlp.q_proj.lora_B.weight", b}}),
         "not a LoRA factor");
  const fs::path pickle = edited("pickle", [](json&) {});
  fs::remove(pickle / "adapter_model.safetensors");
  testing::write_file(pickle / "adapter_model.bin", "not read");
  expect(pickle, "adapter_model.bin (pickle)");
  const fs::path broken = edited("broken", [](json&) {});
  testing::write_file(broken / "adapter_config.json", "{\"r\": ");
  expect(broken, "not valid JSON");
}

TEST_F(LoraAdapterTest, AZooServesAnAdapterOnItsBase) {
  // By path: base_model_name_or_path is the base's absolute folder.
  auto folders = model_folders("", "", *dir_ / "zoo");
  ASSERT_EQ(folders.size(), 2u);
  EXPECT_EQ(folders[1].name, "tenant");
  EXPECT_EQ(folders[1].dir, base());
  EXPECT_EQ(folders[1].adapter, good());
  EXPECT_TRUE(folders[0].adapter.empty());
  // By name: a hub id whose last component names a model of the zoo.
  testing::TempDir zoo;
  fs::copy(base(), zoo / "SmolLM-135M");
  fs::create_directories(zoo / "hub");
  fs::copy(good(), zoo / "hub");
  json j = json::parse(testing::read_file(zoo / "hub" / "adapter_config.json"));
  j["base_model_name_or_path"] = "HuggingFaceTB/SmolLM-135M";
  testing::write_file(zoo / "hub" / "adapter_config.json", j.dump());
  folders = model_folders("", "", zoo.path());
  ASSERT_EQ(folders.size(), 2u);
  EXPECT_EQ(folders[0].name, "SmolLM-135M");
  EXPECT_EQ(folders[1].name, "hub");
  EXPECT_EQ(folders[1].dir, zoo / "SmolLM-135M");
  // --model may name an adapter whose base is a folder.
  folders = model_folders(good(), "", "");
  ASSERT_EQ(folders.size(), 1u);
  EXPECT_EQ(folders[0].adapter, good());
  // A base that is nowhere.
  j["base_model_name_or_path"] = "org/missing";
  testing::write_file(zoo / "hub" / "adapter_config.json", j.dump());
  try {
    model_folders("", "", zoo.path());
    FAIL() << "an adapter without its base was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'org/missing'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("SmolLM-135M"), std::string::npos) << e.what();
  }
}

// vLLM's --lora-modules NAME=DIR: adapters on --model whatever base their config names.
TEST_F(LoraAdapterTest, LoraModulesApplyToTheModelFlag) {
  testing::TempDir other;
  fs::copy(base(), other / "served");
  const auto folders = model_folders(other / "served", "", "",
                                     {"sql=" + good().string(), "again=" + good().string()});
  ASSERT_EQ(folders.size(), 3u);
  EXPECT_EQ(folders[1].name, "sql");
  EXPECT_EQ(folders[1].dir, other / "served");  // not the base its config names
  EXPECT_EQ(folders[1].adapter, good());
  EXPECT_EQ(folders[2].name, "again");
  auto error = [&](const fs::path& model, const std::string& module) {
    try {
      model_folders(model, "", "", {module});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(other / "served", "noequals").find("NAME=DIR"), std::string::npos);
  EXPECT_NE(error(other / "served", "=dir").find("NAME=DIR"), std::string::npos);
  try {
    model_folders("", "", *dir_ / "zoo", {"a=" + good().string()});
    ADD_FAILURE() << "--lora-modules without --model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("applies adapters to --model"), std::string::npos);
  }
  EXPECT_NE(error(other / "served", "a=" + base().string()).find("not a LoRA adapter"),
            std::string::npos);
  EXPECT_NE(error(other / "served", "served=" + good().string()).find("two models are named"),
            std::string::npos);
}

TEST(LoraTargets, ParsesModuleLists) {
  EXPECT_EQ(parse_lora_targets("q_proj,v_proj"),
            (std::vector<LoraModule>{LoraModule::kQ, LoraModule::kV}));
  EXPECT_EQ(parse_lora_targets("all-linear").size(), 7u);
  EXPECT_THROW(parse_lora_targets("q_proj,lm_head"), Error);
  EXPECT_THROW(parse_lora_targets(""), Error);
}

}  // namespace
}  // namespace blend
