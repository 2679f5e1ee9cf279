// `blend simulate` as a user runs it: one JSON object per policy entry, with the keys the
// experiments read; bad input is a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

std::string simulate(const std::string& args) {
  return std::string("'") + BLEND_BINARY + "' simulate --json " + args + " 2>&1";
}

// 30 requests on a shared 32-token prefix, half compute-heavy (5 outputs), half memory-heavy.
std::string mixed_workload() {
  std::string input;
  for (int i = 0; i < 30; ++i) {
    std::string prompt = "[";
    for (int k = 0; k < 40 + (i % 5) * 30; ++k)
      prompt += std::to_string(k < 32 ? 7 : 100 + i * 3 + k) + ",";
    prompt.back() = ']';
    input += R"({"custom_id":"r)" + std::to_string(i) +
             R"(","method":"POST","url":"/v1/completions","body":{"prompt":)" + prompt +
             R"(,"max_tokens":)" + std::to_string(i % 2 ? 300 : 5) + R"(,"ignore_eos":true}})" +
             "\n";
  }
  return input;
}

std::vector<json> json_lines(const std::string& text) {
  std::istringstream lines(text);
  std::vector<json> out;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// --dp N (BlendServe §5.5): the batch partitioned as `mpirun -np N blend batch` partitions it,
// each part on its own simulated device; the run takes as long as the slowest replica.
TEST(SimulateCli, DataParallelReplicasShareTheWork) {
  testing::TempDir work;
  testing::write_file(work / "w.jsonl", mixed_workload());
  std::map<int, json> by_dp;
  for (int dp : {1, 2}) {
    const auto r =
        testing::run_command(simulate("--hardware h100 --workload " + (work / "w.jsonl").string() +
                                      " --policy blend --dp " + std::to_string(dp)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<json> runs = json_lines(r.output);
    ASSERT_EQ(runs.size(), 1u);
    by_dp[dp] = runs[0];
  }
  const json& one = by_dp[1];
  const json& two = by_dp[2];
  EXPECT_EQ(two["data_parallel"], 2);
  EXPECT_EQ(two["requests"], 30);
  EXPECT_EQ(two["prompt_tokens"], one["prompt_tokens"]);
  EXPECT_EQ(two["output_tokens"], one["output_tokens"]);
  ASSERT_EQ(two["rank_seconds"].size(), 2u);
  double slowest = 0;
  for (const json& s : two["rank_seconds"]) slowest = std::max(slowest, s.get<double>());
  EXPECT_DOUBLE_EQ(two["seconds"].get<double>(), slowest);
  // Two replicas finish sooner than one, but no more than twice as fast.
  EXPECT_LT(two["seconds"].get<double>(), one["seconds"].get<double>());
  EXPECT_GT(two["seconds"].get<double>(), 0.5 * one["seconds"].get<double>() * 0.999);
  EXPECT_DOUBLE_EQ(two["sharing_optimal"].get<double>(), one["sharing_optimal"].get<double>());
  EXPECT_GE(two["sharing_loss"].get<double>(), 0);
  EXPECT_LE(two["partition_sharing"].get<double>(), two["sharing_optimal"].get<double>());
  // --dp-recut 2: two more cuts run, and the job keeps the shortest of the three.
  const auto recut =
      testing::run_command(simulate("--hardware h100 --workload " + (work / "w.jsonl").string() +
                                    " --policy blend --dp 2 --dp-recut 2"));
  ASSERT_EQ(recut.exit_code, 0) << recut.output;
  const json again = json_lines(recut.output).at(0);
  EXPECT_EQ(again["requests"], 30);
  EXPECT_EQ(again["output_tokens"], one["output_tokens"]);
  EXPECT_DOUBLE_EQ(again["first_cut"]["seconds"].get<double>(), two["seconds"].get<double>());
  ASSERT_EQ(again["first_cut"]["cut_seconds"].size(), 3u);
  double shortest = two["seconds"].get<double>();
  for (const json& s : again["first_cut"]["cut_seconds"])
    shortest = std::min(shortest, s.get<double>());
  EXPECT_DOUBLE_EQ(again["seconds"].get<double>(), shortest);
  for (const char* bad :
       {"--dp 0", "--dp 2 --step-trace x.csv", "--dp 1 --dp-recut 1", "--dp 2 --dp-recut -1"})
    EXPECT_NE(
        testing::run_command(simulate("--workload " + (work / "w.jsonl").string() + " " + bad))
            .exit_code,
        0)
        << bad;
}

// The ablation knobs (issue 27): bad values are refused; the baselines do not see them.
TEST(SimulateCli, AblationKnobsAreCheckedAndLeaveTheBaselinesAlone) {
  testing::TempDir work;
  testing::write_file(work / "w.jsonl", mixed_workload());
  const std::string base = "--hardware h100 --model-shape llama-3-8b --json --workload " +
                           (work / "w.jsonl").string() + " --policy blend,dfs";
  const auto plain = testing::run_command(simulate(base));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  for (const char* knobs : {"--pacing-without budget,spacing,floor", "--split-threshold 0",
                            "--split-threshold 1e15", "--no-capacity-pacing"}) {
    const auto r = testing::run_command(simulate(base + " " + knobs));
    ASSERT_EQ(r.exit_code, 0) << knobs << ": " << r.output;
    EXPECT_EQ(json_lines(r.output).at(1)["seconds"], json_lines(plain.output).at(1)["seconds"])
        << knobs;
  }
  for (const char* bad : {"--pacing-without bogus", "--split-threshold -1"}) {
    const auto r = testing::run_command(simulate(base + " " + bad));
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.output.find(std::string(bad).substr(2, 10)), std::string::npos) << r.output;
  }
}

TEST(SimulateCli, OneJsonLinePerPolicyEntry) {
  testing::TempDir work;
  testing::write_file(work / "w.jsonl", mixed_workload());
  const auto r = testing::run_command(simulate(
      "--hardware h100 --model-shape llama-3-8b --workload " + (work / "w.jsonl").string() +
      " --policy blend,dfs@sequential,random,blend@alg3,blend@alg3@sequential"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<json> runs = json_lines(r.output);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0]["policy"], "blend");
  EXPECT_EQ(runs[0]["overlap"], "overlapped");
  EXPECT_EQ(runs[1]["policy"], "dfs@sequential");
  EXPECT_EQ(runs[1]["overlap"], "sequential");
  // Alg. 3 as published is a policy of its own; its name holds an '@' of its own.
  EXPECT_EQ(runs[3]["policy"], "blend@alg3");
  EXPECT_EQ(runs[3]["overlap"], "overlapped");
  EXPECT_EQ(runs[4]["overlap"], "sequential");
  for (const json& j : runs) {
    for (const char* key : {"throughput_tokens_per_s", "fraction_of_optimal", "fraction_of_ideal",
                            "sharing_ratio", "sharing_optimal", "seconds"})
      EXPECT_TRUE(j.contains(key)) << key;
    // The practical optimum pays the interference the ideal one does not, so it is longer.
    EXPECT_GT(j["fraction_of_optimal"].get<double>(), j["fraction_of_ideal"].get<double>());
    EXPECT_DOUBLE_EQ(j["interference"].get<double>(), 0.71);  // the h100 preset's measured fit
    EXPECT_EQ(j["requests"], 30);
    EXPECT_GT(j["throughput_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(j["sharing_optimal"].get<double>(), 0);
  }

  // Per-step traces (BlendServe Fig. 10): one CSV per policy whose steps add up to the run.
  const auto traced = testing::run_command(
      simulate("--hardware h100 --workload " + (work / "w.jsonl").string() +
               " --policy blend,dfs --interference 0 --step-trace-every 3 --step-trace " +
               (work / "steps-{policy}.csv").string()));
  ASSERT_EQ(traced.exit_code, 0) << traced.output;
  std::istringstream traced_lines(traced.output);
  for (std::string line; std::getline(traced_lines, line);) {
    if (line.empty()) continue;
    const json j = json::parse(line);
    EXPECT_DOUBLE_EQ(j["fraction_of_optimal"].get<double>(), j["fraction_of_ideal"].get<double>());
    std::istringstream csv(
        testing::read_file(work / ("steps-" + j["policy"].get<std::string>() + ".csv")));
    std::string row;
    std::getline(csv, row);
    EXPECT_EQ(row,
              "step,clock_s,compute_s,memory_s,network_s,step_s,prefill_tokens,decode_tokens,"
              "decode_context_tokens");
    double total = 0;
    int64_t rows = 0, decoded = 0;
    while (std::getline(csv, row)) {
      std::vector<std::string> cells;
      std::istringstream cell_stream(row);
      for (std::string cell; std::getline(cell_stream, cell, ',');) cells.push_back(cell);
      ASSERT_EQ(cells.size(), 9u) << row;
      total += std::stod(cells[5]);
      decoded += std::stoll(cells[7]);
      ++rows;
    }
    EXPECT_EQ(rows, (j["steps"].get<int64_t>() + 2) / 3);
    EXPECT_NEAR(total, j["seconds"].get<double>(), 1e-3 * j["seconds"].get<double>());
    // Every output token but each request's first (its prompt's step samples that) is a decode.
    EXPECT_EQ(decoded, j["output_tokens"].get<int64_t>() - j["requests"].get<int64_t>());
  }
  const auto clobber = testing::run_command(simulate("--workload " + (work / "w.jsonl").string() +
                                                     " --policy blend,dfs --step-trace " +
                                                     (work / "one.csv").string()));
  EXPECT_NE(clobber.exit_code, 0);
  EXPECT_NE(clobber.output.find("{policy}"), std::string::npos) << clobber.output;

  const auto bad = testing::run_command(
      simulate("--workload " + (work / "w.jsonl").string() + " --policy blend@sideways"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("sideways"), std::string::npos) << bad.output;
  const auto missing = testing::run_command(simulate("--workload /nonexistent.jsonl"));
  EXPECT_NE(missing.exit_code, 0);
}

// `--planner-hardware`: the plan and the admission pacing see one machine, the clock another
// (a real run planned with a profile). The clock's hardware alone prices the steps and T_o.
TEST(SimulateCli, APlannerOfItsOwnLeavesTheClockAndTheOptimumToTheHardware) {
  testing::TempDir work;
  testing::write_file(work / "w.jsonl", mixed_workload());
  const std::string base = "--hardware h100 --workload " + (work / "w.jsonl").string() +
                           " --policy blend,dfs --sample-fraction 0";
  const auto alone = testing::run_command(simulate(base));
  const auto same = testing::run_command(simulate(base + " --planner-hardware h100"));
  // A planner that believes prefill attention is 1,000x slower sees other densities. (A
  // uniformly faster or slower machine would not: densities are ratios.)
  testing::write_file(work / "slow-attention.json",
                      R"({"name":"slow-attention","compute_tflops":989,"memory_bandwidth_gb_s":)"
                      R"(3352,"network_bandwidth_gb_s":600,"memory_gb":80,)"
                      R"("fit":{"attention_efficiency":0.001}})");
  const auto other = testing::run_command(
      simulate(base + " --planner-hardware " + (work / "slow-attention.json").string()));
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  ASSERT_EQ(same.exit_code, 0) << same.output;
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const std::vector<json> a = json_lines(alone.output), b = json_lines(same.output),
                          c = json_lines(other.output);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  ASSERT_EQ(c.size(), 2u);
  const auto optimum = [](const json& j) {
    return j["seconds"].get<double>() * j["fraction_of_optimal"].get<double>();
  };
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b[i]["seconds"], a[i]["seconds"]) << a[i]["policy"];
    EXPECT_NEAR(optimum(c[i]) / optimum(a[i]), 1.0, 1e-9) << a[i]["policy"];
  }
  // The blend plan (and so its run) depends on the machine it is planned for.
  EXPECT_NE(c[0]["seconds"], a[0]["seconds"]);
  const auto bad = testing::run_command(simulate(base + " --planner-hardware tpu-v9"));
  EXPECT_NE(bad.exit_code, 0);
}

// NanoFlow §4.2 in the simulator: on hardware whose GEMMs compute 512-row tiles, 700-token steps
// pay for 1,024 rows; --dense-batch-sizes with the same profile cuts them to 512 and the job
// takes less simulated time for the same tokens.
TEST(SimulateCli, DiscreteBatchingPaysForItselfOnTiledHardware) {
  testing::TempDir work;
  std::string input;  // 20 prompts of 300 distinct tokens, two output tokens each
  for (int i = 0; i < 20; ++i) {
    std::string prompt = "[";
    for (int k = 0; k < 300; ++k) prompt += std::to_string(100 + i * 300 + k) + ",";
    prompt.back() = ']';
    input += R"({"custom_id":"p)" + std::to_string(i) +
             R"(","method":"POST","url":"/v1/completions","body":{"prompt":)" + prompt +
             R"(,"max_tokens":2,"ignore_eos":true}})" + "\n";
  }
  testing::write_file(work / "w.jsonl", input);
  testing::write_file(work / "tiled.json",
                      R"({"name":"tiled","compute_tflops":989,"memory_bandwidth_gb_s":3352,)"
                      R"("network_bandwidth_gb_s":600,"memory_gb":80,)"
                      R"("fit":{"dense_row_tile":512}})");
  const std::string base =
      "--hardware " + (work / "tiled.json").string() + " --workload " +
      (work / "w.jsonl").string() +
      " --policy fcfs --sample-fraction 0 --max-batch-tokens 700 --step-trace " +
      (work / "{policy}").string();
  const auto any = testing::run_command(simulate(base + "-any.csv"));
  const auto cut = testing::run_command(
      simulate(base + "-cut.csv --dense-batch-sizes " + (work / "tiled.json").string()));
  ASSERT_EQ(any.exit_code, 0) << any.output;
  ASSERT_EQ(cut.exit_code, 0) << cut.output;
  const json a = json_lines(any.output).at(0), c = json_lines(cut.output).at(0);
  EXPECT_EQ(c["output_tokens"], a["output_tokens"]);
  EXPECT_EQ(c["dense_batch_tile"], 512);
  EXPECT_FALSE(a.contains("dense_batch_tile"));
  EXPECT_EQ(a["dense_row_tile"], 512);
  EXPECT_LT(c["seconds"].get<double>(), 0.95 * a["seconds"].get<double>());
  // The first step (prompts only) is 700 tokens without the sizes and 512 with them.
  auto first_step_tokens = [&](const std::string& file) {
    std::istringstream csv(testing::read_file(work / file));
    std::string header, row;
    std::getline(csv, header);
    std::getline(csv, row);
    std::vector<std::string> cells;
    std::istringstream fields(row);
    for (std::string cell; std::getline(fields, cell, ',');) cells.push_back(cell);
    return std::stoll(cells.at(6)) + std::stoll(cells.at(7));
  };
  EXPECT_EQ(first_step_tokens("fcfs-any.csv"), 700);
  EXPECT_EQ(first_step_tokens("fcfs-cut.csv"), 512);
}

}  // namespace
}  // namespace blend
