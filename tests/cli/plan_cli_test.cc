// `blend plan` on token-id batch files: every custom_id once, the baselines' orders, the
// density-sorted blend order, the explain report and JSON plan, and bad input as exit 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace blend {
namespace {

class PlanCli : public ::testing::Test {
 protected:
  void SetUp() override {
    // r0, r1 share a 40-token prefix and have long known outputs (memory-intensive); r2, r3
    // have long unique prompts and one output token (compute-intensive); r4 is small. The
    // batch's root density lies between the two kinds.
    std::string lines;
    auto line = [&](const std::string& id, std::vector<int> prompt, int max_tokens) {
      nlohmann::json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}};
      lines +=
          nlohmann::json{
              {"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}}
              .dump() +
          "\n";
    };
    std::vector<int> prefix(40);
    for (int i = 0; i < 40; ++i) prefix[static_cast<size_t>(i)] = 1000 + i;
    auto with = [&](int last) {
      std::vector<int> p = prefix;
      p.push_back(last);
      return p;
    };
    line("r0", with(1), 8000);
    line("r1", with(2), 8000);
    auto unique = [](int first) {
      std::vector<int> p(8000);
      for (int i = 0; i < 8000; ++i) p[static_cast<size_t>(i)] = first + i;
      return p;
    };
    line("r2", unique(20000), 1);
    line("r3", unique(30000), 1);
    line("r4", {5, 6, 7}, 100);
    input_ = dir_ / "in.jsonl";
    testing::write_file(input_, lines);
  }

  std::vector<std::string> order(const std::string& flags,
                                 const std::string& hardware = "a100-80g") {
    last_ = testing::run_command(std::string("'") + BLEND_BINARY + "' plan --input '" +
                                 input_.string() + "' --model-shape llama-3-8b --hardware " +
                                 hardware + " " + flags + " 2>&1");
    std::vector<std::string> ids;
    std::istringstream in(last_.output);
    for (std::string l; std::getline(in, l);) ids.push_back(l);
    return ids;
  }

  testing::TempDir dir_;
  std::filesystem::path input_;
  testing::CommandResult last_;
};

TEST_F(PlanCli, BaselinesAndBlendOrderEveryRequestOnce) {
  EXPECT_EQ(order("--policy fcfs"), (std::vector<std::string>{"r0", "r1", "r2", "r3", "r4"}));
  EXPECT_EQ(last_.exit_code, 0) << last_.output;
  std::vector<std::string> blend = order("--policy blend --split-threshold 1e9");
  ASSERT_EQ(last_.exit_code, 0) << last_.output;
  std::vector<std::string> sorted = blend;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<std::string>{"r0", "r1", "r2", "r3", "r4"}));
  // The scanner starts from both ends. With capacity pacing the memory-intensive requests that
  // fit go first (each is long-lived: starting it late stretches the run), then the
  // compute-intensive ones in the same step.
  ASSERT_GE(blend.size(), 3u);
  const auto compute = [](const std::string& id) { return id == "r2" || id == "r3"; };
  const auto memory = [](const std::string& id) { return id == "r0" || id == "r1"; };
  EXPECT_TRUE(memory(blend[0]) && memory(blend[1])) << last_.output;
  EXPECT_TRUE(compute(blend[2])) << last_.output;
  std::vector<std::string> random = order("--policy random --seed 3");
  std::sort(random.begin(), random.end());
  EXPECT_EQ(random, sorted);
}

TEST_F(PlanCli, ExplainAndJsonReport) {
  const std::filesystem::path out = dir_ / "plan.json";
  order("--explain --out '" + out.string() + "'");
  ASSERT_EQ(last_.exit_code, 0) << last_.output;
  EXPECT_NE(last_.output.find("root density"), std::string::npos) << last_.output;
  EXPECT_NE(last_.output.find("M_L"), std::string::npos) << last_.output;
  const nlohmann::json plan = nlohmann::json::parse(testing::read_file(out));
  // 2 x 41 + 2 x 8000 + 3 prompt tokens, of which 40 are reused.
  EXPECT_NEAR(plan["optimal_sharing_ratio"].get<double>(), 40.0 / 16085.0, 1e-9);
  EXPECT_GT(plan["root_density"].get<double>(), 0);
  EXPECT_EQ(plan["order"].size(), 5u);
  EXPECT_GE(plan["t_sequential_seconds"].get<double>(), plan["t_overlapped_seconds"].get<double>());
}

TEST_F(PlanCli, BadInputIsAnError) {
  order("", "nonsense-gpu");
  EXPECT_EQ(last_.exit_code, 1) << last_.output;
  EXPECT_NE(last_.output.find("nonsense-gpu"), std::string::npos) << last_.output;
  order("--policy sideways");
  EXPECT_EQ(last_.exit_code, 1) << last_.output;
}

// The README runs `blend plan` without --hardware (issue 25): it plans for a100-80g, as
// `blend simulate` does, and says so.
TEST_F(PlanCli, HardwareDefaultsToTheSimulatorsDefault) {
  const testing::CommandResult r =
      testing::run_command(std::string("'") + BLEND_BINARY + "' plan --input '" + input_.string() +
                           "' --model-shape llama-3-8b --explain 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("a100-80g"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace blend
