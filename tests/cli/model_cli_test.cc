// `blend model init | info` as a user runs them.
#include <sys/stat.h>

#include <filesystem>

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
  EXPECT_EQ(info["q8_0_tensors"], 0);
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
// failed at its first request): a Whitespace pre-tokenizer here (a Metaspace one was, until
// SentencePiece-style tokenizers loaded).
TEST(ModelCli, InfoRefusesATokenizerItCannotRun) {
  testing::TempDir dir;
  const auto model = (dir / "sp").string();
  ASSERT_EQ(testing::run_command(blend_cmd("model init --preset tiny --out " + model)).exit_code,
            0);
  auto tokenizer = nlohmann::json::parse(testing::read_file(dir / "sp" / "tokenizer.json"));
  tokenizer["pre_tokenizer"] = {{"type", "Whitespace"}};
  testing::write_file(dir / "sp" / "tokenizer.json", tokenizer.dump());
  const auto r = testing::run_command(blend_cmd("model info --model " + model + " 2>&1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("Whitespace"), std::string::npos) << r.output;
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

// Every file a model folder is read from is refused at once when it is a FIFO (it blocked
// start-up forever, waiting for a writer), and a path the filesystem cannot resolve (a symlink
// loop) is a user error naming it (it was "internal error: filesystem error", exit 2). `timeout`
// turns a hang into exit 124, so a regression fails instead of stalling the suite.
TEST(ModelCli, FifosAndSymlinkLoopsInAModelFolderAreClearErrors) {
  testing::TempDir dir;
  const auto model = dir / "m";
  const auto adapter = dir / "a";
  ASSERT_EQ(
      testing::run_command(blend_cmd("model init --preset tiny --out " + model.string())).exit_code,
      0);
  ASSERT_EQ(testing::run_command(blend_cmd("model derive --base " + model.string() + " --out " +
                                           adapter.string() + " --lora --rank 2"))
                .exit_code,
            0);
  testing::write_file(dir / "in.jsonl", "");
  const std::string batch = "batch --input " + (dir / "in.jsonl").string() + " --output " +
                            (dir / "out.jsonl").string() + " --model ";
  const auto run = [&](const std::string& args) {
    return testing::run_command("timeout 10 env " + blend_cmd(args + " </dev/null 2>&1"));
  };
  struct Case {
    std::filesystem::path file;
    std::string command;  // the one that reads `file`
  };
  const std::vector<Case> cases = {
      {model / "tokenizer.json", "model info --model " + model.string()},
      {model / "tokenizer_config.json", "model info --model " + model.string()},
      {model / "generation_config.json", "model info --model " + model.string()},
      {model / "chat_template.jinja", "template --model " + model.string()},
      {adapter / "adapter_config.json", batch + adapter.string()},
  };
  for (const Case& c : cases) {
    const auto aside = c.file.string() + ".aside";
    const bool existed = std::filesystem::exists(c.file);
    if (existed) std::filesystem::rename(c.file, aside);
    ASSERT_EQ(::mkfifo(c.file.c_str(), 0600), 0);
    auto r = run(c.command);
    EXPECT_EQ(r.exit_code, 1) << c.file << ": " << r.output;
    EXPECT_NE(r.output.find("blend: error: " + c.file.string() + ": not a regular file"),
              std::string::npos)
        << r.output;
    // The same name as a symlink to itself: ELOOP, named.
    std::filesystem::remove(c.file);
    std::filesystem::create_symlink(c.file.filename(), c.file);
    r = run(c.command);
    EXPECT_EQ(r.exit_code, 1) << c.file << ": " << r.output;
    EXPECT_NE(r.output.find("blend: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.file.string()), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
    std::filesystem::remove(c.file);
    if (existed) std::filesystem::rename(aside, c.file);
  }
  // The folder itself a symlink loop.
  std::filesystem::create_symlink("loop", dir / "loop");
  const auto r = run("model info --model " + (dir / "loop").string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("blend: error: " + (dir / "loop").string()), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace blend
