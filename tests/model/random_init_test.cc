#include "model/random_init.h"

#include <cmath>
#include <cstdint>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/presets.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace blend {
namespace {

RandomInitOptions options(uint64_t seed, DType dtype) {
  RandomInitOptions o;
  o.seed = seed;
  o.dtype = dtype;
  o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  return o;
}

float rounded(float v, DType dtype) {
  if (dtype == DType::kBF16) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == DType::kF16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// Loads the folder back and checks every tensor's shape and a spread of its elements against
// the generator (first, last and a stride through the middle).
void expect_loads_back(const std::filesystem::path& dir, const ModelConfig& config, uint64_t seed,
                       DType dtype) {
  const ModelConfig loaded = ModelConfig::from_dir(dir);
  EXPECT_EQ(loaded.hidden_size, config.hidden_size);
  EXPECT_EQ(loaded.num_layers, config.num_layers);
  EXPECT_EQ(loaded.dtype, dtype);
  const TensorStore store = TensorStore::open_dir(dir);
  EXPECT_EQ(check_tensors(loaded, store), dtype);
  const auto specs = llama_tensor_specs(config);
  EXPECT_EQ(store.tensors().size(), specs.size());
  for (const auto& spec : specs) {
    const TensorView& t = store.get(spec.name, spec.shape);
    const int64_t n = t.numel();
    const int64_t stride = std::max<int64_t>(1, n / 997);
    for (int64_t i = 0; i < n; i += stride)
      ASSERT_EQ(t.at(i), rounded(random_init_value(spec, config, seed, i), dtype))
          << spec.name << "[" << i << "]";
    ASSERT_EQ(t.at(n - 1), rounded(random_init_value(spec, config, seed, n - 1), dtype));
  }
}

TEST(RandomInit, Smollm135mLoadsBackIdentically) {
  testing::TempDir dir;
  const ModelConfig config = *find_model_preset("smollm-135m");
  write_random_model(config, dir.path(), options(7, DType::kBF16));
  expect_loads_back(dir.path(), config, 7, DType::kBF16);
  EXPECT_TRUE(std::filesystem::exists(dir / "tokenizer.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "tokenizer_config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "generation_config.json"));
}

TEST(RandomInit, ShardedF32TinyLoadsBack) {
  testing::TempDir dir;
  const ModelConfig config = *find_model_preset("tiny");
  RandomInitOptions o = options(3, DType::kF32);
  o.max_shard_bytes = 8u << 20;
  write_random_model(config, dir.path(), o);
  EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  expect_loads_back(dir.path(), config, 3, DType::kF32);
}

// Threads fill each chunk of a tensor in parallel: the bytes are those of one thread, and every
// element is the generator's value (the scalar reference). The embedding and lm_head of this
// shape (128256 x 128 bf16, 32 MiB) span two of the writer's 16 MiB chunks each.
TEST(RandomInit, ThreadsDoNotChangeABit) {
  testing::TempDir one, four;
  ModelConfig config = *find_model_preset("tiny");
  config.hidden_size = 128;
  config.head_dim = 32;
  RandomInitOptions o = options(11, DType::kBF16);
  o.threads = 1;
  write_random_model(config, one.path(), o);
  o.threads = 4;
  write_random_model(config, four.path(), o);
  EXPECT_TRUE(testing::read_file(one / "model.safetensors") ==
              testing::read_file(four / "model.safetensors"));
  const TensorStore store = TensorStore::open_dir(four.path());
  for (const auto& spec : llama_tensor_specs(config)) {
    const TensorView& t = store.get(spec.name, spec.shape);
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      ASSERT_EQ(t.at(i), rounded(random_init_value(spec, config, 11, i), DType::kBF16))
          << spec.name << "[" << i << "]";
  }
}

TEST(RandomInit, DeterministicPerSeed) {
  testing::TempDir a, b, c;
  const ModelConfig config = *find_model_preset("tiny");
  write_random_model(config, a.path(), options(1, DType::kBF16));
  write_random_model(config, b.path(), options(1, DType::kBF16));
  write_random_model(config, c.path(), options(2, DType::kBF16));
  const std::string wa = testing::read_file(a / "model.safetensors");
  EXPECT_EQ(wa, testing::read_file(b / "model.safetensors"));
  EXPECT_NE(wa, testing::read_file(c / "model.safetensors"));
}

TEST(RandomInit, ValuesAreScaledAndFinite) {
  const ModelConfig config = *find_model_preset("smollm-135m");
  for (const auto& spec : llama_tensor_specs(config)) {
    double sum_sq = 0;
    const int n = 4096;
    for (int i = 0; i < n; ++i) {
      const float v = random_init_value(spec, config, 0, i);
      ASSERT_TRUE(std::isfinite(v));
      sum_sq += double(v) * v;
    }
    const double rms = std::sqrt(sum_sq / n);
    if (spec.kind == TensorSpec::Kind::kLinear) {
      EXPECT_NEAR(rms * std::sqrt(double(spec.fan_in)), 1.0, 0.05) << spec.name;
    } else if (spec.kind == TensorSpec::Kind::kNorm) {
      EXPECT_NEAR(rms, 1.0, 0.01) << spec.name;
    }
  }
}

TEST(RandomInit, RefusesHugeModelsAndMissingTokenizer) {
  testing::TempDir dir;
  ModelConfig config = *find_model_preset("llama-3.2-1b");
  RandomInitOptions o = options(0, DType::kF32);
  o.max_total_bytes = 1u << 30;
  EXPECT_THROW(write_random_model(config, dir.path(), o), Error);
  // Past the limit (as `--allow-large` sets it), the free disk space still refuses, before
  // anything is written: a 70B shape of 4096 layers is 14 TB.
  config = *find_large_model_preset("llama-3-70b");
  config.num_layers = ModelConfig::kMaxLayers;
  o.max_total_bytes = UINT64_MAX;
  try {
    write_random_model(config, dir / "big", o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MiB free"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "big"));
  o = options(0, DType::kBF16);
  o.tokenizer_dir = dir / "no-such-dir";
  EXPECT_THROW(write_random_model(*find_model_preset("tiny"), dir.path(), o), Error);
}

TEST(RandomInit, MoreLayersThanTheCheckpointHoldsIsRefusedByCount) {
  testing::TempDir dir;
  const ModelConfig tiny = *find_model_preset("tiny");
  write_random_model(tiny, dir.path(), options(0, DType::kBF16));
  ModelConfig big = tiny;
  big.num_layers = ModelConfig::kMaxLayers;
  testing::write_file(dir / "config.json", big.to_json().dump());
  const ModelConfig loaded = ModelConfig::from_dir(dir.path());
  const TensorStore store = TensorStore::open_dir(dir.path());
  EXPECT_EQ(llama_tensor_count(tiny), static_cast<int64_t>(llama_tensor_specs(tiny).size()));
  try {
    check_tensors(loaded, store);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("describes 4096 layers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace blend
