#include "model/weights.h"

#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/safetensors.h"
#include "test_models.h"

namespace blend {
namespace {

using testing::test_model;

TEST(BindLlamaTensors, GroupsEveryLayersTensorsAsTheForwardPassUsesThem) {
  const auto& m = test_model("base", DType::kBF16);
  const LlamaTensors t = bind_llama_tensors(m.config, m.store);
  ASSERT_EQ(static_cast<int64_t>(t.layers.size()), m.config.num_layers);
  EXPECT_EQ(t.embedding, &m.store.get("model.embed_tokens.weight"));
  EXPECT_EQ(t.final_norm, &m.store.get("model.norm.weight"));
  EXPECT_EQ(t.lm_head, &m.store.get("lm_head.weight"));  // untied
  const LlamaLayerTensors& last = t.layers.back();
  const int64_t l = m.config.num_layers - 1;
  auto at = [&](const char* suffix) { return &m.store.get(layer_tensor_name(l, suffix)); };
  EXPECT_EQ(last.attention_norm, at("input_layernorm.weight"));
  ASSERT_EQ(last.qkv.size(), 3u);
  EXPECT_EQ(last.qkv[0], at("self_attn.q_proj.weight"));
  EXPECT_EQ(last.qkv[1], at("self_attn.k_proj.weight"));
  EXPECT_EQ(last.qkv[2], at("self_attn.v_proj.weight"));
  EXPECT_TRUE(last.qkv_bias.empty());
  EXPECT_EQ(last.o, at("self_attn.o_proj.weight"));
  EXPECT_EQ(last.ffn_norm, at("post_attention_layernorm.weight"));
  ASSERT_EQ(last.gate_up.size(), 2u);
  EXPECT_EQ(last.gate_up[0], at("mlp.gate_proj.weight"));
  EXPECT_EQ(last.gate_up[1], at("mlp.up_proj.weight"));
  EXPECT_EQ(last.down, at("mlp.down_proj.weight"));
}

TEST(BindLlamaTensors, TiedHeadIsTheEmbeddingAndBiasesComeWithTheConfig) {
  const auto& tied = test_model("llama3", DType::kBF16);
  const LlamaTensors t = bind_llama_tensors(tied.config, tied.store);
  EXPECT_EQ(t.lm_head, t.embedding);

  const auto& qwen = test_model("qwen2", DType::kBF16);
  const LlamaTensors q = bind_llama_tensors(qwen.config, qwen.store);
  ASSERT_EQ(q.layers[0].qkv_bias.size(), 3u);
  EXPECT_EQ(q.layers[0].qkv_bias[1],
            &qwen.store.get(layer_tensor_name(0, "self_attn.k_proj.bias")));

  // A config that asks for biases the checkpoint lacks is refused, not bound to nothing.
  ModelConfig wants_bias = tied.config;
  wants_bias.attention_bias = true;
  EXPECT_THROW(bind_llama_tensors(wants_bias, tied.store), Error);
}

TEST(BindLlamaTensors, Qwen3BindsEachLayersHeadNorms) {
  const auto& m = test_model("qwen3", DType::kF32);
  const LlamaTensors t = bind_llama_tensors(m.config, m.store);
  EXPECT_EQ(t.layers[1].q_norm, &m.store.get(layer_tensor_name(1, "self_attn.q_norm.weight")));
  EXPECT_EQ(t.layers[1].k_norm, &m.store.get(layer_tensor_name(1, "self_attn.k_norm.weight")));
  EXPECT_EQ(t.layers[1].q_norm->shape, std::vector<int64_t>{32});
  EXPECT_EQ(check_tensors(m.config, m.store), DType::kF32);
}

// Gemma's post_attention_layernorm is the attention output's norm; the MLP's input norm is
// pre_feedforward_layernorm, and its output has one more.
TEST(BindLlamaTensors, GemmaBindsItsFourNormsALayer) {
  const auto& m = test_model("gemma2", DType::kF32);
  const LlamaTensors t = bind_llama_tensors(m.config, m.store);
  auto get = [&](const char* suffix) { return &m.store.get(layer_tensor_name(1, suffix)); };
  EXPECT_EQ(t.layers[1].post_attention_norm, get("post_attention_layernorm.weight"));
  EXPECT_EQ(t.layers[1].ffn_norm, get("pre_feedforward_layernorm.weight"));
  EXPECT_EQ(t.layers[1].post_ffn_norm, get("post_feedforward_layernorm.weight"));
  EXPECT_EQ(t.lm_head, t.embedding);  // tied
  EXPECT_EQ(check_tensors(m.config, m.store), DType::kF32);
  EXPECT_EQ(bind_llama_tensors(test_model("base", DType::kF32).config,
                               test_model("base", DType::kF32).store)
                .layers[0]
                .post_ffn_norm,
            nullptr);
}

std::string check_error(const ModelConfig& config, const TensorStore& store) {
  try {
    check_tensors(config, store);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Phi-3's fused checkpoint tensors are bound as one part each (their rows are blend's fused
// order), and a shape that does not fit the config is refused naming the tensor.
TEST(BindLlamaTensors, Phi3BindsItsFusedProjections) {
  const auto& m = test_model("phi3", DType::kF32);
  const LlamaTensors t = bind_llama_tensors(m.config, m.store);
  ASSERT_EQ(t.layers[1].qkv.size(), 1u);
  EXPECT_EQ(t.layers[1].qkv[0], &m.store.get(layer_tensor_name(1, "self_attn.qkv_proj.weight")));
  EXPECT_EQ(t.layers[1].qkv[0]->shape, (std::vector<int64_t>{64 + 2 * 32, 64}));
  ASSERT_EQ(t.layers[0].gate_up.size(), 1u);
  EXPECT_EQ(t.layers[0].gate_up[0]->shape, (std::vector<int64_t>{2 * 128, 64}));
  EXPECT_EQ(check_tensors(m.config, m.store), DType::kF32);
  EXPECT_EQ(llama_tensor_count(m.config),
            static_cast<int64_t>(llama_tensor_specs(m.config).size()));
  // One KV head more than the checkpoint holds: qkv_proj's rows no longer fit.
  ModelConfig wider = m.config;
  wider.num_kv_heads = 4;
  EXPECT_NE(check_error(wider, m.store).find("self_attn.qkv_proj.weight"), std::string::npos)
      << check_error(wider, m.store);
  ModelConfig wider_ffn = m.config;
  wider_ffn.intermediate_size = 96;
  EXPECT_NE(check_error(wider_ffn, m.store).find("mlp.gate_up_proj.weight"), std::string::npos)
      << check_error(wider_ffn, m.store);
  // A Llama config on a Phi-3 checkpoint finds no q_proj (and the reverse no qkv_proj).
  ModelConfig as_llama = m.config;
  as_llama.fused_checkpoint_projections = false;
  EXPECT_NE(check_error(as_llama, m.store), "");
  const auto& base = test_model("base", DType::kF32);
  ModelConfig as_phi = base.config;
  as_phi.fused_checkpoint_projections = true;
  EXPECT_NE(check_error(as_phi, base.store), "");
}

// Issue 56: a checkpoint whose tensors the config does not use ran without them.
TEST(CheckTensors, ATensorTheConfigDoesNotUseIsRefusedByName) {
  // Qwen3's checkpoint labelled Llama: its q_norm / k_norm would be ignored.
  const auto& qwen3 = test_model("qwen3", DType::kF32);
  ModelConfig as_llama = qwen3.config;
  as_llama.architecture = "LlamaForCausalLM";
  as_llama.qk_norm = false;
  EXPECT_NE(check_error(as_llama, qwen3.store).find("self_attn.k_norm.weight' is not used"),
            std::string::npos)
      << check_error(as_llama, qwen3.store);
  // num_hidden_layers 1 on a 2-layer checkpoint: layer 1 would be skipped.
  const auto& base = test_model("base", DType::kF32);
  ModelConfig one_layer = base.config;
  one_layer.num_layers = 1;
  EXPECT_NE(check_error(one_layer, base.store).find("model.layers.1."), std::string::npos)
      << check_error(one_layer, base.store);
  EXPECT_EQ(check_error(base.config, base.store), "");
  // A Gemma checkpoint read as Llama would skip its extra norms.
  const auto& gemma = test_model("gemma2", DType::kF32);
  ModelConfig gemma_as_llama = gemma.config;
  gemma_as_llama.gemma = GemmaSettings{};
  EXPECT_NE(
      check_error(gemma_as_llama, gemma.store).find("feedforward_layernorm.weight' is not used"),
      std::string::npos)
      << check_error(gemma_as_llama, gemma.store);
}

// Q8_0 matrices (a GGUF import) are refused where only floats are read and allowed for the cpu
// backend's uses.
TEST(CheckTensors, Q8_0MatricesAreRefusedUnlessAllowedAndNeverAsNorms) {
  const auto& base = test_model("base", DType::kF32);
  testing::TempDir dir;
  std::vector<TensorToWrite> tensors;
  std::vector<std::byte> q8_bytes;
  const std::string q8_name = "model.layers.0.mlp.down_proj.weight";
  for (const auto& [name, view] : base.store.tensors()) {
    TensorToWrite t{name, view->dtype, view->shape, nullptr};
    if (name == q8_name) {
      t.dtype = DType::kQ8_0;
      q8_bytes.assign(tensor_bytes(DType::kQ8_0, view->shape), std::byte{0});
      t.fill = [&q8_bytes](size_t offset, std::span<std::byte> out) {
        std::memcpy(out.data(), q8_bytes.data() + offset, out.size());
      };
    } else {
      const TensorView* v = view;
      t.fill = [v](size_t offset, std::span<std::byte> out) {
        std::memcpy(out.data(), v->data + offset, out.size());
      };
    }
    tensors.push_back(std::move(t));
  }
  write_safetensors(dir / "model.safetensors", tensors);
  const TensorStore store = TensorStore::open_dir(dir.path());
  ASSERT_EQ(store.get(q8_name).dtype, DType::kQ8_0);
  const std::string refused = check_error(base.config, store);
  EXPECT_NE(refused.find(q8_name + "' is Q8_0"), std::string::npos) << refused;
  EXPECT_NE(refused.find("only the cpu backend"), std::string::npos) << refused;
  EXPECT_EQ(check_tensors(base.config, store, QuantizedWeights::kAllowMatrices), DType::kF32);
}

// A copy of `m`'s folder as a Gemma3ForConditionalGeneration checkpoint of its text model alone:
// config.json nested under text_config, every tensor saved under `prefix`'s name (transformers
// 4.50's language_model.model.*, or 4.52's model.language_model.*), plus `extra` tensors.
void write_wrapped(const testing::TestModel& m, const std::filesystem::path& dir,
                   const std::string& layout, const std::vector<std::string>& extra = {}) {
  std::filesystem::create_directories(dir);
  nlohmann::json text = nlohmann::json::parse(testing::read_file(m.dir / "config.json"));
  text.erase("architectures");
  const nlohmann::json wrapper = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                                  {"model_type", "gemma3"},
                                  {"text_config", text},
                                  {"vision_config", {{"model_type", "siglip_vision_model"}}},
                                  {"mm_tokens_per_image", 256}};
  testing::write_file(dir / "config.json", wrapper.dump());
  std::vector<TensorToWrite> tensors;
  auto copy = [](const TensorView* v) {
    return [v](size_t offset, std::span<std::byte> out) {
      std::memcpy(out.data(), v->data + offset, out.size());
    };
  };
  for (const auto& [name, view] : m.store.tensors()) {
    std::string saved = name;
    if (layout == "4.50")
      saved = "language_model." + name;  // language_model.model.*, language_model.lm_head.*
    else if (name.starts_with("model."))
      saved = "model.language_model." + name.substr(6);
    tensors.push_back({saved, view->dtype, view->shape, copy(view)});
  }
  const TensorView* norm = &m.store.get("model.norm.weight");
  for (const std::string& name : extra)
    tensors.push_back({name, norm->dtype, norm->shape, copy(norm)});
  write_safetensors(dir / "model.safetensors", tensors);
}

// Issue 56: the text part of a Gemma3ForConditionalGeneration folder is its Gemma 3 text model,
// read under the text model's names in both layouts transformers writes: the same config and
// the same bytes for every tensor the forward pass binds as the Gemma3ForCausalLM folder.
TEST(TensorStore, AMultimodalWrappersTextModelLoadsAsTheTextModel) {
  const auto& m = test_model("gemma3", DType::kF32);
  testing::TempDir tmp;
  for (const std::string layout : {"4.50", "4.52"}) {
    const auto dir = tmp / ("wrapped-" + layout);
    write_wrapped(m, dir, layout);
    const ModelConfig config = ModelConfig::from_dir(dir);
    EXPECT_EQ(config.architecture, "Gemma3ForCausalLM") << layout;
    EXPECT_EQ(config.gemma, m.config.gemma) << layout;
    EXPECT_EQ(config.num_parameters(), m.config.num_parameters()) << layout;
    const TensorStore store = TensorStore::open_dir(dir);
    EXPECT_EQ(check_tensors(config, store), DType::kF32) << layout;
    for (const TensorSpec& spec : llama_tensor_specs(config)) {
      const TensorView& got = store.get(spec.name, spec.shape);
      const TensorView& want = m.store.get(spec.name);
      ASSERT_EQ(got.nbytes, want.nbytes) << spec.name;
      EXPECT_EQ(std::memcmp(got.data, want.data, got.nbytes), 0) << layout << " " << spec.name;
    }
  }
  // The image encoder is not served: a checkpoint that holds it is refused naming its tensor.
  const auto with_vision = tmp / "with-vision";
  write_wrapped(m, with_vision, "4.52", {"model.vision_tower.vision_model.post_layernorm.weight"});
  const std::string error =
      check_error(ModelConfig::from_dir(with_vision), TensorStore::open_dir(with_vision));
  EXPECT_NE(error.find("'model.vision_tower.vision_model.post_layernorm.weight' belongs to the "
                       "image encoder"),
            std::string::npos)
      << error;
  // One tensor under both names is ambiguous: refused, not one of them picked.
  const auto twice = tmp / "twice";
  write_wrapped(m, twice, "4.52", {"model.norm.weight"});
  try {
    TensorStore::open_dir(twice);
    ADD_FAILURE() << "a tensor saved twice was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'model.norm.weight' is saved twice"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace blend
