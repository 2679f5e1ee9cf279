// Workload synthesis (BlendServe App. A.3) on small hand-written traces: the mix hits the
// target density and sharing, is reproducible from its seed, and refuses unreachable targets.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "harness/synth.h"
#include "test_util.h"

namespace blend::workload {
namespace {

class Synth : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_ / "azure_llm_2023");
    std::filesystem::create_directories(dir_ / "mmlu");
    std::string azure = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n";
    for (int i = 0; i < 50; ++i)
      azure += "2023-11-16 18:15:46," + std::to_string(300 + 37 * i) + "," +
               std::to_string(20 + 5 * i) + "\r\n";
    testing::write_file(dir_ / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv", azure);
    std::string mmlu =
        "subject,question_index,zero_shot_input_tokens,five_shot_input_tokens,"
        "five_shot_shared_prefix_tokens,output_tokens\n";
    for (int i = 0; i < 40; ++i)
      mmlu += std::string(i % 2 ? "algebra" : "anatomy") + "," + std::to_string(i) + ",80," +
              std::to_string(i % 2 ? 400 + i : 600 + i) + "," + (i % 2 ? "330" : "520") + ",1\n";
    testing::write_file(dir_ / "mmlu/mmlu_test_prompt_lengths_llama2.csv", mmlu);
  }
  SynthResult run(double density, double sharing, uint64_t seed) {
    SynthOptions o;
    o.density = density;
    o.sharing = sharing;
    o.requests = 3000;
    o.seed = seed;
    return synthesize(o, load_source("azure-conv", dir_.path()),
                      load_source("openvid", dir_.path()), load_source("mmlu", dir_.path()), cost_);
  }
  testing::TempDir dir_;
  CostModel cost_{*find_model_shape_preset("llama-3-8b"), *find_hardware_preset("a100-80g")};
};

TEST_F(Synth, HitsTargetDensityAndSharing) {
  for (auto [density, sharing] : {std::pair{1.4, 0.35}, std::pair{0.9, 0.05}}) {
    const SynthResult r = run(density, sharing, 1);
    EXPECT_EQ(r.requests.size(), 3000u);
    EXPECT_EQ(r.compute_requests + r.video_requests + r.mmlu_requests, 3000);
    EXPECT_NEAR(r.sharing, sharing, 0.01);
    EXPECT_NEAR(r.density / density, 1.0, 0.1) << density;
    double measured_density = 0, measured_sharing = 0;
    measure(r.requests, cost_, &measured_density, &measured_sharing);
    EXPECT_DOUBLE_EQ(measured_density, r.density);
    for (const plan::PlanRequest& q : r.requests) EXPECT_TRUE(q.output_known);
  }
}

TEST_F(Synth, SeedReproducesAndUnreachableTargetsThrow) {
  const SynthResult a = run(1.0, 0.2, 5), b = run(1.0, 0.2, 5), c = run(1.0, 0.2, 6);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i)
    EXPECT_EQ(a.requests[i].prompt, b.requests[i].prompt);
  bool differs = false;
  for (size_t i = 0; i < std::min(a.requests.size(), c.requests.size()); ++i)
    differs = differs || a.requests[i].prompt != c.requests[i].prompt;
  EXPECT_TRUE(differs);
  EXPECT_THROW(run(1.0, 0.99, 1), Error);  // more sharing than mmlu itself has
  EXPECT_THROW(load_source("burstgpt", dir_.path()), Error);
}

}  // namespace
}  // namespace blend::workload
