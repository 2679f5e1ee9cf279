// `blend batch` as a user runs it: OpenAI Batch files in and out, bad lines, stats, and a run
// killed with SIGKILL then rerun (nothing lost, nothing duplicated, same tokens).
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "model/random_init.h"
#include "test_models.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

class BatchCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::write_tiny_model(*dir_ / "tiny", 3);
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string model() { return (*dir_ / "tiny").string(); }

  // Whole lines only: a line still being written (no newline yet) is not counted.
  static std::vector<json> read_jsonl(const std::filesystem::path& path) {
    std::vector<json> out;
    std::string text = testing::read_file(path);
    text.resize(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) out.push_back(json::parse(line));
    return out;
  }

  // A result line's custom_id, or "line-N" for the answer to input line N whose custom_id could
  // not be read (written with custom_id null and error.line N).
  static std::string key_of(const json& result) {
    if (result["custom_id"].is_string()) return result["custom_id"];
    return "line-" + std::to_string(result["error"]["line"].get<int64_t>());
  }

  static std::string batch_cmd(const std::string& input, const std::string& output,
                               const std::string& extra = "", const std::string& kv_gb = "0.05") {
    return std::string("'") + BLEND_BINARY + "' batch --model " + model() + " --input " + input +
           " --output " + output + " --threads 2 --kv-memory " + kv_gb +
           " --deterministic --quiet " + extra;
  }

  static testing::TempDir* dir_;
};

// Token ids first, first + 1, ..., first + n - 1, comma-separated (a JSON array's inside).
std::string token_run(int first, int n) {
  std::string ids;
  for (int k = 0; k < n; ++k) ids += (k ? "," : "") + std::to_string(first + k);
  return ids;
}

// A greedy /v1/completions Batch API line that ignores EOS, its prompt the token ids `ids`
// (token_run's form).
std::string greedy_token_line(const std::string& id, const std::string& ids, int max_tokens) {
  return R"({"custom_id":")" + id +
         R"(","method":"POST","url":"/v1/completions","body":{"prompt":[)" + ids +
         R"(],"max_tokens":)" + std::to_string(max_tokens) +
         R"(,"ignore_eos":true,"temperature":0}})" + "\n";
}

testing::TempDir* BatchCli::dir_ = nullptr;

// --max-model-len reaches the engine: on Phi-3's longrope it picks the factor set (long over the
// original 1024 positions, short at 1024 and below), and past the model's context it is refused.
TEST_F(BatchCli, MaxModelLenPicksPhi3sLongropeFactors) {
  testing::TempDir work;
  RandomInitOptions o;
  o.seed = 4;
  o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  write_random_model(*find_model_preset("tiny-phi3"), work / "phi3", o);
  testing::write_file(
      work / "in.jsonl",
      R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":[)" +
          token_run(500, 40) +
          R"(],"max_tokens":4,"logprobs":1,"ignore_eos":true,"temperature":0}})"
          "\n");
  auto run = [&](const std::string& out, const std::string& extra) {
    return testing::run_command(
        std::string("'") + BLEND_BINARY + "' batch --model " + (work / "phi3").string() +
        " --input " + (work / "in.jsonl").string() + " --output " + (work / out).string() +
        " --threads 2 --deterministic --quiet " + extra);
  };
  auto logprobs = [&](const std::string& out) {
    return read_jsonl(work / out)
        .at(0)["response"]["body"]["choices"][0]["logprobs"]["token_logprobs"];
  };
  ASSERT_EQ(run("long.jsonl", "").exit_code, 0);
  ASSERT_EQ(run("long4096.jsonl", "--max-model-len 4096").exit_code, 0);
  ASSERT_EQ(run("short.jsonl", "--max-model-len 1024").exit_code, 0);
  EXPECT_EQ(logprobs("long.jsonl"), logprobs("long4096.jsonl"));
  EXPECT_NE(logprobs("long.jsonl"), logprobs("short.jsonl"));
  const auto too_long = run("x.jsonl", "--max-model-len 5000 2>&1");
  EXPECT_NE(too_long.exit_code, 0);
  EXPECT_NE(too_long.output.find("max_model_len 5000"), std::string::npos) << too_long.output;
}

TEST_F(BatchCli, CompletionsChatAndBadLines) {
  testing::TempDir work;
  std::string input;
  input +=
      R"({"custom_id":"c1","method":"POST","url":"/v1/completions","body":{"model":"tiny","prompt":"Hello there","max_tokens":5,"temperature":0}})"
      "\n";
  input +=
      R"({"custom_id":"c2","method":"POST","url":"/v1/completions","body":{"model":"tiny","prompt":[1,2,3,4],"max_tokens":3,"logprobs":2,"ignore_eos":true}})"
      "\n";
  input +=
      R"({"custom_id":"chat1","method":"POST","url":"/v1/chat/completions","body":{"model":"tiny","messages":[{"role":"user","content":"Hi!"}],"max_tokens":4,"seed":5,"logprobs":true,"top_logprobs":1}})"
      "\n";
  input += "this is not json\n";
  input += R"({"custom_id":"badurl","method":"POST","url":"/v1/embeddings","body":{"input":"x"}})"
           "\n";
  input +=
      R"({"custom_id":"badtemp","method":"POST","url":"/v1/completions","body":{"prompt":"x","temperature":"hot"}})"
      "\n";
  input += "\n";
  testing::write_file(work / "in.jsonl", input);
  const auto r =
      testing::run_command(batch_cmd((work / "in.jsonl").string(), (work / "out.jsonl").string(),
                                     "--stats " + (work / "stats.json").string()) +
                           " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, json> by_id;
  for (const json& line : read_jsonl(work / "out.jsonl")) by_id[key_of(line)] = line;
  ASSERT_EQ(by_id.size(), 6u);

  const json& c1 = by_id["c1"]["response"];
  EXPECT_EQ(c1["status_code"], 200);
  EXPECT_EQ(c1["body"]["object"], "text_completion");
  EXPECT_EQ(c1["body"]["model"], "tiny");
  EXPECT_EQ(c1["body"]["usage"]["prompt_tokens"], 2);  // "Hello", " there"
  EXPECT_LE(c1["body"]["usage"]["completion_tokens"].get<int>(), 5);
  EXPECT_TRUE(c1["body"]["choices"][0]["text"].is_string());

  const json& c2 = by_id["c2"]["response"]["body"];
  EXPECT_EQ(c2["usage"]["completion_tokens"], 3);
  EXPECT_EQ(c2["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c2["choices"][0]["logprobs"]["token_logprobs"].size(), 3u);
  // The top 2 and the sampled token, as vLLM's completions dicts: 3 entries when it is not one.
  const json& top = c2["choices"][0]["logprobs"]["top_logprobs"][0];
  EXPECT_GE(top.size(), 2u);
  EXPECT_LE(top.size(), 3u);
  EXPECT_TRUE(top.contains(c2["choices"][0]["logprobs"]["tokens"][0].get<std::string>()));

  const json& chat = by_id["chat1"]["response"]["body"];
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_GT(chat["usage"]["prompt_tokens"].get<int>(), 5);  // the template adds headers
  EXPECT_EQ(chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);

  EXPECT_EQ(by_id["line-4"]["response"]["status_code"], 400);
  EXPECT_EQ(by_id["badurl"]["response"]["status_code"], 400);
  EXPECT_NE(by_id["badurl"]["response"]["body"]["error"]["message"].get<std::string>().find(
                "unsupported url"),
            std::string::npos);
  EXPECT_EQ(by_id["badtemp"]["response"]["body"]["error"]["param"], "temperature");

  const json stats = json::parse(testing::read_file(work / "stats.json"));
  for (const char* key : {"requests", "input_tokens", "output_tokens", "wall_seconds",
                          "throughput_tokens_per_s", "steps", "mean_batch_tokens", "kv_peak_bytes"})
    EXPECT_TRUE(stats.contains(key)) << key;
  EXPECT_EQ(stats["requests"], 6);
  EXPECT_EQ(stats["failed"], 3);
  EXPECT_GT(stats["throughput_tokens_per_s"].get<double>(), 0.0);
  // The backend's op statistics, through Backend::op_statistics (the cpu backend times every
  // pass): every operation of the layer sequence, the passes' threads at least 1.
  ASSERT_TRUE(stats.contains("op_seconds"));
  double op_total = 0;
  for (const char* op : {"embed", "norm", "qkv", "rope_kv", "attention", "o_proj", "gate_up", "act",
                         "down", "lm_head"}) {
    ASSERT_TRUE(stats["op_seconds"].contains(op)) << op;
    EXPECT_GE(stats["op_seconds"][op].get<double>(), 0.0) << op;
    op_total += stats["op_seconds"][op].get<double>();
  }
  EXPECT_GT(op_total, 0.0);
  EXPECT_LT(op_total, stats["wall_seconds"].get<double>());
  EXPECT_GE(stats["pass_threads_mean"].get<double>(), 1.0);

  // Rerunning with the same output skips everything already there.
  const auto again = testing::run_command(
      batch_cmd((work / "in.jsonl").string(), (work / "out.jsonl").string()) + " 2>&1");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(read_jsonl(work / "out.jsonl").size(), 6u);
}

// vLLM's output fields in `blend batch` lines: min_tokens holds off an EOS the logits favour,
// stop_reason names the stop token, skip_special_tokens false writes special tokens, and a
// min_tokens over max_tokens is that line's error.
TEST_F(BatchCli, VllmOutputFieldsInBatchLines) {
  testing::TempDir work;
  const std::string head = R"({"method":"POST","url":"/v1/completions","custom_id":)";
  std::string input;
  input += head +
           R"("min","body":{"prompt":"x","max_tokens":12,"min_tokens":5,"temperature":0,)"
           R"("logit_bias":{"128009":100}}})" +
           "\n";
  input += head +
           R"("stop_id","body":{"prompt":"x","max_tokens":12,"temperature":0,)"
           R"("logit_bias":{"1234":100},"stop_token_ids":[1234]}})" +
           "\n";
  input += head +
           R"("special","body":{"prompt":"x","max_tokens":2,"temperature":0,"ignore_eos":true,)"
           R"("logit_bias":{"128000":100},"skip_special_tokens":false}})" +
           "\n";
  input += head + R"("too_many","body":{"prompt":"x","max_tokens":2,"min_tokens":3}})" + "\n";
  testing::write_file(work / "in.jsonl", input);
  const auto r = testing::run_command(
      batch_cmd((work / "in.jsonl").string(), (work / "out.jsonl").string()) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, json> by_id;
  for (const json& line : read_jsonl(work / "out.jsonl")) by_id[key_of(line)] = line;
  ASSERT_EQ(by_id.size(), 4u);
  const json& min = by_id["min"]["response"]["body"];
  EXPECT_EQ(min["usage"]["completion_tokens"], 6);  // 5 tokens, then the EOS
  EXPECT_EQ(min["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(min["choices"][0].contains("stop_reason"));
  EXPECT_TRUE(min["choices"][0]["stop_reason"].is_null());
  const json& stop_id = by_id["stop_id"]["response"]["body"];
  EXPECT_EQ(stop_id["usage"]["completion_tokens"], 1);
  EXPECT_EQ(stop_id["choices"][0]["stop_reason"], 1234);
  EXPECT_EQ(by_id["special"]["response"]["body"]["choices"][0]["text"],
            "<|begin_of_text|><|begin_of_text|>");
  EXPECT_EQ(by_id["too_many"]["response"]["status_code"], 400);
  EXPECT_EQ(by_id["too_many"]["response"]["body"]["error"]["param"], "min_tokens");
}

// Requests sharing a prompt prefix, with the cache on and off: same texts (deterministic
// mode), the sharing ratio reported against the optimum, cached tokens in each usage.
// --zoo: lines pick their model by folder name, in one engine, under fcfs and a planned order,
// and get what a run of that model alone gives; LoRA adapters are refused for now.
TEST_F(BatchCli, AZooRunsEachLineOnTheModelItNames) {
  testing::TempDir work;
  const auto zoo = work / "zoo";
  std::filesystem::create_directories(zoo);
  std::filesystem::copy(model(), zoo / "alpha");
  ASSERT_EQ(testing::run_command(std::string("'") + BLEND_BINARY + "' model derive --base " +
                                 (zoo / "alpha").string() + " --out " + (zoo / "beta").string() +
                                 " --full --layers 1 --seed 4")
                .exit_code,
            0);
  // gamma: a LoRA adapter (PEFT layout) on alpha, served on alpha's weights.
  ASSERT_EQ(testing::run_command(std::string("'") + BLEND_BINARY + "' model derive --base " +
                                 (zoo / "alpha").string() + " --out " + (zoo / "gamma").string() +
                                 " --lora --rank 4 --seed 6")
                .exit_code,
            0);
  auto line = [](const std::string& id, const std::string& model, int seed) {
    return R"({"custom_id":")" + id +
           R"(","method":"POST","url":"/v1/completions","body":{"model":")" + model +
           R"(","prompt":"Once upon a time )" + std::to_string(seed) +
           R"(","max_tokens":6,"temperature":0.7,"seed":)" + std::to_string(seed) + "}}\n";
  };
  std::string both, alpha, beta, gamma;
  for (int i = 0; i < 4; ++i) {
    both += line("a" + std::to_string(i), "alpha", i) + line("b" + std::to_string(i), "beta", i) +
            line("c" + std::to_string(i), "gamma", i);
    alpha += line("a" + std::to_string(i), "alpha", i);
    beta += line("b" + std::to_string(i), "beta", i);
    gamma += line("c" + std::to_string(i), "gamma", i);
  }
  both += line("x", "delta", 1);
  testing::write_file(work / "both.jsonl", both);
  testing::write_file(work / "alpha.jsonl", alpha);
  testing::write_file(work / "beta.jsonl", beta);
  testing::write_file(work / "gamma.jsonl", gamma);
  auto texts = [](const std::filesystem::path& out) {
    std::map<std::string, std::string> t;
    for (const json& r : read_jsonl(out))
      t[r["custom_id"]] = r["response"]["status_code"] == 200
                              ? r["response"]["body"]["model"].get<std::string>() + ":" +
                                    r["response"]["body"]["choices"][0]["text"].get<std::string>()
                              : "error " + r["response"]["status_code"].dump();
    return t;
  };
  const std::string common = std::string("'") + BLEND_BINARY +
                             "' batch --threads 2 --kv-memory 0.05 --deterministic --quiet ";
  for (const std::string policy : {"fcfs", "blend"}) {
    const auto out = work / ("zoo-" + policy + ".jsonl");
    ASSERT_EQ(testing::run_command(common + "--zoo " + zoo.string() + " --input " +
                                   (work / "both.jsonl").string() + " --output " + out.string() +
                                   " --policy " + policy)
                  .exit_code,
              0);
    auto together = texts(out);
    EXPECT_EQ(together["x"], "error 404");
    together.erase("x");
    std::map<std::string, std::string> alone;
    for (const std::string m : {"alpha", "beta", "gamma"}) {
      const auto single = work / (m + "-" + policy + ".jsonl");
      ASSERT_EQ(
          testing::run_command(common + "--model " + (zoo / m).string() + " --input " +
                               (work / (m + ".jsonl")).string() + " --output " + single.string())
              .exit_code,
          0);
      alone.merge(texts(single));
    }
    EXPECT_EQ(together, alone) << policy;
    EXPECT_NE(together["a0"].substr(6), together["c0"].substr(6));  // the adapter matters
  }
  // vLLM's spelling: --model alpha --lora-modules gamma=DIR serves the adapter by that name.
  const auto vllm_style = work / "lora-modules.jsonl";
  ASSERT_EQ(
      testing::run_command(common + "--model " + (zoo / "alpha").string() +
                           " --lora-modules gamma=" + (zoo / "gamma").string() + " --input " +
                           (work / "gamma.jsonl").string() + " --output " + vllm_style.string())
          .exit_code,
      0);
  const auto gamma_alone = texts(work / "gamma-fcfs.jsonl");
  EXPECT_EQ(texts(vllm_style), gamma_alone);
  std::filesystem::create_directories(zoo / "lora");
  testing::write_file(zoo / "lora" / "adapter_config.json",
                      R"({"peft_type": "LORA", "base_model_name_or_path": "org/missing"})");
  const auto refused = testing::run_command(common + "--zoo " + zoo.string() + " --input " +
                                            (work / "both.jsonl").string() + " --output " +
                                            (work / "never.jsonl").string() + " 2>&1");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("is for 'org/missing'"), std::string::npos) << refused.output;
}

// BlockLLM's stitching block from the command line: a widened copy of the model is the same
// function in a wider stream, so the block `zoo stitch` fits carries the stream across exactly
// (up to bf16 rounding); a bad request is refused with a message.
TEST_F(BatchCli, ZooStitchCarriesAStreamIntoAWiderCopy) {
  testing::TempDir work;
  const std::string blend = std::string("'") + BLEND_BINARY + "' ";
  const auto wide = work / "wide";
  const auto derived = testing::run_command(blend + "model derive --base " + model() + " --out " +
                                            wide.string() + " --widen 80 --seed 2 2>&1");
  ASSERT_EQ(derived.exit_code, 0) << derived.output;
  const auto report = work / "stitch.json", block = work / "stitch.safetensors";
  const auto stitched = testing::run_command(
      blend + "zoo stitch --threads 2 --points 1 --steps 1 --head " + model() + " --tail " +
      wide.string() + " --json " + report.string() + " --out " + block.string() + " 2>&1");
  ASSERT_EQ(stitched.exit_code, 0) << stitched.output;
  const json r = json::parse(testing::read_file(report));
  ASSERT_EQ(r["points"].size(), 1u);
  EXPECT_GT(r["train_positions"].get<int>(), 66);  // the built-in prompts' even half
  EXPECT_EQ(r["points"][0]["head_layer"], 0);
  EXPECT_EQ(r["points"][0]["tail_layer"], 1);
  EXPECT_GT(r["points"][0]["least squares"]["cosine"].get<double>(), 0.999);
  EXPECT_GT(r["points"][0]["trained"]["cosine"].get<double>(), 0.99);
  EXPECT_GT(r["points"][0]["this point alone"]["cosine"].get<double>(), 0.999);
  EXPECT_TRUE(std::filesystem::exists(block));

  const auto narrower = testing::run_command(blend + "model derive --base " + model() + " --out " +
                                             (work / "narrow").string() + " --widen 32 2>&1");
  EXPECT_NE(narrower.exit_code, 0);
  EXPECT_NE(narrower.output.find("must exceed the base's 64"), std::string::npos)
      << narrower.output;
  const auto no_points = testing::run_command(blend + "zoo stitch --points 0 --head " + model() +
                                              " --tail " + wide.string() + " 2>&1");
  EXPECT_NE(no_points.exit_code, 0);
  EXPECT_NE(no_points.output.find("at least one stitching point"), std::string::npos)
      << no_points.output;
}

// BlockLLM's adaptive serving from the command line: `zoo analyze --out` records the blocks and
// what borrowing them costs; `batch --adaptive-blocks` runs the lines that allow it through the
// borrowed blocks (beta changed only layer 1, and both of its blocks are borrowed at this
// threshold: those lines answer as alpha), the others through their own.
TEST_F(BatchCli, AdaptiveServingRunsTheLinesThatAllowItThroughBorrowedBlocks) {
  testing::TempDir work;
  const auto zoo = work / "zoo";
  std::filesystem::create_directories(zoo);
  std::filesystem::copy(model(), zoo / "alpha");
  const std::string blend = std::string("'") + BLEND_BINARY + "' ";
  ASSERT_EQ(
      testing::run_command(blend + "model derive --base " + (zoo / "alpha").string() + " --out " +
                           (zoo / "beta").string() + " --full --layers 1 --seed 4 --scale 0.5")
          .exit_code,
      0);
  const auto analysis = work / "eq.json";
  const auto analyzed =
      testing::run_command(blend + "zoo analyze --threads 2 --threshold 0.01 --zoo " +
                           zoo.string() + " --out " + analysis.string() + " 2>&1");
  ASSERT_EQ(analyzed.exit_code, 0) << analyzed.output;
  const json report = json::parse(testing::read_file(analysis));
  ASSERT_EQ(report["models"].size(), 1u);
  const json& adaptive = report["models"][0]["adaptive"];
  EXPECT_EQ(adaptive["replaced"], 2);
  EXPECT_GE(adaptive["top_token_agreement"].get<double>(), 0.0);
  EXPECT_LE(adaptive["top_token_agreement"].get<double>(), 1.0);
  EXPECT_GT(adaptive["kl_nats"].get<double>(), 0.0);

  auto line = [](const std::string& id, const std::string& model, int seed,
                 const std::string& extra = "") {
    return R"({"custom_id":")" + id +
           R"(","method":"POST","url":"/v1/completions","body":{"model":")" + model +
           R"(","prompt":"Once upon a time )" + std::to_string(seed) +
           R"(","max_tokens":8,"temperature":0)" + extra + "}}\n";
  };
  std::string lines;
  for (int i = 0; i < 3; ++i) {
    const std::string k = std::to_string(i);
    lines += line("alpha" + k, "alpha", i) + line("own" + k, "beta", i) +
             line("adaptive" + k, "beta", i, R"(,"adaptive_blocks":true)");
  }
  lines += line("bad", "beta", 0, R"(,"adaptive_blocks":"yes")");
  testing::write_file(work / "in.jsonl", lines);
  const std::string common = blend + "batch --threads 2 --kv-memory 0.05 --deterministic --zoo " +
                             zoo.string() + " --input " + (work / "in.jsonl").string() + " ";
  const auto out = work / "out.jsonl";
  const auto ran = testing::run_command(common + "--output " + out.string() +
                                        " --adaptive-blocks " + analysis.string() + " --stats " +
                                        (work / "stats.json").string() + " 2>&1");
  ASSERT_EQ(ran.exit_code, 0) << ran.output;
  EXPECT_NE(ran.output.find("'beta' may run 2 blocks of 'alpha'"), std::string::npos) << ran.output;
  std::map<std::string, json> by_id;
  for (const json& r : read_jsonl(out)) by_id[r["custom_id"]] = r["response"];
  ASSERT_EQ(by_id.size(), 10u);
  EXPECT_EQ(by_id["bad"]["status_code"], 400);
  int differ = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string k = std::to_string(i);
    auto text = [&](const std::string& id) {
      return by_id[id]["body"]["choices"][0]["text"].get<std::string>();
    };
    EXPECT_EQ(text("adaptive" + k), text("alpha" + k)) << i;
    EXPECT_EQ(by_id["adaptive" + k]["body"]["model"], "beta");
    differ += text("own" + k) != text("alpha" + k) ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "beta answers as alpha: the test cannot tell the chains apart";
  EXPECT_EQ(json::parse(testing::read_file(work / "stats.json"))["adaptive_requests"], 3);
  // A planned order runs the same lines the same way (issue 55: the planned runner rebuilt each
  // request without its adaptive_blocks, so under these policies the lines ran their own chain).
  for (const std::string policy : {"blend", "dfs", "random"}) {
    const auto planned_out = work / ("out-" + policy + ".jsonl");
    const auto planned_stats = work / ("stats-" + policy + ".json");
    const auto planned = testing::run_command(
        common + "--output " + planned_out.string() + " --policy " + policy +
        " --adaptive-blocks " + analysis.string() + " --stats " + planned_stats.string() + " 2>&1");
    ASSERT_EQ(planned.exit_code, 0) << policy << ": " << planned.output;
    std::map<std::string, json> planned_by_id;
    for (const json& r : read_jsonl(planned_out)) planned_by_id[r["custom_id"]] = r["response"];
    ASSERT_EQ(planned_by_id.size(), 10u) << policy;
    for (const auto& [id, response] : by_id)
      EXPECT_EQ(planned_by_id[id]["body"].value("choices", json()),
                response["body"].value("choices", json()))
          << policy << " " << id;
    EXPECT_EQ(json::parse(testing::read_file(planned_stats))["adaptive_requests"], 3) << policy;
  }

  const auto orphan = testing::run_command(common + "--output " + (work / "x.jsonl").string() +
                                           " --adaptive-serving all 2>&1");
  EXPECT_NE(orphan.exit_code, 0);
  EXPECT_NE(orphan.output.find("need --adaptive-blocks"), std::string::npos) << orphan.output;
  // --tenancy: the same answers with less sharing (without --adaptive-blocks a line that allows
  // borrowing runs its own chain); an unknown value is refused.
  const auto ps = work / "ps.jsonl";
  ASSERT_EQ(testing::run_command(common + "--output " + ps.string() + " --tenancy ps").exit_code,
            0);
  std::map<std::string, json> ps_by_id;
  for (const json& r : read_jsonl(ps)) ps_by_id[r["custom_id"]] = r["response"];
  for (const std::string id : {"alpha0", "own1", "adaptive2"})
    EXPECT_EQ(ps_by_id[id]["body"]["choices"][0]["text"],
              by_id[id.starts_with("adaptive") ? "own2" : id]["body"]["choices"][0]["text"])
        << id;
  EXPECT_NE(testing::run_command(common + "--output " + (work / "y.jsonl").string() +
                                 " --tenancy shared 2>&1")
                .exit_code,
            0);
}

// OpenAI's n in a batch line: one result line with n choices, choice i the sample a line with
// seed + i and n = 1 gives (the server's n samples are seeded the same way), under fcfs and a
// planned order.
TEST_F(BatchCli, ALineWithNSamplesAnswersOnceWithNChoices) {
  testing::TempDir work;
  auto line = [](const std::string& id, int n, int seed) {
    return R"({"custom_id":")" + id +
           R"(","method":"POST","url":"/v1/completions","body":{"prompt":"Tell me a story","max_tokens":8,"temperature":1.0,"n":)" +
           std::to_string(n) + R"(,"seed":)" + std::to_string(seed) + "}}\n";
  };
  testing::write_file(work / "n.jsonl", line("three", 3, 40) + line("one", 1, 50));
  testing::write_file(work / "single.jsonl",
                      line("s0", 1, 40) + line("s1", 1, 41) + line("s2", 1, 42));
  const auto single = work / "single-out.jsonl";
  ASSERT_EQ(
      testing::run_command(batch_cmd((work / "single.jsonl").string(), single.string())).exit_code,
      0);
  std::map<std::string, std::string> alone;
  for (const json& r : read_jsonl(single))
    alone[r["custom_id"]] = r["response"]["body"]["choices"][0]["text"];
  for (const std::string policy : {"fcfs", "blend"}) {
    const auto out = work / ("n-" + policy + ".jsonl");
    ASSERT_EQ(testing::run_command(
                  batch_cmd((work / "n.jsonl").string(), out.string(), "--policy " + policy))
                  .exit_code,
              0);
    const auto results = read_jsonl(out);
    ASSERT_EQ(results.size(), 2u) << policy;
    for (const json& r : results) {
      const json& body = r["response"]["body"];
      if (r["custom_id"] == "one") {
        EXPECT_EQ(body["choices"].size(), 1u);
        continue;
      }
      ASSERT_EQ(body["choices"].size(), 3u) << policy;
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(body["choices"][i]["index"], i);
        EXPECT_EQ(body["choices"][i]["text"], alone["s" + std::to_string(i)]) << policy << " " << i;
      }
      EXPECT_EQ(body["usage"]["completion_tokens"], 24);
    }
  }
}

TEST_F(BatchCli, PrefixCacheOnAndOffGiveTheSameResults) {
  testing::TempDir work;
  std::string input;
  std::string shared;
  for (int i = 0; i < 40; ++i) shared += std::to_string(100 + i * 7) + ",";
  for (int i = 0; i < 6; ++i)
    input += R"({"custom_id":"r)" + std::to_string(i) +
             R"(","method":"POST","url":"/v1/completions","body":{"prompt":[)" + shared +
             std::to_string(5000 + i) + R"(],"max_tokens":4,"ignore_eos":true,"temperature":0}})" +
             "\n";
  testing::write_file(work / "in.jsonl", input);
  std::map<std::string, std::map<std::string, std::string>> texts;
  std::map<std::string, json> stats;
  for (const std::string cache : {"on", "off"}) {
    const auto out = work / ("out-" + cache + ".jsonl");
    const auto st = work / ("stats-" + cache + ".json");
    const auto r =
        testing::run_command(batch_cmd((work / "in.jsonl").string(), out.string(),
                                       "--prefix-cache " + cache + " --stats " + st.string()) +
                             " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const json& line : read_jsonl(out)) {
      const json& body = line["response"]["body"];
      texts[cache][line["custom_id"]] = body["choices"][0]["text"];
      if (cache == "on" && line["custom_id"] != "r0") {
        EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 40);
      }
    }
    stats[cache] = json::parse(testing::read_file(st));
  }
  EXPECT_EQ(texts["on"], texts["off"]);
  const double optimal = 5.0 * 40 / (6 * 41);
  EXPECT_NEAR(stats["on"]["sharing_optimal"].get<double>(), optimal, 1e-9);
  EXPECT_NEAR(stats["on"]["sharing_ratio"].get<double>(), optimal, 1e-9);
  EXPECT_EQ(stats["off"]["sharing_ratio"].get<double>(), 0.0);
  const auto bad = testing::run_command(
      batch_cmd((work / "in.jsonl").string(), (work / "x.jsonl").string(), "--prefix-cache maybe") +
      " 2>&1");
  EXPECT_NE(bad.exit_code, 0);
}

// The planner's orders (BlendServe dual scanner, prefix-tree DFS, random) change when requests
// run, never what they produce (deterministic mode); every request is answered once.
TEST_F(BatchCli, PlannedOrdersGiveTheSameResults) {
  testing::TempDir work;
  std::string input;
  for (int g = 0; g < 3; ++g)
    for (int i = 0; i < 5; ++i)
      input += greedy_token_line(
          "g" + std::to_string(g) + "-" + std::to_string(i),
          token_run(300 + g * 50, 20 + 10 * g) + "," + token_run(7000 + i * 13, 1 + i),
          g == 1 ? 12 : 3);
  testing::write_file(work / "in.jsonl", input);
  std::map<std::string, std::map<std::string, std::string>> texts;
  for (const std::string policy : {"fcfs", "blend", "blend@alg3", "dfs", "random"}) {
    const auto out = work / ("out-" + policy + ".jsonl");
    const auto st = work / ("stats-" + policy + ".json");
    const auto r =
        testing::run_command(batch_cmd((work / "in.jsonl").string(), out.string(),
                                       "--policy " + policy + " --stats " + st.string()) +
                             " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << policy << ": " << r.output;
    for (const json& line : read_jsonl(out))
      texts[policy][line["custom_id"]] = line["response"]["body"]["choices"][0]["text"];
    EXPECT_EQ(texts[policy].size(), 15u) << policy;
    const json stats = json::parse(testing::read_file(st));
    EXPECT_EQ(stats["policy"], policy);
    EXPECT_GT(stats["sharing_ratio"].get<double>(), 0.5 * stats["sharing_optimal"].get<double>());
  }
  EXPECT_EQ(texts["blend"], texts["fcfs"]);
  EXPECT_EQ(texts["dfs"], texts["fcfs"]);
  EXPECT_EQ(texts["random"], texts["fcfs"]);
  const auto bad = testing::run_command(
      batch_cmd((work / "in.jsonl").string(), (work / "x.jsonl").string(), "--policy lifo") +
      " 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  // Pacing's rules dropped (the ablation `blend simulate --pacing-without` runs) change the
  // order's pace, not the tokens; an unknown rule is refused.
  const auto unpaced_out = work / "out-unpaced.jsonl";
  const auto unpaced =
      testing::run_command(batch_cmd((work / "in.jsonl").string(), unpaced_out.string(),
                                     "--policy blend --pacing-without budget,spacing,floor") +
                           " 2>&1");
  ASSERT_EQ(unpaced.exit_code, 0) << unpaced.output;
  std::map<std::string, std::string> unpaced_texts;
  for (const json& line : read_jsonl(unpaced_out))
    unpaced_texts[line["custom_id"]] = line["response"]["body"]["choices"][0]["text"];
  EXPECT_EQ(unpaced_texts, texts["fcfs"]);
  const auto bad_rule =
      testing::run_command(batch_cmd((work / "in.jsonl").string(), (work / "y.jsonl").string(),
                                     "--policy blend --pacing-without haste") +
                           " 2>&1");
  EXPECT_NE(bad_rule.exit_code, 0);
  EXPECT_NE(bad_rule.output.find("budget, spacing or floor"), std::string::npos) << bad_rule.output;
}

// `blend batch --step-timings` then `blend profile --steps` (the simulator's calibration on the
// engine's own steps): one line per engine step, covering every computed token, and a
// profile fitted on them that `--hardware` accepts.
TEST_F(BatchCli, StepTimingsFeedAProfileFit) {
  testing::TempDir work;
  std::string input;
  for (int i = 0; i < 12; ++i)
    input += greedy_token_line("s" + std::to_string(i), token_run(500 + i * 211, 20 + 15 * i),
                               2 + (i * 7) % 19);
  testing::write_file(work / "in.jsonl", input);
  const auto trace = work / "steps.jsonl";
  const auto r =
      testing::run_command(batch_cmd((work / "in.jsonl").string(), (work / "out.jsonl").string(),
                                     "--policy dfs --stats " + (work / "st.json").string() +
                                         " --step-timings " + trace.string()) +
                           " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json stats = json::parse(testing::read_file(work / "st.json"));
  const std::vector<json> steps = read_jsonl(trace);
  ASSERT_EQ(static_cast<int64_t>(steps.size()), stats["steps"].get<int64_t>());
  int64_t tokens = 0;
  double seconds = 0;
  for (const json& s : steps) {
    tokens += s["prefill_tokens"].get<int64_t>() + s["decode_tokens"].get<int64_t>();
    EXPECT_GT(s["seconds"].get<double>(), 0);
    seconds += s["seconds"].get<double>();
  }
  EXPECT_NEAR(static_cast<double>(tokens),
              stats["mean_batch_tokens"].get<double>() * stats["steps"].get<double>(), 0.5);
  EXPECT_LE(seconds, stats["wall_seconds"].get<double>());

  const std::string profile = std::string("'") + BLEND_BINARY + "' profile --model " + model() +
                              " --threads 2 --reps 1 --out ";
  const auto p = testing::run_command(profile + (work / "p.json").string() + " --steps " +
                                      trace.string() + " 2>&1");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_NE(p.output.find("fit on the engine's steps"), std::string::npos) << p.output;
  // The scan of step sizes ran (NanoFlow §4.2): its points are in the table, its tile in the fit.
  EXPECT_NE(p.output.find("GEMM row tile: "), std::string::npos) << p.output;
  EXPECT_NE(p.output.find("dense "), std::string::npos) << p.output;
  const json fitted = json::parse(testing::read_file(work / "p.json"));
  EXPECT_GE(fitted["fit"]["dense_row_tile"].get<int64_t>(), 1);
  EXPECT_EQ(fitted["steps_fit"]["files"][0], trace.string());
  EXPECT_LT(std::abs(fitted["steps_fit"]["total_error"].get<double>()), 0.5);
  EXPECT_TRUE(fitted.contains("isolated_fit"));
  // Every request is temperature 0: each step's rows are plain greedy.
  for (const json& s : steps) EXPECT_TRUE(s["plain_draws"].get<bool>());
  // --refit: the same fit from the profile just written, with no backend run.
  const auto refit =
      testing::run_command(std::string("'") + BLEND_BINARY + "' profile --model " + model() +
                           " --refit " + (work / "p.json").string() + " --steps " + trace.string() +
                           " --out " + (work / "r.json").string() + " 2>&1");
  ASSERT_EQ(refit.exit_code, 0) << refit.output;
  const json refitted = json::parse(testing::read_file(work / "r.json"));
  EXPECT_EQ(refitted["fit"], fitted["fit"]);
  EXPECT_EQ(refitted["iteration"], fitted["iteration"]);
  EXPECT_EQ(refitted["isolated_fit"], fitted["isolated_fit"]);
  const auto no_steps = testing::run_command(
      std::string("'") + BLEND_BINARY + "' profile --model " + model() + " --refit " +
      (work / "p.json").string() + " --out " + (work / "s.json").string() + " 2>&1");
  EXPECT_NE(no_steps.exit_code, 0);
  EXPECT_NE(no_steps.output.find("--refit needs --steps"), std::string::npos) << no_steps.output;
  std::filesystem::remove(work / "out.jsonl");
  const auto again =
      testing::run_command(batch_cmd((work / "in.jsonl").string(), (work / "out.jsonl").string(),
                                     "--policy blend --hardware " + (work / "p.json").string() +
                                         " --dense-batch-sizes " + (work / "p.json").string()) +
                           " 2>&1");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(read_jsonl(work / "out.jsonl").size(), 12u);

  // Not a step timings file: a clear message and a non-zero exit.
  const auto bad = testing::run_command(profile + (work / "q.json").string() + " --steps " +
                                        (work / "in.jsonl").string() + " 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("step timings"), std::string::npos) << bad.output;
  // Nothing to write, or the nano-batch profile of a backend that has no nano-batches: refused
  // before anything is timed.
  const std::string bare = std::string("'") + BLEND_BINARY + "' profile --model " + model();
  const auto nothing = testing::run_command(bare + " 2>&1");
  EXPECT_NE(nothing.exit_code, 0);
  EXPECT_NE(nothing.output.find("--out is required"), std::string::npos) << nothing.output;
  const auto cpu_nano =
      testing::run_command(bare + " --nano " + (work / "n.json").string() + " 2>&1");
  EXPECT_NE(cpu_nano.exit_code, 0);
  EXPECT_NE(cpu_nano.output.find("--backend cuda"), std::string::npos) << cpu_nano.output;
  EXPECT_FALSE(std::filesystem::exists(work / "n.json"));
}

TEST_F(BatchCli, KillNineThenRerunLosesAndDuplicatesNothing) {
  testing::TempDir work;
  std::string input;
  const int n = 48;
  for (int i = 0; i < n; ++i) {
    json line = {{"custom_id", "req-" + std::to_string(i)},
                 {"method", "POST"},
                 {"url", "/v1/completions"},
                 {"body",
                  {{"prompt", "Request number " + std::to_string(i) + " asks for a story."},
                   {"max_tokens", 24 + i % 16},
                   {"temperature", 0.7},
                   {"ignore_eos", true}}}};
    input += line.dump() + "\n";
  }
  testing::write_file(work / "in.jsonl", input);
  const std::string in = (work / "in.jsonl").string();

  // The reference: one clean run.
  ASSERT_EQ(
      testing::run_command(batch_cmd(in, (work / "clean.jsonl").string(), "--max-batch-tokens 64"))
          .exit_code,
      0);
  std::map<std::string, std::string> clean;
  for (const json& l : read_jsonl(work / "clean.jsonl"))
    clean[l["custom_id"]] = l["response"]["body"]["choices"][0]["text"];
  ASSERT_EQ(clean.size(), static_cast<size_t>(n));

  // A run killed with SIGKILL once some (not all) results are written.
  const auto out = work / "out.jsonl";
  const std::string model_dir = model();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execl(BLEND_BINARY, "blend", "batch", "--model", model_dir.c_str(), "--input", in.c_str(),
            "--output", out.c_str(), "--threads", "2", "--kv-memory", "0.05", "--deterministic",
            "--quiet", "--max-batch-tokens", "64", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(out) && read_jsonl(out).size() >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the run finished before it could be killed";
  const size_t partial = read_jsonl(out).size();
  EXPECT_GE(partial, 3u);

  ASSERT_EQ(testing::run_command(batch_cmd(in, out.string())).exit_code, 0);
  std::map<std::string, int> seen;
  for (const json& l : read_jsonl(out)) {
    ++seen[l["custom_id"]];
    EXPECT_EQ(l["response"]["body"]["choices"][0]["text"], clean[l["custom_id"]]) << l["custom_id"];
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << id;
}

// --plot draws throughput and KV use over the run (issue 25): a PNG, and its numbers next to
// it, whose throughput integrates to the tokens the run's forward passes computed.
TEST_F(BatchCli, PlotWritesAPngWhoseNumbersAddUpToTheRun) {
  testing::TempDir work;
  std::string input;
  for (int i = 0; i < 24; ++i)
    input += json{{"custom_id", "t" + std::to_string(i)},
                  {"method", "POST"},
                  {"url", "/v1/completions"},
                  {"body",
                   {{"model", "tiny"},
                    {"prompt", "plot " + std::to_string(i)},
                    {"max_tokens", 10 + i},
                    {"ignore_eos", true}}}}
                 .dump() +
             "\n";
  testing::write_file(work / "in.jsonl", input);
  const auto png = work / "run.png";
  const auto r = testing::run_command(
      batch_cmd((work / "in.jsonl").string(), (work / "out.jsonl").string(),
                "--plot " + png.string() + " --stats " + (work / "stats.json").string() + " 2>&1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string image = testing::read_file(png);
  ASSERT_GT(image.size(), 1000u);
  EXPECT_EQ(image.substr(1, 3), "PNG");
  const json stats = json::parse(testing::read_file(work / "stats.json"));
  std::istringstream dat(testing::read_file(work / "run.dat"));
  double width = 0, integral = 0;
  int rows = 0;
  for (std::string line; std::getline(dat, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream row(line);
    double t = 0, rate = 0, kv = 0;
    row >> t >> rate >> kv;
    if (rows++ == 0) width = 2 * t;  // the first bin's centre
    integral += rate * width;
    EXPECT_GE(kv, 0);
    EXPECT_LE(kv, 100);
  }
  EXPECT_GT(rows, 1);
  // The forward passes' tokens: prompts less what the prefix cache served, and every output
  // token but each request's last (sampled, never fed back).
  const double computed = stats["input_tokens"].get<double>() -
                          stats["cached_prompt_tokens"].get<double>() +
                          stats["output_tokens"].get<double>() - stats["completed"].get<double>();
  EXPECT_NEAR(integral, computed, 0.01 * computed);
}

// A KV cache far smaller than the batch needs, under every --policy (the input order and each
// BlendServe plan): every line still completes, with the tokens a roomy run gives (issue 26).
TEST_F(BatchCli, KvExhaustionUnderEveryPolicyCompletesEveryLine) {
  testing::TempDir work;
  const int n = 12;
  std::string input;
  for (int i = 0; i < n; ++i)
    input += json{{"custom_id", "k" + std::to_string(i)},
                  {"method", "POST"},
                  {"url", "/v1/completions"},
                  {"body",
                   {{"model", "tiny"},
                    {"prompt", "shared start, then line " + std::to_string(i % 4)},
                    {"max_tokens", 40},
                    {"temperature", i % 2 ? 0.7 : 0.0},
                    {"seed", i},
                    {"ignore_eos", true}}}}
                 .dump() +
             "\n";
  testing::write_file(work / "in.jsonl", input);
  const std::string in = (work / "in.jsonl").string();
  const auto texts = [&](const std::filesystem::path& path) {
    std::map<std::string, std::string> out;
    for (const json& l : read_jsonl(path)) {
      EXPECT_EQ(l["response"]["status_code"], 200) << l.dump();
      out[l["custom_id"]] = l["response"]["body"]["choices"][0]["text"];
    }
    return out;
  };
  ASSERT_EQ(testing::run_command(batch_cmd(in, (work / "roomy.jsonl").string())).exit_code, 0);
  const auto expected = texts(work / "roomy.jsonl");
  ASSERT_EQ(expected.size(), static_cast<size_t>(n));
  // About 16 pages of 16 tokens of the tiny model: room for 4-5 of the 12 lines at once.
  for (const std::string policy : {"fcfs", "blend", "blend@alg3", "dfs", "random"}) {
    const auto out = work / ("tight-" + policy + ".jsonl");
    const auto r = testing::run_command(
        batch_cmd(in, out.string(), "--policy " + policy + " 2>&1", "0.00007"));
    ASSERT_EQ(r.exit_code, 0) << policy << ": " << r.output;
    EXPECT_EQ(texts(out), expected) << policy;
  }
}

// The disk fills up mid-run (simulated with a file size limit, which fails write(2) after a
// partial write as a full disk does): `blend batch` stops with a message naming the file and the
// reason and a non-zero exit, the output holds whole lines only (the torn one is cut off), and
// a rerun with space again completes exactly the rest, with the clean run's tokens (issue 26).
TEST_F(BatchCli, AFullDiskStopsTheRunWithWholeLinesAndARerunCompletesIt) {
  testing::TempDir work;
  const int n = 20;
  std::string input;
  for (int i = 0; i < n; ++i)
    input += json{{"custom_id", "d" + std::to_string(i)},
                  {"method", "POST"},
                  {"url", "/v1/completions"},
                  {"body",
                   {{"model", "tiny"},
                    {"prompt", "disk " + std::to_string(i)},
                    {"max_tokens", 4},
                    {"temperature", 0},
                    {"ignore_eos", true}}}}
                 .dump() +
             "\n";
  testing::write_file(work / "in.jsonl", input);
  const std::string in = (work / "in.jsonl").string();
  ASSERT_EQ(testing::run_command(batch_cmd(in, (work / "clean.jsonl").string())).exit_code, 0);
  std::map<std::string, std::string> clean;
  for (const json& l : read_jsonl(work / "clean.jsonl"))
    clean[l["custom_id"]] = l["response"]["body"]["choices"][0]["text"];
  ASSERT_EQ(clean.size(), static_cast<size_t>(n));

  // Room for a few result lines (about 500 bytes each), not for twenty.
  const auto out = work / "out.jsonl";
  const auto full =
      testing::run_command("prlimit --fsize=2500 " + batch_cmd(in, out.string()) + " 2>&1");
  EXPECT_NE(full.exit_code, 0) << full.output;
  EXPECT_NE(full.output.find("cannot write " + out.string()), std::string::npos) << full.output;
  EXPECT_NE(full.output.find("File too large"), std::string::npos) << full.output;
  const std::string text = testing::read_file(out);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a torn line was left at the end";
  const size_t partial = read_jsonl(out).size();  // every line parses
  EXPECT_GE(partial, 1u);
  EXPECT_LT(partial, static_cast<size_t>(n));

  ASSERT_EQ(testing::run_command(batch_cmd(in, out.string())).exit_code, 0);
  std::map<std::string, int> seen;
  for (const json& l : read_jsonl(out)) {
    ++seen[l["custom_id"]];
    EXPECT_EQ(l["response"]["body"]["choices"][0]["text"], clean[l["custom_id"]]) << l["custom_id"];
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << id;
}

// Hostile and careless lines each get an error result and the others still run (issue 26):
// a line nested 100,000 deep (it killed the run at depth 70,000), "temperature": 1e999 (it
// aborted the run before any output), a url other than the batch's endpoint (it ran anyway),
// a model other than the served one, and a prompt whose bytes cannot fit the context.
TEST_F(BatchCli, BadLinesFailAloneAndTheOthersRun) {
  testing::TempDir work;
  const auto good = [](const std::string& id) {
    return R"({"custom_id":")" + id +
           R"(","method":"POST","url":"/v1/completions","body":{"model":"tiny","prompt":"Hi","max_tokens":2,"temperature":0}})"
           "\n";
  };
  std::string input = good("ok1");
  input += R"({"custom_id":"deep","method":"POST","url":"/v1/completions","body":{"prompt":)" +
           std::string(100000, '[') + std::string(100000, ']') + "}}\n";
  input +=
      R"({"custom_id":"inf","method":"POST","url":"/v1/completions","body":{"prompt":"x","temperature":1e999}})"
      "\n";
  input +=
      R"({"custom_id":"chat","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi"}]}})"
      "\n";
  input +=
      R"({"custom_id":"other-model","method":"POST","url":"/v1/completions","body":{"model":"big","prompt":"x"}})"
      "\n";
  input += R"({"custom_id":"huge","method":"POST","url":"/v1/completions","body":{"prompt":")" +
           std::string(8u << 20, 'a') + "\"}}\n";
  input += good("ok2");
  testing::write_file(work / "in.jsonl", input);
  const auto r =
      testing::run_command(batch_cmd((work / "in.jsonl").string(), (work / "out.jsonl").string(),
                                     "--endpoint /v1/completions --served-model-name tiny") +
                           " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, json> by_id;
  for (const json& line : read_jsonl(work / "out.jsonl")) by_id[key_of(line)] = line;
  ASSERT_EQ(by_id.size(), 7u);
  EXPECT_EQ(by_id["ok1"]["response"]["status_code"], 200);
  EXPECT_EQ(by_id["ok2"]["response"]["status_code"], 200);
  const auto error = [&](const std::string& id) { return by_id[id]["response"]["body"]["error"]; };
  // The deep line's custom_id cannot be read: it is reported under its line number.
  EXPECT_EQ(by_id["line-2"]["response"]["status_code"], 400);
  EXPECT_NE(error("line-2")["message"].get<std::string>().find("levels deep"), std::string::npos);
  EXPECT_EQ(by_id["line-3"]["response"]["status_code"], 400);
  EXPECT_EQ(error("line-3")["param"], "body.temperature");
  EXPECT_EQ(by_id["chat"]["response"]["status_code"], 400);
  EXPECT_EQ(error("chat")["param"], "url");
  EXPECT_EQ(by_id["other-model"]["response"]["status_code"], 404);
  EXPECT_EQ(error("other-model")["param"], "model");
  EXPECT_EQ(error("other-model")["code"], "model_not_found");
  EXPECT_EQ(by_id["huge"]["response"]["status_code"], 400);
  // Refused on its byte length, before tokenizing (OpenAiTest.APromptTooLongInBytes... times it).
  EXPECT_NE(error("huge")["message"].get<std::string>().find("bytes"), std::string::npos);
  EXPECT_EQ(error("huge")["param"], "prompt");
}

// --dense-batch-sizes (NanoFlow §4.2's discrete batching): while the prompts fill a fast size,
// steps are cut to the largest one under the budget; the tokens are those of a run without it.
TEST_F(BatchCli, DiscreteBatchingCutsStepsAndKeepsTheTokens) {
  testing::TempDir work;
  std::string input;
  for (int i = 0; i < 10; ++i)
    input += greedy_token_line("d" + std::to_string(i), token_run(700 + i * 97, 40 + 9 * i), 6);
  testing::write_file(work / "in.jsonl", input);
  auto run = [&](const std::string& name, const std::string& flags) {
    const auto r = testing::run_command(
        batch_cmd((work / "in.jsonl").string(), (work / (name + ".jsonl")).string(),
                  "--deterministic --max-batch-tokens 200 --step-timings " +
                      (work / (name + "-steps.jsonl")).string() + " " + flags) +
        " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<int64_t> sizes;
    for (const json& s : read_jsonl(work / (name + "-steps.jsonl")))
      sizes.push_back(s["prefill_tokens"].get<int64_t>() + s["decode_tokens"].get<int64_t>());
    return sizes;
  };
  // A `blend profile` file: the multiples of its GEMM row tile are the sizes.
  const std::string profile = R"({"name":"p","compute_tflops":1,"memory_bandwidth_gb_s":20,)"
                              R"("network_bandwidth_gb_s":1,"memory_gb":16,"fit":{)";
  testing::write_file(work / "tile96.json", profile + R"("dense_row_tile":96}})");
  testing::write_file(work / "notile.json", profile + R"("dense_row_tile":1}})");
  const std::vector<int64_t> plain = run("plain", ""),
                             cut = run("cut", "--dense-batch-sizes 64,128"),
                             tiled = run("tiled",
                                         "--dense-batch-sizes " + (work / "tile96.json").string()),
                             untiled = run("untiled", "--dense-batch-sizes " +
                                                          (work / "notile.json").string());
  // 805 prompt tokens: 200-token steps without the sizes, 128-token steps with them, 192 with
  // the profile's tile of 96, 200 with a profile that saw no tile.
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(plain[0], 200);
  EXPECT_EQ(std::count(cut.begin(), cut.begin() + 6, 128), 6);
  EXPECT_EQ(std::count(tiled.begin(), tiled.begin() + 4, 192), 4);
  EXPECT_EQ(untiled, plain);
  EXPECT_GT(cut.size(), plain.size());
  EXPECT_EQ(read_jsonl(work / "cut.jsonl").size(), 10u);
  auto texts = [&](const std::string& name) {
    std::map<std::string, std::string> text;
    for (const json& j : read_jsonl(work / (name + ".jsonl")))
      text[j["custom_id"]] = j["response"]["body"]["choices"][0]["text"];
    return text;
  };
  EXPECT_EQ(texts("cut"), texts("plain"));
  EXPECT_EQ(texts("tiled"), texts("plain"));
  EXPECT_EQ(texts("plain").size(), 10u);
}

// Nonsense engine flags are refused naming the flag, before any model is loaded.
TEST_F(BatchCli, EngineFlagsAreValidated) {
  testing::TempDir work;
  testing::write_file(work / "in.jsonl", "");
  testing::write_file(work / "bad-tile.json",
                      R"({"name":"p","compute_tflops":1,"memory_bandwidth_gb_s":20,)"
                      R"("network_bandwidth_gb_s":1,"memory_gb":16,"fit":{"dense_row_tile":0}})");
  for (const std::string& flag : std::vector<std::string>{
           "--max-batch-tokens 0", "--max-batch-tokens -5", "--max-running 0", "--kv-memory -1",
           "--kv-memory nan", "--kv-memory 1e999", "--threads -1", "--page-size 0",
           "--kv-host-memory -2", "--kv-disk-size 0", "--dense-batch-sizes 512,0",
           "--dense-batch-sizes 1k", "--dense-batch-sizes " + (work / "bad-tile.json").string(),
           "--dense-batch-sizes " + (work / "in.jsonl").string()}) {
    const auto r =
        testing::run_command(std::string("'") + BLEND_BINARY + "' batch --model " + model() +
                             " --input " + (work / "in.jsonl").string() + " --output " +
                             (work / "out.jsonl").string() + " " + flag + " 2>&1");
    EXPECT_NE(r.exit_code, 0) << flag;
    const std::string name = flag.substr(0, flag.find(' '));
    EXPECT_NE(r.output.find(name), std::string::npos) << flag << ": " << r.output;
    EXPECT_EQ(r.output.find("internal"), std::string::npos) << flag << ": " << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(work / "out.jsonl"));
}

// ---- Nothing accepted is lost or duplicated (issue 54) ----

std::string good_line(const std::string& custom_id_json, const std::string& prompt) {
  return R"({"custom_id":)" + custom_id_json +
         R"(,"method":"POST","url":"/v1/completions","body":{"prompt":")" + prompt +
         R"(","max_tokens":3,"temperature":0,"ignore_eos":true}})" + "\n";
}

// One invalid UTF-8 byte ended the whole run (exit 2, "[json.exception.type_error.316]", no
// output, every rerun the same): the parse error quoting it could not be written. Now that line
// alone fails. Its error line has custom_id null and the line number (it was "line-2", which the
// real custom_id "line-2" collided with); U+2028 in a custom_id is written escaped; a rerun
// counts every line as done.
TEST_F(BatchCli, AnInvalidUtf8ByteFailsItsLineAloneAndNothingCollides) {
  testing::TempDir work;
  const std::string input = good_line(R"("a")", "first") +
                            "{\"custom_id\":\"bad\",\"method\":\"POST\",\"url\":\"/v1/"
                            "completions\",\"body\":{\"prompt\":\"caf\xe9\"}}\n" +
                            good_line(R"("line-2")", "second") +
                            good_line(R"("sep\u2028id")", "third");
  testing::write_file(work / "in.jsonl", input);
  const std::string in = (work / "in.jsonl").string(), out = (work / "out.jsonl").string();
  const auto r = testing::run_command(batch_cmd(in, out) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = testing::read_file(out);
  EXPECT_EQ(text.find("\xe2\x80\xa8"), std::string::npos) << "U+2028 written raw";
  std::map<std::string, json> by_id;
  std::vector<json> unreadable;  // custom_id null
  for (const json& line : read_jsonl(out)) {
    if (line["custom_id"].is_null()) {
      unreadable.push_back(line);
      continue;
    }
    EXPECT_EQ(by_id.count(line["custom_id"]), 0u) << line["custom_id"];
    by_id[line["custom_id"]] = line;
  }
  ASSERT_EQ(by_id.size(), 3u) << text;
  EXPECT_EQ(by_id["a"]["response"]["status_code"], 200);
  EXPECT_EQ(by_id["line-2"]["response"]["status_code"], 200);
  EXPECT_EQ(by_id["sep\u2028id"]["response"]["status_code"], 200);
  ASSERT_EQ(unreadable.size(), 1u) << text;
  EXPECT_EQ(unreadable[0]["error"]["line"], 2);
  EXPECT_EQ(unreadable[0]["response"]["status_code"], 400);
  EXPECT_NE(unreadable[0]["response"]["body"]["error"]["message"].get<std::string>().find("UTF-8"),
            std::string::npos)
      << unreadable[0].dump();
  const auto again = testing::run_command(batch_cmd(in, out) + " 2>&1");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(testing::read_file(out), text) << "a rerun ran a line again";
}

// A corrupted line in the middle of an output was kept while its request ran again (201 lines
// for 200 ids, one not JSON). Now it moves to OUTPUT.set-aside and the output holds each
// request's result once, every line parseable.
TEST_F(BatchCli, ACorruptedOutputLineIsSetAsideAndItsRequestRunsAgain) {
  testing::TempDir work;
  std::string input;
  for (int i = 0; i < 4; ++i)
    input += good_line("\"r" + std::to_string(i) + "\"", "line " + std::to_string(i));
  testing::write_file(work / "in.jsonl", input);
  const std::string in = (work / "in.jsonl").string(), out = (work / "out.jsonl").string();
  ASSERT_EQ(testing::run_command(batch_cmd(in, out)).exit_code, 0);
  std::map<std::string, std::string> clean;
  for (const json& l : read_jsonl(out))
    clean[l["custom_id"]] = l["response"]["body"]["choices"][0]["text"];
  ASSERT_EQ(clean.size(), 4u);
  std::string text = testing::read_file(out);
  const size_t second = text.find('\n') + 1;
  const size_t third = text.find('\n', second) + 1;
  const std::string corrupted = text.substr(second, 30) + "#corrupted";
  const std::string lost_id = json::parse(text.substr(second, third - second - 1))["custom_id"];
  text.replace(second, third - second - 1, corrupted);
  testing::write_file(out, text);

  const auto r = testing::run_command(batch_cmd(in, out) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, int> seen;
  for (const json& l : read_jsonl(out)) {  // read_jsonl throws on a line that does not parse
    ++seen[l["custom_id"]];
    EXPECT_EQ(l["response"]["body"]["choices"][0]["text"], clean[l["custom_id"]]);
  }
  EXPECT_EQ(seen.size(), 4u);
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << id;
  EXPECT_EQ(testing::read_file(out + ".set-aside"), corrupted + "\n") << lost_id;
}

// Two `blend batch` on one output both ran every request (400 lines for 200 ids). The output's
// lock (OUTPUT.lock, flock) refuses the second with a clear message, before it writes anything.
TEST_F(BatchCli, ASecondRunOnTheSameOutputIsRefused) {
  testing::TempDir work;
  testing::write_file(work / "in.jsonl", good_line(R"("x")", "locked"));
  const std::string in = (work / "in.jsonl").string(), out = (work / "out.jsonl").string();
  {
    // Another process's lock, as a running `blend batch` holds it.
    const int fd = ::open((out + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    const auto r = testing::run_command(batch_cmd(in, out) + " 2>&1");
    ::close(fd);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("blend: error: another blend process is using the output file " + out),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(out + ".lock"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << "the refused run touched the output";
  }
  ASSERT_EQ(testing::run_command(batch_cmd(in, out)).exit_code, 0);
  EXPECT_EQ(read_jsonl(out).size(), 1u);
  // A completed run leaves no lock file behind (issue 54), and the next run locks afresh.
  EXPECT_FALSE(std::filesystem::exists(out + ".lock"));
  ASSERT_EQ(testing::run_command(batch_cmd(in, out)).exit_code, 0);
  EXPECT_EQ(read_jsonl(out).size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(out + ".lock"));
}

}  // namespace
}  // namespace blend
