// `blend bench serve` and `blend simulate-serve` as a user runs them: the JSON lines the BROS
// experiments in docs/BENCHMARKS.md are made of, the KV layout flag of the Fig. 13 ablation,
// and bad flags. Short runs on a generated tiny model and a small ShareGPT-format trace.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>
#include <vector>

#include "test_util.h"

namespace blend {
namespace {

class ServingCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    std::string sharegpt = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n";
    for (int i = 0; i < 30; ++i)
      sharegpt += std::to_string(20 + 7 * i) + "," + std::to_string(4 + i % 9) + ",0,0\n";
    std::filesystem::create_directories(*dir_ / "traces/sharegpt_llama2_lengths");
    testing::write_file(
        *dir_ / "traces/sharegpt_llama2_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        sharegpt);
    const auto r = testing::run_command(
        blend("model init --preset tiny --out '" + (*dir_ / "tiny").string() + "' --seed 3"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string blend(const std::string& args) {
    return std::string("BLEND_TOKENIZER_DIR='") + BLEND_TEST_TOKENIZER_DIR + "' '" + BLEND_BINARY +
           "' " + args;
  }
  static std::string traces() { return (*dir_ / "traces").string(); }

  static std::vector<nlohmann::json> lines(const std::string& output) {
    std::vector<nlohmann::json> out;
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);)
      if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
    return out;
  }

  static testing::TempDir* dir_;
};

testing::TempDir* ServingCli::dir_ = nullptr;

TEST_F(ServingCli, BenchServePrintsOneJsonObjectPerPolicyWithItsKvLayout) {
  const std::string common = "bench serve --model '" + (*dir_ / "tiny").string() +
                             "' --duration 2 --rt-rate 4 --be-batch 6 --threads 1 "
                             "--kv-memory 0.01 --seed 2 --json --traces '" +
                             traces() + "'";
  auto r = testing::run_command(blend(common + " --scheduler hybrid,fcfs 2>/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto got = lines(r.output);
  ASSERT_EQ(got.size(), 2u) << r.output;
  EXPECT_EQ(got[0]["policy"], "hybrid");
  EXPECT_EQ(got[1]["policy"], "fcfs");
  EXPECT_EQ(got[0]["kv_layout"], "bidirectional");  // auto: BROS's layout with hybrid only
  EXPECT_EQ(got[1]["kv_layout"], "unidirectional");
  for (const auto& j : got) {
    for (const char* key : {"rt_normalized_latency_s", "ttft_attainment", "tpot_attainment",
                            "be_throughput_tokens_per_s"})
      ASSERT_TRUE(j.contains(key)) << key << " in " << j.dump();
    EXPECT_GT(j["rt_requests"].get<int64_t>(), 0) << j.dump();
    EXPECT_GE(j["ttft_attainment"].get<double>(), 0.0);
    EXPECT_LE(j["ttft_attainment"].get<double>(), 1.0);
    EXPECT_GT(j["rt_normalized_latency_s"].get<double>(), 0.0);
  }

  // --plot: the latency CDFs per class and policy (issue 25), a series each in the .dat file.
  const auto png = *dir_ / "bench.png";
  r = testing::run_command(
      blend(common + " --scheduler hybrid --plot '" + png.string() + "' 2>&1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::read_file(png).substr(1, 3), "PNG");
  const std::string dat = testing::read_file(*dir_ / "bench.dat");
  EXPECT_NE(dat.find("# hybrid RT TTFT"), std::string::npos) << dat;
  EXPECT_NE(dat.find("# hybrid RT end-to-end"), std::string::npos) << dat;

  r = testing::run_command(
      blend(common + " --scheduler hybrid --kv-layout unidirectional 2>/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  got = lines(r.output);
  ASSERT_EQ(got.size(), 1u) << r.output;
  EXPECT_EQ(got[0]["kv_layout"], "unidirectional");
}

// A short soak (issue 26): `blend serve` as a child, 40 streaming clients with a third of
// their requests abandoned mid-stream, Batch API jobs beside them. Every request must be
// answered or cleanly cancelled and accounted for by the server, which must stop cleanly on
// SIGTERM. (RSS growth is not judged in a few seconds: first-touch of the KV pool dominates.)
TEST_F(ServingCli, BenchSoakAnswersOrCancelsEveryRequestAndTheServerStopsCleanly) {
  const auto r = testing::run_command(
      blend("bench soak --model '" + (*dir_ / "tiny").string() +
            "' --clients 40 --duration 4 --hang-up-fraction 0.3 --be-batch 8 --threads 1 "
            "--kv-memory 0.01 --prompt-max 48 --output-max 24 --rss-growth-limit 100 --json "
            "2>&1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto got = lines(r.output);
  ASSERT_EQ(got.size(), 1u) << r.output;
  const nlohmann::json& j = got[0];
  EXPECT_TRUE(j["ok"].get<bool>()) << j.dump();
  EXPECT_EQ(j["failed"], 0) << j.dump();
  EXPECT_GT(j["completed"].get<int64_t>(), 0);
  EXPECT_GT(j["hung_up"].get<int64_t>(), 0);
  EXPECT_EQ(j["requests"].get<int64_t>(),
            j["completed"].get<int64_t>() + j["hung_up"].get<int64_t>());
  EXPECT_EQ(j["server_finished_rt"].get<double>() + j["server_cancelled_rt"].get<double>(),
            static_cast<double>(j["requests"].get<int64_t>()));
  EXPECT_EQ(j["max_open_streams"], 40);
  EXPECT_GT(j["be_jobs"].get<int64_t>(), 0);
  EXPECT_GE(j["rss_mib"].size(), 3u);
  EXPECT_TRUE(j["healthy"].get<bool>());
  EXPECT_EQ(j["server_running_at_end"], 0);
}

// The soak's hostile clients (issue 54) beside real streams: every attack gets its clean answer
// (413 before a chunked or announced body past the limit ends, 408 for slow headers, five
// answers to five pipelined requests, 200 or a named 400 for a never-seen schema), and the
// server's account of finished requests includes the schema requests it answered.
TEST_F(ServingCli, BenchSoakHostileClientsGetCleanAnswers) {
  const auto r = testing::run_command(
      blend("bench soak --model '" + (*dir_ / "tiny").string() +
            "' --clients 4 --duration 8 --hostile-clients 3 --http-head-timeout 1 "
            "--max-body-bytes 2000000 --schema-values 16 --be-batch 0 --threads 1 "
            "--kv-memory 0.01 --prompt-max 32 --output-max 8 --rss-growth-limit 100 --json 2>&1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto got = lines(r.output);
  ASSERT_EQ(got.size(), 1u) << r.output;
  const nlohmann::json& j = got[0];
  EXPECT_TRUE(j["ok"].get<bool>()) << j.dump();
  for (const char* attack :
       {"chunked-oversize", "length-oversize", "slow-headers", "pipelined", "distinct-schema"})
    EXPECT_GT(j["hostile_attempts"].value(attack, 0), 0) << attack << ": " << j.dump();
  EXPECT_TRUE(j["hostile_unexpected"].empty()) << j["hostile_unexpected"].dump();
  EXPECT_TRUE(j["healthy"].get<bool>());
}

TEST_F(ServingCli, SimulateServePrintsOneJsonObjectPerRateAndPolicy) {
  const auto r = testing::run_command(
      blend("simulate-serve --rt-rate 1,3 --duration 20 --scheduler hybrid,fcfs --be-batch 32 "
            "--json --traces '" +
            traces() + "'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto got = lines(r.output);
  ASSERT_EQ(got.size(), 4u) << r.output;
  for (const auto& j : got) {
    for (const char* key : {"policy", "rt_rate", "rt_normalized_latency_s", "ttft_attainment",
                            "tpot_attainment", "be_throughput_tokens_per_s", "kv_layout"})
      ASSERT_TRUE(j.contains(key)) << key << " in " << j.dump();
    EXPECT_EQ(j["kv_layout"], j["policy"] == "hybrid" ? "bidirectional" : "unidirectional");
    EXPECT_GT(j["be_throughput_tokens_per_s"].get<double>(), 0.0) << j.dump();
  }
}

// Without flags the hybrid policy fits its iteration model from the simulated steps and each
// step carries the GPU's measured noise; --iteration-model oracle --step-noise 0 is the exact
// cost model. Each line says which it ran, and the two differ on the same seed.
TEST_F(ServingCli, SimulateServeFitsItsModelUnderNoiseByDefault) {
  const std::string base =
      "simulate-serve --rt-rate 4 --duration 30 --scheduler hybrid --be-batch 32 "
      "--seed 3 --json --traces '" +
      traces() + "'";
  const auto fit = testing::run_command(blend(base));
  const auto oracle =
      testing::run_command(blend(base + " --iteration-model oracle --step-noise 0"));
  ASSERT_EQ(fit.exit_code, 0) << fit.output;
  ASSERT_EQ(oracle.exit_code, 0) << oracle.output;
  const auto f = lines(fit.output), o = lines(oracle.output);
  ASSERT_EQ(f.size(), 1u);
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(f[0]["iteration_model"], "fit");
  EXPECT_DOUBLE_EQ(f[0]["step_noise"].get<double>(), 0.02);
  EXPECT_EQ(o[0]["iteration_model"], "oracle");
  EXPECT_DOUBLE_EQ(o[0]["step_noise"].get<double>(), 0.0);
  EXPECT_NE(f[0]["seconds_until_drained"], o[0]["seconds_until_drained"]);
  const auto bad =
      testing::run_command(blend(base + " --fit-iteration-model --iteration-model oracle 2>&1"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("contradicts"), std::string::npos) << bad.output;
}

// --hybrid-preempt-be-pages (Alg. 1 as published): under memory pressure RT requests take
// pages of BE sequences, so bidirectional pages get shared; without it only free pages count and
// none are. Left at auto it is on when evicted KV goes to a host tier (dropped sequences' KV
// swaps out); =off turns it off there too.
TEST_F(ServingCli, SimulateServePreemptsBestEffortPagesWhenAsked) {
  const std::string base =
      "simulate-serve --rt-rate 2 --duration 60 --scheduler hybrid --kv-memory 4 --json --traces "
      "'" +
      traces() + "'";
  const auto off = testing::run_command(blend(base));
  const auto on = testing::run_command(blend(base + " --hybrid-preempt-be-pages"));
  ASSERT_EQ(off.exit_code, 0) << off.output;
  ASSERT_EQ(on.exit_code, 0) << on.output;
  const auto a = lines(off.output), b = lines(on.output);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0]["kv_shared_pages"], 0) << a[0].dump();
  EXPECT_GT(b[0]["kv_shared_pages"].get<int64_t>(), 0) << b[0].dump();
  EXPECT_GT(b[0]["kv_checkpointed_slots"].get<int64_t>(), 0) << b[0].dump();
  EXPECT_EQ(a[0]["kv_loaded_pages"], 0) << a[0].dump();

  const auto swapping = testing::run_command(blend(base + " --kv-host-memory 64"));
  const auto swapping_off =
      testing::run_command(blend(base + " --kv-host-memory 64 --hybrid-preempt-be-pages=off"));
  ASSERT_EQ(swapping.exit_code, 0) << swapping.output;
  ASSERT_EQ(swapping_off.exit_code, 0) << swapping_off.output;
  const auto c = lines(swapping.output), d = lines(swapping_off.output);
  ASSERT_EQ(c.size(), 1u);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_GT(c[0]["kv_shared_pages"].get<int64_t>(), 0) << c[0].dump();
  EXPECT_GT(c[0]["kv_offloaded_pages"].get<int64_t>(), 0) << c[0].dump();
  EXPECT_GT(c[0]["kv_transfer_seconds"].get<double>(), 0) << c[0].dump();
  EXPECT_EQ(d[0]["kv_shared_pages"], 0) << d[0].dump();
  const auto bad = testing::run_command(blend(base + " --hybrid-preempt-be-pages=maybe 2>&1"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--hybrid-preempt-be-pages"), std::string::npos) << bad.output;
}

TEST_F(ServingCli, BadFlagsAreAnErrorNotACrash) {
  const std::string model = (*dir_ / "tiny").string();
  auto r = testing::run_command(
      blend("bench serve --model '" + model + "' --kv-layout sideways --duration 1 2>&1"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("sideways"), std::string::npos) << r.output;
  r = testing::run_command(blend("bench serve --model '" + model +
                                 "' --scheduler best --duration 1 --traces '" + traces() +
                                 "' 2>&1"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown scheduler 'best'"), std::string::npos) << r.output;
  // --policy is a plan order (batch, plan, simulate); where it meant the scheduler it is
  // refused naming --scheduler, so that a command line written for that meaning fails rather
  // than being read as another (issue 55: one meaning).
  for (const std::string& command :
       {"serve --model '" + model + "'", "bench serve --model '" + model + "'",
        std::string("simulate-serve"), "bench soak --model '" + model + "'"}) {
    r = testing::run_command(blend(command + " --policy hybrid 2>&1"));
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.output;
    EXPECT_NE(r.output.find("blend: error: --policy hybrid: "), std::string::npos)
        << command << ": " << r.output;
    EXPECT_NE(r.output.find("with --scheduler (fcfs, hybrid, prefill-first, round-robin)"),
              std::string::npos)
        << command << ": " << r.output;
  }
  r = testing::run_command(blend("serve --model '" + model + "' --policy blend 2>&1"));
  EXPECT_NE(r.output.find("the Batch API's plan order with --batch-policy"), std::string::npos)
      << r.output;
  // The hybrid policy's batch flags, on the three commands that take them.
  const std::string with_model = " --model '" + model + "' ";
  for (const std::string& command :
       {"serve" + with_model, "bench serve" + with_model, std::string("simulate-serve ")}) {
    for (const std::string flag : {"--hybrid-initial-batch 0", "--hybrid-batch-step -1"}) {
      r = testing::run_command(blend(command + flag + " 2>&1"));
      EXPECT_NE(r.exit_code, 0) << command << " " << flag;
      EXPECT_NE(r.output.find(flag.substr(0, flag.find(' '))), std::string::npos)
          << command << " " << flag << ": " << r.output;
    }
  }
  r = testing::run_command(
      blend("simulate-serve --rt-rate 1 --duration 10 --traces /nonexistent/traces 2>&1"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("cannot read trace /nonexistent/traces"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace blend
