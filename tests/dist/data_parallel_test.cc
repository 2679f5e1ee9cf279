// `mpirun -np N blend batch` (dist/, BlendServe §5.5) with real Open MPI ranks on this machine:
// the union of the ranks' results equals a single-process run (greedy tokens identical per
// custom_id, every custom_id exactly once, bad lines answered once), the partition's sharing
// loss is reported, and a rank killed mid-run loses only its unfinished requests, which a rerun
// with the same output and another rank count completes.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "model/random_init.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

// Whether mpirun is on PATH (CI installs Open MPI through scripts/setup.sh).
bool have_mpirun() {
  return testing::run_command("command -v mpirun >/dev/null 2>&1").exit_code == 0;
}

class DataParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    RandomInitOptions o;
    o.seed = 3;
    o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
    write_random_model(*find_model_preset("tiny"), *dir_ / "tiny", o);
    // Four prompt families sharing long prefixes (the prefix tree has something to cut), with
    // known and unknown output lengths, one chat line, and two bad lines.
    std::string input;
    for (int g = 0; g < 4; ++g)
      for (int i = 0; i < 7; ++i) {
        std::string prompt;
        for (int k = 0; k < 24 + 8 * g; ++k) prompt += std::to_string(400 + g * 60 + k) + ",";
        for (int k = 0; k < 1 + i % 4; ++k) prompt += std::to_string(9000 + i * 17 + k) + ",";
        prompt.pop_back();
        const bool known = (g + i) % 2 == 0;
        input += R"({"custom_id":"g)" + std::to_string(g) + "-" + std::to_string(i) +
                 R"(","method":"POST","url":"/v1/completions","body":{"prompt":[)" + prompt +
                 R"(],"max_tokens":)" + std::to_string(2 + (g * 7 + i) % 9) +
                 (known ? R"(,"ignore_eos":true)" : "") + R"(,"temperature":0}})" + "\n";
      }
    input +=
        R"({"custom_id":"chat","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi!"}],"max_tokens":4,"temperature":0}})"
        "\n";
    input += R"({"custom_id":"badurl","method":"POST","url":"/v1/embeddings","body":{"input":"x"}})"
             "\n";
    input += "not json\n";
    testing::write_file(*dir_ / "in.jsonl", input);
    num_lines_ = 4 * 7 + 3;
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun not found (install openmpi-bin: scripts/setup.sh)";
  }

  static std::string input() { return (*dir_ / "in.jsonl").string(); }

  static std::string batch_args(const std::string& output, const std::string& stats) {
    return std::string("'") + BLEND_BINARY + "' batch --model " + (*dir_ / "tiny").string() +
           " --input " + input() + " --output " + output + " --stats " + stats +
           " --threads 1 --kv-memory 0.05 --deterministic --quiet --policy blend";
  }

  // mpirun as CI runs it: as root in a container, more ranks than cores, one host.
  // `loopback` forces MPI's TCP transport over lo; otherwise Open MPI picks shared memory.
  // `recovery`: the other ranks go on when one dies (mpirun then always exits 0: Open MPI 4.1).
  static std::string mpirun(int ranks, bool loopback, const std::string& extra,
                            bool recovery = false) {
    // Under AddressSanitizer (scripts/test.sh --sanitize) the ranks run without leak checking:
    // Open MPI keeps allocations past MPI_Finalize in components it unloads, which
    // LeakSanitizer reports as "<unknown module>" (it cannot even be suppressed by name).
    std::string cmd =
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
        "ASAN_OPTIONS=\"${ASAN_OPTIONS:-}:detect_leaks=0\" "
        "mpirun --oversubscribe --bind-to none -np " +
        std::to_string(ranks) + " ";
    if (recovery) cmd += "--enable-recovery ";
    if (loopback)
      cmd += "--mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo ";
    else  // shared memory without CMA, which containers often forbid (ptrace)
      cmd += "--mca btl_vader_single_copy_mechanism none ";
    return cmd + extra;
  }

  // Whole lines only.
  static std::vector<json> read_jsonl(const std::filesystem::path& path) {
    std::vector<json> out;
    std::istringstream in(testing::read_file(path));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) out.push_back(json::parse(line));
    return out;
  }

  // custom_id -> (status, generated text); fails the test on a custom_id seen twice.
  static std::map<std::string, std::pair<int, std::string>> results(
      const std::filesystem::path& path) {
    std::map<std::string, std::pair<int, std::string>> out;
    for (const json& line : read_jsonl(path)) {
      // An input line whose custom_id cannot be read is answered by its line number.
      const std::string id = line["custom_id"].is_string()
                                 ? line["custom_id"].get<std::string>()
                                 : "line-" + std::to_string(line["error"]["line"].get<int>());
      const json& response = line["response"];
      std::string text;
      if (response["status_code"] == 200) {
        const json& choice = response["body"]["choices"][0];
        text = choice.contains("text") ? choice["text"].get<std::string>()
                                       : choice["message"]["content"].get<std::string>();
        text += "|" + std::to_string(response["body"]["usage"]["completion_tokens"].get<int>());
      }
      EXPECT_TRUE(out.emplace(id, std::make_pair(response["status_code"].get<int>(), text)).second)
          << id << " answered twice in " << path;
    }
    return out;
  }

  // The single-process run everything is compared with (made once).
  static const std::map<std::string, std::pair<int, std::string>>& reference() {
    static const auto ref = [] {
      const auto out = *dir_ / "single.jsonl";
      const auto r = testing::run_command(
          batch_args(out.string(), (*dir_ / "single-stats.json").string()) + " 2>&1");
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return results(out);
    }();
    return ref;
  }

  static testing::TempDir* dir_;
  static size_t num_lines_;
};

testing::TempDir* DataParallel::dir_ = nullptr;
size_t DataParallel::num_lines_ = 0;

// 2 ranks over loopback TCP and 3 over shared memory: the same results as one process.
TEST_F(DataParallel, UnionOfRanksEqualsSingleProcessRun) {
  const auto& ref = reference();
  ASSERT_EQ(ref.size(), num_lines_);
  for (const auto& [ranks, loopback] : {std::pair{2, true}, std::pair{3, false}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    testing::TempDir work;
    const auto out = work / "out.jsonl";
    const auto stats_path = work / "stats.json";
    const auto r = testing::run_command(
        mpirun(ranks, loopback, batch_args(out.string(), stats_path.string())) + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(results(out), ref);  // every custom_id once, the same tokens
    const json stats = json::parse(testing::read_file(stats_path));
    EXPECT_EQ(stats["data_parallel"], ranks);
    EXPECT_EQ(stats["requests"], num_lines_);
    EXPECT_EQ(stats["completed"], num_lines_ - 2);
    EXPECT_EQ(stats["failed"], 2);
    EXPECT_EQ(stats["lost"], 0);
    ASSERT_EQ(stats["ranks"].size(), static_cast<size_t>(ranks));
    int64_t per_rank = 0;
    for (const json& rank : stats["ranks"]) {
      ASSERT_FALSE(rank.is_null());
      EXPECT_GT(rank["completed"].get<int64_t>(), 0) << "every rank gets work";
      per_rank += rank["completed"].get<int64_t>();
    }
    EXPECT_EQ(per_rank, static_cast<int64_t>(num_lines_ - 2));
    // The partition's sharing loss: only cut paths are computed twice (§5.5). With 29 short
    // requests each cut is a sizable share; the 1%-of-s_o figure is the simulator's, on
    // Table 2's traces (docs/BENCHMARKS.md), and the plan tests check it at scale.
    const json& part = stats["partition"];
    const double s_o = part["sharing_optimal"], kept = part["partition_sharing"];
    EXPECT_GT(s_o, 0.5);
    EXPECT_LE(kept, s_o + 1e-12);
    EXPECT_NEAR(part["sharing_loss"].get<double>(), s_o - kept, 1e-12);
    EXPECT_LT(part["sharing_loss_of_optimal"].get<double>(), 0.2);
    EXPECT_LT(part["work_imbalance"].get<double>(), 1.5);
  }
}

// `--dp-recut 2`: rank 0 simulates each cut's parts on the planner's hardware and cuts twice
// more by the simulated rates; the kept cut still gives every line once, with the same tokens.
TEST_F(DataParallel, ReCutPartitionsStillAnswerEveryLineAsOneProcessDoes) {
  const auto& ref = reference();
  testing::TempDir work;
  const auto out = work / "out.jsonl";
  const auto stats_path = work / "stats.json";
  const auto r = testing::run_command(
      mpirun(2, true, batch_args(out.string(), stats_path.string()) + " --dp-recut 2") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(results(out), ref);
  const json stats = json::parse(testing::read_file(stats_path));
  const json& recut = stats["partition"]["recut"];
  ASSERT_EQ(recut["simulated_cut_seconds"].size(), 3u) << stats.dump();
  const auto kept = recut["kept_cut"].get<size_t>();
  ASSERT_LT(kept, 3u);
  const double kept_seconds = recut["simulated_cut_seconds"][kept];
  for (const json& s : recut["simulated_cut_seconds"]) {
    EXPECT_GT(s.get<double>(), 0);
    EXPECT_GE(s.get<double>(), kept_seconds);
  }
  ASSERT_EQ(recut["simulated_rank_seconds"].size(), 2u);
  EXPECT_DOUBLE_EQ(std::max(recut["simulated_rank_seconds"][0].get<double>(),
                            recut["simulated_rank_seconds"][1].get<double>()),
                   kept_seconds);
  // Without mpirun there is nothing to re-cut.
  const auto alone = testing::run_command(
      batch_args((work / "x.jsonl").string(), (work / "x.json").string()) + " --dp-recut 1 2>&1");
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(alone.output.find("mpirun"), std::string::npos) << alone.output;
}

// Rank 1 is killed (SIGKILL) after its second result, under --enable-recovery: the job names
// the custom_ids lost with it (stderr and --stats); the other ranks' results are all written; a
// rerun with the same output on a different number of ranks runs exactly the lost ones.
TEST_F(DataParallel, KilledRankLosesOnlyItsRequestsAndRerunCompletesThem) {
  const auto& ref = reference();
  testing::TempDir work;
  const auto out = work / "out.jsonl";
  const auto stats1 = work / "stats1.json";
  const auto r = testing::run_command(
      mpirun(3, false, "-x BLEND_DIST_TEST_KILL=1:2 " + batch_args(out.string(), stats1.string()),
             /*recovery=*/true) +
      " 2>&1");
  EXPECT_NE(r.output.find("requests were lost"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 stopped"), std::string::npos) << r.output;
  const json first = json::parse(testing::read_file(stats1));
  const auto written = results(out);
  std::set<std::string> lost;
  for (const json& id : first["lost_custom_ids"]) lost.insert(id.get<std::string>());
  ASSERT_FALSE(lost.empty()) << r.output;
  EXPECT_EQ(first["lost"], lost.size());
  EXPECT_EQ(first["failed_ranks"].size(), 1u);
  EXPECT_EQ(first["failed_ranks"][0]["rank"], 1);
  for (const std::string& id : lost) EXPECT_NE(r.output.find(id), std::string::npos) << id;
  // Written and lost: disjoint, together every line, and what was written is right.
  for (const auto& [id, result] : written) {
    EXPECT_FALSE(lost.count(id)) << id;
    EXPECT_EQ(result, ref.at(id)) << id;
  }
  EXPECT_EQ(written.size() + lost.size(), num_lines_);

  const auto stats2 = work / "stats2.json";
  const auto again =
      testing::run_command(mpirun(2, true, batch_args(out.string(), stats2.string())) + " 2>&1");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const json second = json::parse(testing::read_file(stats2));
  EXPECT_EQ(second["requests"], lost.size());
  EXPECT_EQ(second["skipped_already_done"], written.size());
  EXPECT_EQ(results(out), ref);
}

// Without --enable-recovery mpirun stops the whole job when a rank dies: the job fails, what
// was written stays, and a rerun completes exactly the rest.
TEST_F(DataParallel, KilledRankWithoutRecoveryFailsTheJobAndRerunCompletesIt) {
  const auto& ref = reference();
  testing::TempDir work;
  const auto out = work / "out.jsonl";
  const auto r =
      testing::run_command(mpirun(3, false,
                                  "-x BLEND_DIST_TEST_KILL=2:1 " +
                                      batch_args(out.string(), (work / "stats1.json").string())) +
                           " 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  const auto written = results(out);
  EXPECT_LT(written.size(), num_lines_);
  for (const auto& [id, result] : written) EXPECT_EQ(result, ref.at(id)) << id;
  const auto again = testing::run_command(
      mpirun(2, false, batch_args(out.string(), (work / "stats2.json").string())) + " 2>&1");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const json second = json::parse(testing::read_file(work / "stats2.json"));
  EXPECT_EQ(second["requests"], num_lines_ - written.size());
  EXPECT_EQ(results(out), ref);
}

// Bad input under mpirun fails clearly on rank 0 and stops the other ranks.
TEST_F(DataParallel, MissingInputFailsEveryRank) {
  testing::TempDir work;
  const std::string cmd = std::string("'") + BLEND_BINARY + "' batch --model " +
                          (*dir_ / "tiny").string() + " --input " +
                          (work / "missing.jsonl").string() + " --output " +
                          (work / "out.jsonl").string() + " --threads 1 --kv-memory 0.05 --quiet";
  const auto r = testing::run_command(mpirun(2, true, cmd) + " 2>&1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("cannot read"), std::string::npos) << r.output;
}

// Rank 0 (the writer) killed under --enable-recovery: mpirun ended 0 (as Open MPI 4.1 does
// whatever the ranks return) with lines lost, no --stats and no word of what. Now rank 1 lists
// every custom_id the output lacks and writes them to --stats, each worker lists its own, and a
// rerun completes exactly those.
TEST_F(DataParallel, KilledRankZeroIsReportedWithTheLostIdsAndRerunCompletesThem) {
  const auto& ref = reference();
  testing::TempDir work;
  const auto out = work / "out.jsonl";
  const auto stats1 = work / "stats1.json";
  const auto r = testing::run_command(
      mpirun(3, false, "-x BLEND_DIST_TEST_KILL=0:3 " + batch_args(out.string(), stats1.string()),
             /*recovery=*/true) +
      " 2>&1");
  EXPECT_NE(r.output.find("rank 1: rank 0, which writes the output, stopped"), std::string::npos)
      << r.output;
  ASSERT_TRUE(std::filesystem::exists(stats1)) << r.output;
  const json first = json::parse(testing::read_file(stats1));
  std::set<std::string> lost;
  for (const json& id : first["lost_custom_ids"]) lost.insert(id.get<std::string>());
  ASSERT_FALSE(lost.empty()) << r.output;
  EXPECT_EQ(first["lost"], lost.size());
  EXPECT_EQ(first["failed_ranks"][0]["rank"], 0);
  for (const std::string& id : lost) EXPECT_NE(r.output.find(" " + id), std::string::npos) << id;
  const auto written = results(out);
  for (const auto& [id, result] : written) {
    EXPECT_FALSE(lost.count(id)) << id;
    EXPECT_EQ(result, ref.at(id)) << id;
  }
  EXPECT_EQ(written.size() + lost.size(), num_lines_);

  const auto stats2 = work / "stats2.json";
  const auto again =
      testing::run_command(mpirun(2, true, batch_args(out.string(), stats2.string())) + " 2>&1");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(json::parse(testing::read_file(stats2))["requests"], lost.size());
  EXPECT_EQ(results(out), ref);
}

// Only rank 0 writes the output, so only it takes the output's lock (OUTPUT.lock): a job whose
// output another process holds is refused on rank 0, with the file named, before any rank runs
// a line; the same job runs once the lock is free (the other ranks never lock it).
TEST_F(DataParallel, AnOutputInUseIsRefusedAndOnlyRankZeroLocksIt) {
  testing::TempDir work;
  const auto out = work / "out.jsonl";
  const auto stats = work / "stats.json";
  {
    const int fd = ::open((out.string() + ".lock").c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    const auto r =
        testing::run_command(mpirun(2, true, batch_args(out.string(), stats.string())) + " 2>&1");
    ::close(fd);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("another blend process is using the output file " + out.string()),
              std::string::npos)
        << r.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << r.output;
  }
  const auto r =
      testing::run_command(mpirun(2, true, batch_args(out.string(), stats.string())) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(results(out).size(), num_lines_);
}

}  // namespace
}  // namespace blend
