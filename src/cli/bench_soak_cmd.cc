// `blend bench soak`: issue 26's reliability run (harness/soak.h). It starts `blend serve` as a
// child process (127.0.0.1, a free port, its own data folder), so that the RSS it samples is the
// server's alone, or targets a running server with --url (loopback only; --server-pid to sample
// its RSS). At the end the child is stopped with SIGTERM and must exit cleanly. Exit status 1
// when the soak found a problem (listed on stderr), after printing the report.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "harness/load_generator.h"
#include "harness/soak.h"

extern char** environ;

namespace blend::cli {
namespace {

struct SoakArgs {
  std::filesystem::path model;
  std::string url;
  int threads = 0;
  double kv_memory_gb = 0;
  int http_threads = 0;  // 0 = clients + 64
  std::string policy;    // the server's --scheduler; empty = its default
  bool json = false;
  online::SoakOptions soak;
};

// A port nobody listens on now (the kernel's pick for an ephemeral bind).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw Error("cannot find a free port on 127.0.0.1");
  return ntohs(addr.sin_port);
}

// `blend serve` as a child process, stopped (SIGTERM) when this goes out of scope.
class ServerProcess {
 public:
  ServerProcess(const SoakArgs& args, int port) {
    data_dir_ =
        std::filesystem::temp_directory_path() / ("blend-soak-" + std::to_string(::getpid()));
    std::filesystem::remove_all(data_dir_);
    std::vector<std::string> argv = {
        "blend",
        "serve",
        "--model",
        args.model.string(),
        "--host",
        "127.0.0.1",
        "--port",
        std::to_string(port),
        "--data-dir",
        data_dir_.string(),
        "--quiet",
        "--threads-http",
        std::to_string(args.http_threads > 0 ? args.http_threads
                                             : args.soak.clients + args.soak.hostile_clients + 64),
        "--max-body-bytes",
        std::to_string(args.soak.max_body_bytes),
        "--http-head-timeout",
        std::to_string(args.soak.head_timeout_s)};
    if (args.threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(args.threads)});
    if (!args.policy.empty()) argv.insert(argv.end(), {"--scheduler", args.policy});
    if (args.kv_memory_gb > 0)
      argv.insert(argv.end(), {"--kv-memory", std::to_string(args.kv_memory_gb)});
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    if (::posix_spawn(&pid_, "/proc/self/exe", nullptr, nullptr, cargv.data(), environ) != 0)
      throw Error("cannot start blend serve");
    // Ready when /health answers; a child that exits first failed to start.
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(1, 0);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    for (;;) {
      if (auto r = c.Get("/health"); r && r->status == 200) break;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw Error("blend serve exited before it was ready (its messages are above)");
      }
      if (std::chrono::steady_clock::now() > give_up)
        throw Error("blend serve was not ready after 300 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) (void)stop();
    std::error_code ec;
    std::filesystem::remove_all(data_dir_, ec);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int pid() const { return pid_; }

  // SIGTERM, then the exit status ("" for a clean exit 0, else what happened).
  std::string stop() {
    if (pid_ <= 0) return "";
    ::kill(pid_, SIGTERM);
    int status = 0;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        pid_ = -1;
        return "blend serve did not stop within 60 s of SIGTERM";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    pid_ = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
    if (WIFSIGNALED(status))
      return "blend serve died of signal " + std::to_string(WTERMSIG(status));
    return "blend serve exited with status " + std::to_string(WEXITSTATUS(status));
  }

 private:
  pid_t pid_ = -1;
  std::filesystem::path data_dir_;
};

void print(const online::SoakOptions& o, const online::SoakReport& r, bool json) {
  if (json) {
    std::printf("%s\n", online::to_json(o, r).dump().c_str());
  } else {
    std::printf(
        "soak: %d clients for %.0f s: %lld requests, %lld completed, %lld hung up by the "
        "client, %lld failed; %lld output tokens (%.0f tok/s); TTFT p50 %.3f p99 %.3f s; %d "
        "streams open at most; BE %lld jobs, %lld requests; server: %.0f finished + %.0f "
        "cancelled RT, healthy %s; RSS %.0f MiB after warm-up, %.0f at the end, %.0f max\n",
        o.clients, o.duration_seconds, static_cast<long long>(r.requests),
        static_cast<long long>(r.completed), static_cast<long long>(r.hung_up),
        static_cast<long long>(r.failed), static_cast<long long>(r.output_tokens),
        static_cast<double>(r.output_tokens) / o.duration_seconds, r.ttft_p50, r.ttft_p99,
        r.max_open, static_cast<long long>(r.be_jobs), static_cast<long long>(r.be_requests),
        r.server_finished, r.server_cancelled, r.healthy ? "yes" : "no", r.rss_warm_mib,
        r.rss_end_mib, r.rss_max_mib);
  }
  if (!json && !r.hostile.attempts.empty()) {
    std::string line = "hostile:";
    for (const auto& [attack, count] : r.hostile.attempts)
      line += " " + attack + " " + std::to_string(count);
    int64_t wrong = 0;
    for (const auto& [what, count] : r.hostile.unexpected) wrong += count;
    std::printf("%s; %lld answered wrongly\n", line.c_str(), static_cast<long long>(wrong));
  }
  std::fflush(stdout);
  for (const auto& [reason, count] : r.failures)
    std::fprintf(stderr, "blend bench soak: %lld requests failed: %s\n",
                 static_cast<long long>(count), reason.c_str());
}

void run(SoakArgs& args) {
  online::SoakOptions& o = args.soak;
  if (!args.url.empty()) {
    std::tie(o.host, o.port) = online::parse_url(args.url);
    online::check_loopback(o.host);
    const online::SoakReport report = online::run_soak(o);
    print(o, report, args.json);
    if (!report.ok) throw Error("soak failed: " + report.problems.front());
    return;
  }
  if (args.model.empty()) throw Error("--model DIR is needed (or --url of a running server)");
  if (!std::filesystem::is_directory(args.model))
    throw Error("--model " + args.model.string() + ": no such model folder");
  if (o.server_pid != 0) throw Error("--server-pid goes with --url");
  o.host = "127.0.0.1";
  o.port = free_port();
  ServerProcess server(args, o.port);
  o.server_pid = server.pid();
  online::SoakReport report = online::run_soak(o);
  if (const std::string exit = server.stop(); !exit.empty()) {
    report.problems.push_back(exit);
    report.ok = false;
  }
  print(o, report, args.json);
  if (!report.ok) {
    for (const std::string& p : report.problems)
      std::fprintf(stderr, "blend bench soak: %s\n", p.c_str());
    throw Error("soak failed: " + report.problems.front());
  }
}

}  // namespace

void register_bench_soak_command(CLI::App& bench) {
  auto a = std::make_shared<SoakArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "soak",
      "Reliability under sustained load: concurrent streaming clients (some hanging up), Batch "
      "API jobs, the server's RSS every second; fails on any error, leak or lost request");
  cmd->add_option("--model", a->model, "Model folder (`blend serve` is started as a child)");
  cmd->add_option("--url", a->url,
                  "A running server instead, http://127.0.0.1:PORT (loopback only)");
  cmd->add_option("--server-pid", a->soak.server_pid, "With --url: the server's pid, for its RSS");
  cmd->add_option("--clients", a->soak.clients, "Streaming clients at once")
      ->check(CLI::Range(1, 20000))
      ->capture_default_str();
  cmd->add_option("--duration", a->soak.duration_seconds, "Seconds of load (at most 24 h)")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--hang-up-fraction", a->soak.hang_up_fraction,
                  "Share of requests the client abandons after 1-4 stream events")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--be-batch", a->soak.be_batch_requests,
                  "Lines per Batch API job, jobs back to back (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--prompt-min", a->soak.prompt_min, "Shortest prompt, tokens")
      ->capture_default_str();
  cmd->add_option("--prompt-max", a->soak.prompt_max, "Longest prompt, tokens")
      ->capture_default_str();
  cmd->add_option("--output-min", a->soak.output_min, "Fewest output tokens")
      ->capture_default_str();
  cmd->add_option("--output-max", a->soak.output_max, "Most output tokens")->capture_default_str();
  cmd->add_option("--drain-timeout", a->soak.drain_timeout_seconds,
                  "Seconds requests in flight get after the window")
      ->capture_default_str();
  cmd->add_option("--rss-growth-limit", a->soak.rss_growth_limit,
                  "Largest RSS growth from warm-up to the end, as a fraction")
      ->capture_default_str();
  cmd->add_option("--seed", a->soak.seed, "Prompts, lengths and hang-ups")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Server compute threads (default: all)");
  cmd->add_option("--kv-memory", a->kv_memory_gb, "Server KV cache size in GB");
  cmd->add_option("--scheduler", a->policy,
                  "The server's scheduler (`blend serve --scheduler`; default: its own)");
  refuse_policy_flag(cmd);
  cmd->add_option("--threads-http", a->http_threads,
                  "Server connections at once (default: clients + 64)");
  cmd->add_option("--hostile-clients", a->soak.hostile_clients,
                  "Threads sending hostile requests beside the load (chunked and announced "
                  "bodies past the limit, slow headers, pipelined requests, never-seen JSON "
                  "schemas); each must get its clean answer")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", a->soak.max_body_bytes,
                  "The server's --max-body-bytes (passed to the child; with --url, what the "
                  "server was started with)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--http-head-timeout", a->soak.head_timeout_s,
                  "The server's --http-head-timeout (passed to the child, as above)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--schema-values", a->soak.schema_values,
                  "Enum values in each hostile JSON schema (64 bytes each)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "The report as one JSON object (RSS samples included)");
  cmd->callback([a] { run(*a); });
}

}  // namespace blend::cli
