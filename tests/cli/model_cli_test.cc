// `blend model init | info` as a user runs them.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace blend {
namespace {

std::string blend_cmd(const std::string& args) {
  return std::string("BLEND_TOKENIZER_DIR='") + BLEND_TEST_TOKENIZER_DIR + "' '" + BLEND_BINARY +
         "' " + args;
}

TEST(ModelCli, InitThenInfo) {
  testing::TempDir dir;
  const auto model = (dir / "tiny").string();
  auto r = testing::run_command(blend_cmd("model init --preset tiny --out " + model + " --seed 5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = testing::run_command(blend_cmd("model info --model " + model));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto info = nlohmann::json::parse(r.output);
  EXPECT_EQ(info["hidden_size"], 64);
  EXPECT_EQ(info["num_layers"], 2);
  EXPECT_EQ(info["dtype"], "BF16");
  EXPECT_EQ(info["vocab_size"], 128256);
  EXPECT_EQ(info["tokenizer_vocab_size"], 128256);
  // Where the parameters are (issue 25): the tiny preset's untied embedding and lm_head are
  // 2 x 128256 x 64 of its 16.5M; its two layers hold the rest.
  EXPECT_EQ(info["embedding_parameters"], 2 * 128256 * 64);
  EXPECT_EQ(
      info["non_embedding_parameters"].get<int64_t>() + info["embedding_parameters"].get<int64_t>(),
      info["parameters"].get<int64_t>());
  EXPECT_EQ(info["non_embedding_parameters"],
            2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 64);
}

// A tokenizer blend cannot run is refused by `model info` (it passed before, and the folder then
// failed at its first request): a SentencePiece-style Metaspace pre-tokenizer here.
TEST(ModelCli, InfoRefusesATokenizerItCannotRun) {
  testing::TempDir dir;
  const auto model = (dir / "sp").string();
  ASSERT_EQ(testing::run_command(blend_cmd("model init --preset tiny --out " + model)).exit_code,
            0);
  auto tokenizer = nlohmann::json::parse(testing::read_file(dir / "sp" / "tokenizer.json"));
  tokenizer["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  testing::write_file(dir / "sp" / "tokenizer.json", tokenizer.dump());
  const auto r = testing::run_command(blend_cmd("model info --model " + model + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("Metaspace"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;
}

// --layers writes a reduced-depth model of a preset's shape (issue 28: 70B-shaped, fewer layers).
TEST(ModelCli, InitWithFewerLayers) {
  testing::TempDir dir;
  const auto model = (dir / "m").string();
  auto r = testing::run_command(
      blend_cmd("model init --preset llama-3.2-1b --layers 1 --threads 2 --out " + model));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(layers: 1)"), std::string::npos) << r.output;
  r = testing::run_command(blend_cmd("model info --model " + model));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto info = nlohmann::json::parse(r.output);
  EXPECT_EQ(info["num_layers"], 1);
  EXPECT_EQ(info["hidden_size"], 2048);
}

TEST(ModelCli, BadInputGivesMessageAndNonZeroExit) {
  testing::TempDir dir;
  auto r = testing::run_command(
      blend_cmd("model init --preset nope --out " + (dir / "x").string() + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unknown preset 'nope'"), std::string::npos) << r.output;

  r = testing::run_command(
      blend_cmd("model init --preset qwen2.5-7b --out " + (dir / "x").string() + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("shape-only"), std::string::npos) << r.output;
  r = testing::run_command(blend_cmd("model init --preset qwen2.5-7b --allow-large --out " +
                                     (dir / "x").string() + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("shape-only"), std::string::npos) << r.output;

  // The large presets and anything over 6 GiB need --allow-large; nothing is written without it.
  r = testing::run_command(
      blend_cmd("model init --preset llama-3-70b --out " + (dir / "x").string() + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--allow-large"), std::string::npos) << r.output;
  r =
      testing::run_command(blend_cmd("model init --preset llama-3.2-1b --layers 40 --dtype f32 "
                                     "--out " +
                                     (dir / "x").string() + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("MiB limit"), std::string::npos) << r.output;
  // With it, the free disk space still bounds the size (a 70B shape of 4096 layers: 14 TB).
  r =
      testing::run_command(blend_cmd("model init --preset llama-3-70b --allow-large --layers 4096 "
                                     "--out " +
                                     (dir / "x").string() + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("MiB free"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "x" / "model.safetensors"));

  r = testing::run_command(
      blend_cmd("model init --preset tiny --dtype int4 --out " + (dir / "x").string() + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--dtype"), std::string::npos) << r.output;

  // A corrupted weight file: the message names the file.
  const auto model = (dir / "m").string();
  ASSERT_EQ(testing::run_command(blend_cmd("model init --preset tiny --out " + model)).exit_code,
            0);
  const auto weights = dir / "m" / "model.safetensors";
  const std::string bytes = testing::read_file(weights);
  testing::write_file(weights, bytes.substr(0, bytes.size() / 2));
  r = testing::run_command(blend_cmd("model info --model " + model + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;

  r = testing::run_command(blend_cmd("model info --model " + (dir / "nothing").string() + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("config.json"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace blend
