// model/zoo: which model folders `--model` and `--zoo` name, in which order, and what is refused.
#include "model/zoo.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "model/derive.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace blend {
namespace {

void make_model_dir(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  testing::write_file(dir / "config.json", "{}");
}

std::string error_of(const std::filesystem::path& model, const std::string& name,
                     const std::filesystem::path& zoo) {
  try {
    model_folders(model, name, zoo);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Zoo, ModelFirstThenTheZooInNameOrder) {
  testing::TempDir dir;
  make_model_dir(dir / "zoo" / "b");
  make_model_dir(dir / "zoo" / "a");
  make_model_dir(dir / "base");
  testing::write_file(dir / "zoo" / "notes.txt", "files beside the folders are ignored");
  const auto folders = model_folders(dir / "base", "", dir / "zoo");
  ASSERT_EQ(folders.size(), 3u);
  EXPECT_EQ(folders[0].name, "base");
  EXPECT_EQ(folders[1].name, "a");
  EXPECT_EQ(folders[2].name, "b");
  EXPECT_EQ(folders[2].dir, dir / "zoo" / "b");
  EXPECT_EQ(model_folders(dir / "base", "served", "")[0].name, "served");
  EXPECT_EQ(model_folder_name(dir / "base" / ""), "base");
}

TEST(Zoo, WhatIsRefused) {
  testing::TempDir dir;
  EXPECT_NE(error_of("", "", "").find("--model DIR or --zoo DIR"), std::string::npos);
  EXPECT_NE(error_of("", "", dir / "missing").find("not a folder"), std::string::npos);
  std::filesystem::create_directories(dir / "empty");
  EXPECT_NE(error_of("", "", dir / "empty").find("no model folder"), std::string::npos);
  make_model_dir(dir / "zoo" / "a");
  EXPECT_NE(error_of("", "named", dir / "zoo").find("--served-model-name"), std::string::npos);
  make_model_dir(dir / "a");
  EXPECT_NE(error_of(dir / "a", "", dir / "zoo").find("two models are named 'a'"),
            std::string::npos);
  std::filesystem::create_directories(dir / "zoo" / "lora");
  testing::write_file(dir / "zoo" / "lora" / "adapter_config.json", "{}");
  EXPECT_NE(error_of("", "", dir / "zoo").find("names no base_model_name_or_path"),
            std::string::npos);
  std::filesystem::remove_all(dir / "zoo" / "lora");
  std::filesystem::create_directories(dir / "zoo" / "stray");
  EXPECT_NE(error_of("", "", dir / "zoo").find("no config.json or adapter_config.json"),
            std::string::npos);
}

TEST(Zoo, AnAdapterWithATemplateOfItsOwnUsesIt) {
  testing::TempDir dir;
  make_model_dir(dir / "base");
  std::filesystem::create_directories(dir / "adapter");
  const ModelFolder plain{"m", dir / "base", {}}, lora{"l", dir / "base", dir / "adapter"};
  EXPECT_EQ(chat_template_dir(plain), dir / "base");
  EXPECT_EQ(chat_template_dir(lora), dir / "base");
  testing::write_file(dir / "adapter" / "tokenizer_config.json", "{}");
  EXPECT_EQ(chat_template_dir(lora), dir / "adapter");
}

TEST(Derive, ChangesTheListedLayersAndCopiesEverythingElse) {
  testing::TempDir dir;
  RandomInitOptions o;
  o.seed = 2;
  o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  write_random_model(*find_model_preset("tiny"), dir / "base", o);
  derive_full_finetune(dir / "base", dir / "tuned", {.seed = 3, .layers = {1}});
  EXPECT_EQ(testing::read_file(dir / "tuned" / "tokenizer.json"),
            testing::read_file(dir / "base" / "tokenizer.json"));
  const TensorStore base = TensorStore::open_dir(dir / "base");
  const TensorStore tuned = TensorStore::open_dir(dir / "tuned");
  ASSERT_EQ(base.tensors().size(), tuned.tensors().size());
  for (const auto& [name, view] : base.tensors()) {
    const TensorView& other = tuned.get(name);
    ASSERT_EQ(view->nbytes, other.nbytes) << name;
    const bool same = std::memcmp(view->data, other.data, view->nbytes) == 0;
    EXPECT_EQ(same, !name.starts_with("model.layers.1.")) << name;
  }
  auto error = [&](const std::filesystem::path& out, std::vector<int64_t> layers) {
    try {
      derive_full_finetune(dir / "base", out, {.seed = 1, .layers = std::move(layers)});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(dir / "x", {2}).find("outside the model's 0..1"), std::string::npos);
  EXPECT_NE(error(dir / "x", {}).find("--layers"), std::string::npos);
  EXPECT_NE(error(dir / "base", {0}).find("must differ"), std::string::npos);
}

}  // namespace
}  // namespace blend
