// `blend workload synth` on a hand-written trace folder: a JSONL Batch API file of the asked
// size whose bodies carry token-id prompts and known lengths; unreachable targets exit 1.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace blend {
namespace {

class WorkloadCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_ / "traces/sharegpt_llama2_lengths");
    std::filesystem::create_directories(dir_ / "traces/mmlu");
    std::string sharegpt = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n";
    for (int i = 0; i < 30; ++i)
      sharegpt += std::to_string(100 + 20 * i) + "," + std::to_string(50 + 10 * i) + ",0,0\n";
    testing::write_file(
        dir_ / "traces/sharegpt_llama2_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        sharegpt);
    std::string mmlu =
        "subject,question_index,zero_shot_input_tokens,five_shot_input_tokens,"
        "five_shot_shared_prefix_tokens,output_tokens\n";
    for (int i = 0; i < 20; ++i) mmlu += "anatomy," + std::to_string(i) + ",80,500,420,1\n";
    testing::write_file(dir_ / "traces/mmlu/mmlu_test_prompt_lengths_llama2.csv", mmlu);
  }
  testing::CommandResult synth(const std::string& target) {
    return testing::run_command(std::string("'") + BLEND_BINARY + "' workload synth " + target +
                                " --requests 300 --seed 4 --compute-source sharegpt --traces '" +
                                (dir_ / "traces").string() + "' --out '" +
                                (dir_ / "w.jsonl").string() + "' 2>&1");
  }
  testing::TempDir dir_;
};

TEST_F(WorkloadCli, WritesBatchFileOfTheAskedSize) {
  const testing::CommandResult r = synth("--density 1.0 --sharing 0.3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(testing::read_file(dir_ / "w.jsonl"));
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["url"], "/v1/completions");
    EXPECT_TRUE(j["body"]["prompt"].is_array());
    EXPECT_TRUE(j["body"]["ignore_eos"].get<bool>());
    EXPECT_GE(j["body"]["max_tokens"].get<int>(), 1);
  }
  EXPECT_EQ(lines, 300);
  EXPECT_NE(r.output.find("sharing 0.3"), std::string::npos) << r.output;
}

TEST_F(WorkloadCli, UnreachableTargetIsAnError) {
  const testing::CommandResult r = synth("--density 1.0 --sharing 0.95");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("out of reach"), std::string::npos) << r.output;
}

// A fresh clone: no --traces, run from a folder that is not the source tree. The traces ship in
// the repository's data/traces and the binary knows where (it used to look for
// ../shared/data/traces relative to the current directory and fail).
TEST(WorkloadCliDefaults, SynthAndSimulateServeFindTheRepositoryTraces) {
  testing::TempDir dir;
  const std::string env = "cd '" + dir.path().string() + "' && env -u BLEND_TRACES_DIR '";
  testing::CommandResult r =
      testing::run_command(env + BLEND_BINARY +
                           "' workload synth --density 2.0 --sharing 0.1 --requests 200 --seed 3 "
                           "--out w.jsonl 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(testing::read_file(dir / "w.jsonl"));
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 200);
  EXPECT_NE(r.output.find("azure-conv"), std::string::npos) << r.output;

  r = testing::run_command(env + BLEND_BINARY +
                           "' simulate-serve --rt-rate 2 --duration 5 --seed 1 --json 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

TEST(WorkloadCliDefaults, MissingTracesSayWhereToGetThem) {
  testing::TempDir dir;
  const testing::CommandResult r = testing::run_command(
      "cd '" + dir.path().string() + "' && BLEND_TRACES_DIR=/nonexistent/traces '" + BLEND_BINARY +
      "' workload synth --density 2.0 --sharing 0.1 --out w.jsonl 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot read trace /nonexistent/traces"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data/traces"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--traces"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace blend
