// The MPI side of dist/data_parallel.h (built when CMake finds MPI).
#include "dist/data_parallel.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "core/error.h"
#include "dist/liveness.h"
#include "offline/planned_run.h"
#include "plan/dp_partition.h"
#include "plan/planner.h"

namespace blend::dist {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

enum Tag : int {
  kWork = 1,     // rank 0 -> rank k: {"lines": [...]} or {"error": why rank 0 stopped}
  kResult = 2,   // rank k -> rank 0: {"custom_id", "status", "body"}
  kDone = 3,     // rank k -> rank 0: {"stats": {...}} or {"error": why rank k failed}
  kRelease = 4,  // rank 0 -> rank k, once every rank is done or dead: {"finalize": no rank died}
};

// How long rank 0 keeps reading a rank's messages after its connection closed: results it
// sent just before dying may still be in transit.
constexpr milliseconds kDrainAfterDeath{500};
// How long rank 0 waits for every rank to connect at start.
constexpr milliseconds kConnectTimeout{120000};

// MPI_Init_thread .. MPI_Finalize. Rank 0 makes MPI calls from two threads, never at once
// (setup on the main thread, then only the receiver thread until it is joined).
class MpiSession {
 public:
  MpiSession() {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init_thread failed");
    if (provided < MPI_THREAD_SERIALIZED) {
      MPI_Finalize();
      throw Error("this MPI library does not support MPI_THREAD_SERIALIZED");
    }
    // Errors come back as codes (a dead peer must not abort the survivors).
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  // MPI_Finalize waits for every rank, a dead one too (Open MPI 4.1): after a rank died the
  // survivors end without it.
  ~MpiSession() {
    if (!skip_finalize_) MPI_Finalize();
  }
  void skip_finalize() { skip_finalize_ = true; }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  int rank_ = 0, size_ = 1;
  bool skip_finalize_ = false;
};

// Rank 0, which writes the output, is gone: what a worker then reports (report_rank0_gone).
class RankZeroGone : public Error {
 public:
  RankZeroGone() : Error("rank 0 is gone; stopping") {}
};

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS)
    throw Error(std::string(what) + " failed (MPI error " + std::to_string(rc) + ")");
}

// A blocking MPI call would spin a core; these poll every millisecond instead (the engine on
// the same host needs the cores), and give up when `peer` says the other side is gone.
void wait_for(MPI_Request& request, LivenessClient* peer) {
  for (;;) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    if (peer && peer->peer_gone()) throw RankZeroGone();
    std::this_thread::sleep_for(milliseconds(1));
  }
}

void send_json(const json& message, int dest, Tag tag, LivenessClient* peer) {
  const std::string text = jsonl_dump(message);  // an error message may quote invalid UTF-8
  MPI_Request request;
  check(MPI_Isend(text.data(), static_cast<int>(text.size()), MPI_CHAR, dest, tag, MPI_COMM_WORLD,
                  &request),
        "MPI_Isend");
  wait_for(request, peer);
}

// The next message from `source` with `tag` (MPI_ANY_* allowed), or nullopt when none is
// waiting and `wait` is false. `from` gets the sender.
std::optional<json> receive_json(int source, int tag, bool wait, LivenessClient* peer,
                                 int* from = nullptr, int* tag_out = nullptr) {
  MPI_Status status;
  std::optional<std::chrono::steady_clock::time_point> gone_at;
  for (;;) {
    int flag = 0;
    check(MPI_Iprobe(source, tag, MPI_COMM_WORLD, &flag, &status), "MPI_Iprobe");
    if (flag) break;
    if (!wait) return std::nullopt;
    // What rank 0 sent just before it ended may still be in transit: read on for a while.
    if (peer && !gone_at && peer->peer_gone()) gone_at = std::chrono::steady_clock::now();
    if (gone_at && std::chrono::steady_clock::now() - *gone_at > kDrainAfterDeath)
      throw RankZeroGone();
    std::this_thread::sleep_for(milliseconds(1));
  }
  int count = 0;
  check(MPI_Get_count(&status, MPI_CHAR, &count), "MPI_Get_count");
  std::string text(static_cast<size_t>(count), '\0');
  // Not a blocking MPI_Recv: a probed message may be one whose sender died before its body
  // came (a large message waits for the sender's data), and the receive would never end.
  MPI_Request request;
  check(MPI_Irecv(text.data(), count, MPI_CHAR, status.MPI_SOURCE, status.MPI_TAG, MPI_COMM_WORLD,
                  &request),
        "MPI_Irecv");
  wait_for(request, peer);
  if (from) *from = status.MPI_SOURCE;
  if (tag_out) *tag_out = status.MPI_TAG;
  return json::parse(text);
}

json line_json(const BatchInputLine& line) {
  return {{"line", line.line_number},
          {"custom_id", line.custom_id},
          {"url", line.url},
          {"body", line.body}};
}

BatchInputLine line_from_json(const json& j) {
  BatchInputLine line;
  line.line_number = j.at("line").get<int64_t>();
  line.custom_id = j.at("custom_id").get<std::string>();
  line.url = j.at("url").get<std::string>();
  line.body = j.at("body");
  return line;
}

// BLEND_DIST_TEST_KILL=RANK:N (tests only): this rank's SIGKILL after its N-th result (sent, or
// for rank 0 written).
std::optional<int64_t> test_kill_after(int rank) {
  const char* spec = std::getenv("BLEND_DIST_TEST_KILL");
  if (!spec) return std::nullopt;
  int r = -1;
  long long n = -1;
  if (std::sscanf(spec, "%d:%lld", &r, &n) != 2 || r != rank) return std::nullopt;
  return n;
}

// Rank k > 0's job: get the partition (into `work`), run it, stream the results, report.
void run_worker_partition(const BatchRun& run, MpiSession& mpi, LivenessClient& rank0, json& work) {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<BatchJob> job;
  std::string load_error;
  try {
    engine = std::make_unique<Engine>(run.model, run.engine);
    BatchJobOptions options = run.job;
    job = std::make_unique<BatchJob>(*engine, options);
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  work = *receive_json(0, kWork, true, &rank0);
  if (work.contains("error")) return;  // rank 0 stopped before the run; it says why
  json done;
  if (!load_error.empty()) {
    done = {{"error", load_error}};
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    const std::optional<int64_t> kill_after = test_kill_after(mpi.rank());
    int64_t sent = 0;
    auto send_result = [&](const std::string& id, int status, const json& body) {
      send_json({{"custom_id", id}, {"status", status}, {"body", body}}, 0, kResult, &rank0);
      if (kill_after && ++sent >= *kill_after) ::raise(SIGKILL);
    };
    const BatchResultSink sink{
        [&](const std::string& id, const json& body) { send_result(id, 200, body); },
        [&](const std::string& id, int status, const json& body) {
          send_result(id, status, body);
        }};
    try {
      std::vector<BatchInputLine> lines;
      for (const json& j : work.at("lines")) lines.push_back(line_from_json(j));
      job->run(job->prepare(lines, sink), sink);
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      done = {{"stats", batch_run_stats(*engine, job->stats(), wall)}};
    } catch (const RankZeroGone&) {
      throw;
    } catch (const std::exception& e) {
      done = {{"error", e.what()}};
    }
  }
  if (done.contains("error"))
    std::fprintf(stderr, "blend batch: rank %d: %s\n", mpi.rank(),
                 done["error"].get<std::string>().c_str());
  send_json(done, 0, kDone, &rank0);
  const json release = *receive_json(0, kRelease, true, &rank0);
  if (!release.value("finalize", false)) mpi.skip_finalize();
}

// The custom_ids of `ids` (a JSON array) that the output file does not hold (all of them when it
// cannot be read from this host).
std::vector<std::string> missing_from_output(const json& ids, const std::filesystem::path& output) {
  std::unordered_set<std::string> written;
  std::ifstream in(output, std::ios::binary);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("custom_id") && j["custom_id"].is_string())
      written.insert(j["custom_id"].get<std::string>());
  }
  std::vector<std::string> missing;
  for (const json& id : ids)
    if (!written.count(id.get<std::string>())) missing.push_back(id.get<std::string>());
  return missing;
}

// A worker after rank 0 died. With --enable-recovery mpirun ends 0 whatever the ranks return
// (Open MPI 4.1), and rank 0 can no longer say what is lost: this rank lists the custom_ids of
// its partition that the output lacks, and rank 1, which knows every id of the job, lists all of
// them and writes them to --stats (where this host can write it). Then it exits 1.
[[noreturn]] void report_rank0_gone(const BatchRun& run, int rank, const json& work) {
  std::string text =
      "blend batch: rank " + std::to_string(rank) +
      ": rank 0, which writes the output, stopped (killed, crashed, or its host lost)";
  const char* part = work.contains("job_ids") ? "job_ids" : "ids";
  if (!work.contains(part)) {
    text += " before it handed out the work; nothing ran here";
  } else {
    const std::vector<std::string> lost = missing_from_output(work[part], run.output);
    text += "; " + std::to_string(lost.size()) + " of the " + std::to_string(work[part].size()) +
            " requests of " + (part == std::string("ids") ? "this rank" : "the job") +
            " are not in " + run.output.string() + ":";
    for (const std::string& id : lost) text += " " + id;
    if (part == std::string("job_ids") && !run.stats.empty()) {
      const json stats = {{"lost", lost.size()},
                          {"lost_custom_ids", lost},
                          {"failed_ranks", json::array({{{"rank", 0},
                                                         {"error",
                                                          "the process ended before it "
                                                          "finished"},
                                                         {"lost", lost.size()}}})},
                          {"written_by_rank", rank}};
      std::ofstream(run.stats) << stats.dump(2) << "\n";
    }
  }
  text += "\nblend batch: rerun the same command with the same --output to run what it lacks\n";
  if (::write(STDERR_FILENO, text.data(), text.size()) < 0) {
    // the job fails either way
  }
  std::_Exit(1);  // not MPI_Finalize: it would wait for rank 0
}

// Rank k > 0: connect, get the partition, run it, stream the results, report.
void run_worker(const BatchRun& run, MpiSession& mpi, const std::string& address) {
  LivenessClient rank0(address, mpi.rank());
  json work;
  try {
    run_worker_partition(run, mpi, rank0, work);
  } catch (const RankZeroGone&) {
    report_rank0_gone(run, mpi.rank(), work);
  }
}

// Rank 0's view of one worker rank.
struct Worker {
  std::vector<std::string> assigned;  // custom_ids of its partition
  std::string work;                   // its kWork message while the send is in flight
  MPI_Request work_request = MPI_REQUEST_NULL;
  bool done = false;
  std::optional<std::chrono::steady_clock::time_point> gone_at;  // its connection closed
  bool dead = false;     // gone without reporting done, or reported an error
  bool crashed = false;  // the process is gone (it did not report done)
  std::string error;
  json stats;
};

// Set by SIGTERM / SIGINT on rank 0. Without --enable-recovery mpirun stops every rank when
// one dies (SIGTERM, then SIGKILL): rank 0 then has a moment to say what is not done.
volatile sig_atomic_t stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  stop_signal = sig;
}

// Rank 0 was told to stop: report what the output does not hold yet, and end now.
[[noreturn]] void report_stopped(const std::vector<std::string>& all_ids, BatchResultWriter& writer,
                                 std::mutex& writer_mutex) {
  std::vector<std::string> missing;
  {
    const std::lock_guard<std::mutex> lock(writer_mutex);
    for (const std::string& id : all_ids)
      if (!writer.done_ids().count(id)) missing.push_back(id);
  }
  std::string text = "blend batch: stopped by signal " + std::to_string(stop_signal) +
                     " (mpirun stops every rank when one dies, unless run with "
                     "--enable-recovery); " +
                     std::to_string(missing.size()) + " requests are not done:";
  for (const std::string& id : missing) text += " " + id;
  text += "\nblend batch: rerun the same command with the same --output to run exactly those\n";
  if (::write(STDERR_FILENO, text.data(), text.size()) < 0) {
    // nothing more to do: the process ends either way
  }
  std::_Exit(1);
}

// Rank 0, its receiver thread: results into the writer, until every worker is done or dead.
void receive_results(std::vector<Worker>& workers, LivenessServer& live, BatchResultWriter& writer,
                     std::mutex& writer_mutex, const std::vector<std::string>& all_ids) {
  auto pending = [&] {
    for (size_t k = 1; k < workers.size(); ++k)
      if (!workers[k].done && !workers[k].dead) return true;
    return false;
  };
  const auto stopped = [&] {
    if (stop_signal) report_stopped(all_ids, writer, writer_mutex);
  };
  while (pending()) {
    stopped();
    for (int k : live.poll_gone(milliseconds(1)))
      workers[static_cast<size_t>(k)].gone_at = std::chrono::steady_clock::now();
    int from = -1, tag = -1;
    while (std::optional<json> m =
               receive_json(MPI_ANY_SOURCE, MPI_ANY_TAG, false, nullptr, &from, &tag)) {
      Worker& w = workers[static_cast<size_t>(from)];
      if (tag == kResult) {
        const std::string id = m->at("custom_id").get<std::string>();
        const int status = m->at("status").get<int>();
        const std::lock_guard<std::mutex> lock(writer_mutex);
        if (writer.done_ids().count(id)) continue;  // never twice
        if (status == 200)
          writer.write_success(id, m->at("body"));
        else
          writer.write_error(id, status, m->at("body"));
      } else if (tag == kDone) {
        w.done = true;
        if (m->contains("error")) {
          w.dead = true;
          w.error = m->at("error").get<std::string>();
        } else {
          w.stats = m->at("stats");
        }
      }
    }
    const auto now = std::chrono::steady_clock::now();
    for (Worker& w : workers) {
      if (w.work_request != MPI_REQUEST_NULL) {
        int sent = 0;
        check(MPI_Test(&w.work_request, &sent, MPI_STATUS_IGNORE), "MPI_Test");
      }
      if (!w.done && w.gone_at && now - *w.gone_at > kDrainAfterDeath) {
        w.dead = w.crashed = true;
        w.error = "the process ended before it finished (killed, crashed, or its host lost)";
      }
    }
  }
  stopped();
  // A dead rank's partition may never have been taken: let MPI drop the send.
  for (Worker& w : workers)
    if (w.work_request != MPI_REQUEST_NULL) MPI_Request_free(&w.work_request);
  // The ranks still there may exit now; they finalize MPI together unless a rank died.
  bool crash = false;
  for (const Worker& w : workers) crash = crash || w.crashed;
  for (size_t k = 1; k < workers.size(); ++k)
    if (workers[k].done) send_json({{"finalize", !crash}}, static_cast<int>(k), kRelease, nullptr);
}

// The job's statistics (each rank's and the totals) to --stats and stderr; returns the custom_ids
// lost with a failed rank, each also listed on stderr.
std::vector<std::string> report_job(const BatchRun& run, int size, const Engine& engine,
                                    const BatchJob& job, const std::vector<Worker>& workers,
                                    const BatchResultWriter& writer,
                                    const plan::DpPartition& partition, const json& recut,
                                    size_t requests, int64_t skipped, double wall,
                                    double load_seconds) {
  json ranks = json::array();
  ranks.push_back(batch_run_stats(engine, job.stats(), wall));
  ranks[0]["requests"] = partition.parts[0].size();
  int64_t completed = job.stats().completed, failed = job.stats().failed;
  int64_t input_tokens = ranks[0]["input_tokens"], output_tokens = ranks[0]["output_tokens"];
  double cached = ranks[0]["cached_prompt_tokens"];
  std::vector<std::string> lost;
  json failed_ranks = json::array();
  for (int k = 1; k < size; ++k) {
    const Worker& w = workers[static_cast<size_t>(k)];
    ranks.push_back(w.stats.is_null() ? json(nullptr) : w.stats);
    if (!w.stats.is_null()) {
      completed += w.stats["completed"].get<int64_t>();
      failed += w.stats["failed"].get<int64_t>();
      input_tokens += w.stats["input_tokens"].get<int64_t>();
      output_tokens += w.stats["output_tokens"].get<int64_t>();
      cached += w.stats["cached_prompt_tokens"].get<double>();
    }
    if (!w.dead) continue;
    std::vector<std::string> rank_lost;
    for (const std::string& id : w.assigned)
      if (!writer.done_ids().count(id)) rank_lost.push_back(id);
    failed_ranks.push_back({{"rank", k}, {"error", w.error}, {"lost", rank_lost.size()}});
    std::fprintf(stderr, "blend batch: rank %d stopped: %s; %zu of its %zu requests are lost:", k,
                 w.error.c_str(), rank_lost.size(), w.assigned.size());
    for (const std::string& id : rank_lost) std::fprintf(stderr, " %s", id.c_str());
    std::fprintf(stderr, "\n");
    lost.insert(lost.end(), rank_lost.begin(), rank_lost.end());
  }
  const double tokens = static_cast<double>(input_tokens + output_tokens);
  json stats = {
      {"data_parallel", size},
      {"requests", static_cast<int64_t>(requests)},
      {"completed", completed},
      {"failed", failed},
      {"skipped_already_done", skipped},
      {"lost", lost.size()},
      {"lost_custom_ids", lost},
      {"failed_ranks", failed_ranks},
      {"input_tokens", input_tokens},
      {"output_tokens", output_tokens},
      {"wall_seconds", wall},
      {"load_seconds", load_seconds},
      {"throughput_tokens_per_s", wall > 0 ? tokens / wall : 0.0},
      {"sharing_ratio", input_tokens > 0 ? cached / static_cast<double>(input_tokens) : 0.0},
      {"policy", run.job.policy},
      {"deterministic", run.engine.deterministic},
      {"threads", run.engine.threads},
      {"partition",
       {{"sharing_optimal", partition.sharing_optimal},
        {"partition_sharing", partition.sharing_partitioned},
        {"sharing_loss", partition.sharing_loss()},
        {"sharing_loss_of_optimal", partition.sharing_loss_of_optimal()},
        {"work_imbalance", partition.imbalance()},
        {"root_density", partition.root_density}}},
      {"ranks", ranks}};
  json part_sizes = json::array();
  for (const auto& p : partition.parts) part_sizes.push_back(p.size());
  stats["partition"]["requests_per_rank"] = part_sizes;
  if (!recut.is_null()) stats["partition"]["recut"] = recut;
  if (!run.stats.empty()) {
    std::ofstream out(run.stats);
    out << stats.dump(2) << "\n";
    if (!out) throw Error("cannot write " + run.stats.string());
  }
  if (!run.quiet)
    std::fprintf(stderr,
                 "blend batch: %d ranks, %lld requests (%lld failed, %lld lost, %lld already "
                 "done), %lld in + %lld out tokens in %.2f s = %.1f tokens/s; the partition "
                 "keeps %.4f of %.4f prompt sharing (loss %.2f%% of s_o)\n",
                 size, static_cast<long long>(requests), static_cast<long long>(failed),
                 static_cast<long long>(lost.size()), static_cast<long long>(skipped),
                 static_cast<long long>(input_tokens), static_cast<long long>(output_tokens), wall,
                 wall > 0 ? tokens / wall : 0.0, partition.sharing_partitioned,
                 partition.sharing_optimal, 100 * partition.sharing_loss_of_optimal());
  return lost;
}

void run_rank0(const BatchRun& run, MpiSession& mpi, LivenessServer& live) {
  const int size = mpi.size();
  std::vector<Worker> workers(static_cast<size_t>(size));
  const auto t_load = std::chrono::steady_clock::now();
  std::unique_ptr<Engine> engine;
  std::unique_ptr<BatchJob> job;
  std::unique_ptr<ExclusiveLock> output_lock;  // rank 0 alone writes the output
  std::unique_ptr<BatchResultWriter> writer;
  std::mutex writer_mutex;
  std::vector<BatchInputLine> todo;
  std::vector<PreparedBatchLine> own;
  std::vector<std::string> own_ids;
  int64_t skipped = 0;
  plan::DpPartition partition;
  json recut;  // with --dp-recut: each cut's simulated makespan, the kept one's replica times
  const std::optional<int64_t> kill_after = test_kill_after(0);
  int64_t written_own = 0;  // results of rank 0's own lines (for the test hook)
  const auto written = [&] {
    if (kill_after && ++written_own >= *kill_after) ::raise(SIGKILL);
  };
  const BatchResultSink sink{[&](const std::string& id, const json& body) {
                               const std::lock_guard<std::mutex> lock(writer_mutex);
                               writer->write_success(id, body);
                               written();
                             },
                             [&](const std::string& id, int status, const json& body) {
                               const std::lock_guard<std::mutex> lock(writer_mutex);
                               writer->write_error(id, status, body);
                               written();
                             }};
  try {
    output_lock = std::make_unique<ExclusiveLock>(output_lock_path(run.output),
                                                  "the output file " + run.output.string());
    const std::vector<BatchInputLine> lines = read_batch_input(run.input);
    engine = std::make_unique<Engine>(run.model, run.engine);
    BatchJobOptions options = run.job;
    job = std::make_unique<BatchJob>(*engine, options);
    writer = std::make_unique<BatchResultWriter>(run.output);
    for (const BatchInputLine& line : lines) {
      if (writer->done_ids().count(line.custom_id))
        ++skipped;
      else
        todo.push_back(line);
    }
    // Bad lines get their error result here, once; the good ones are partitioned.
    std::vector<PreparedBatchLine> prepared = job->prepare(todo, sink);
    std::vector<plan::PlanRequest> requests;
    requests.reserve(prepared.size());
    for (const PreparedBatchLine& p : prepared) requests.push_back(job->plan_request(p));
    const CostModel planner_cost = job->planner_cost();
    std::vector<OfflineRequest> offline;
    if (run.dp_recuts > 0) {
      offline.reserve(prepared.size());
      for (const PreparedBatchLine& p : prepared) offline.push_back(job->offline_request(p));
    }
    EngineOptions replica = run.engine;
    replica.scheduler.max_batch_tokens = engine->max_batch_tokens();
    const plan::DpCuts cuts = plan::cut_data_parallel(
        requests, planner_cost, size, engine->max_batch_tokens(), run.dp_recuts,
        [&](const plan::DpPartition& cut) {
          if (run.dp_recuts == 0) return std::vector<double>(cut.parts.size(), 0.0);
          return simulate_parts(offline, cut.parts, engine->config(), replica,
                                static_cast<double>(engine->stats().kv_capacity_bytes),
                                planner_cost, plan::parse_policy(run.job.policy), run.job.planner);
        });
    partition = cuts.partition;
    if (run.dp_recuts > 0)
      recut = {{"simulated_cut_seconds", cuts.cut_seconds},
               {"kept_cut", cuts.kept},
               {"simulated_rank_seconds", cuts.rank_seconds}};
    std::unordered_map<std::string, const BatchInputLine*> line_of;
    for (const BatchInputLine& line : todo) line_of.emplace(line.custom_id, &line);
    // Rank 1 knows every id, to say which are lost if rank 0 dies (report_rank0_gone).
    json job_ids = json::array();
    for (const auto& part : partition.parts)
      for (int32_t r : part) job_ids.push_back(prepared[static_cast<size_t>(r)].custom_id);
    for (int k = 1; k < size; ++k) {
      json part = json::array();
      for (int32_t r : partition.parts[static_cast<size_t>(k)]) {
        const std::string& id = prepared[static_cast<size_t>(r)].custom_id;
        part.push_back(line_json(*line_of.at(id)));
        workers[static_cast<size_t>(k)].assigned.push_back(id);
      }
      // Sent without waiting: a rank that died while loading its engine never takes it.
      Worker& w = workers[static_cast<size_t>(k)];
      json message = {{"lines", std::move(part)}, {"ids", w.assigned}};
      if (k == 1) message["job_ids"] = std::move(job_ids);
      w.work = jsonl_dump(message);
      check(MPI_Isend(w.work.data(), static_cast<int>(w.work.size()), MPI_CHAR, k, kWork,
                      MPI_COMM_WORLD, &w.work_request),
            "MPI_Isend");
    }
    for (int32_t r : partition.parts[0]) {
      own_ids.push_back(prepared[static_cast<size_t>(r)].custom_id);
      own.push_back(std::move(prepared[static_cast<size_t>(r)]));
    }
  } catch (const std::exception& e) {
    for (int k = 1; k < size; ++k) send_json({{"error", e.what()}}, k, kWork, nullptr);
    throw;
  }
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

  // Rank 0 runs its own partition while a second thread takes the others' results.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> all_ids;
  for (const std::string& id : own_ids) all_ids.push_back(id);
  for (const Worker& w : workers)
    all_ids.insert(all_ids.end(), w.assigned.begin(), w.assigned.end());
  struct sigaction action {
  }, old_term{}, old_int{};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, &old_term);
  sigaction(SIGINT, &action, &old_int);
  std::thread receiver(receive_results, std::ref(workers), std::ref(live), std::ref(*writer),
                       std::ref(writer_mutex), std::cref(all_ids));
  std::optional<std::string> own_error;
  try {
    job->run(std::move(own), sink);
  } catch (const std::exception& e) {
    own_error = e.what();  // the others' results still get written
  }
  receiver.join();
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const std::vector<std::string> lost =
      report_job(run, size, *engine, *job, workers, *writer, partition, recut, todo.size(), skipped,
                 wall, load_seconds);
  for (const Worker& w : workers)
    if (w.crashed) mpi.skip_finalize();
  if (own_error) throw Error("rank 0: " + *own_error);
  if (!lost.empty())
    throw Error(std::to_string(lost.size()) +
                " requests were lost with a failed rank (listed above); rerun the same command "
                "with the same --output to run exactly those");
}

}  // namespace

bool built_with_mpi() {
  return true;
}

void run_batch(const BatchRun& run) {
  MpiSession mpi;
  // Rank 0's liveness address reaches every rank before anything else can fail.
  std::unique_ptr<LivenessServer> live;
  std::string address;
  if (mpi.rank() == 0) {
    live = std::make_unique<LivenessServer>();
    address = live->address();
  }
  int length = static_cast<int>(address.size());
  check(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  address.resize(static_cast<size_t>(length));
  check(MPI_Bcast(address.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  if (mpi.rank() == 0) {
    live->accept_workers(mpi.size(), kConnectTimeout);
    run_rank0(run, mpi, *live);
  } else {
    run_worker(run, mpi, address);
  }
}

}  // namespace blend::dist
