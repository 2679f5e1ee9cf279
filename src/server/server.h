// Server — `blend serve`: an OpenAI-compatible HTTP server over one Engine (DESIGN.md §1).
//   POST /v1/completions, /v1/chat/completions   (stream: true = Server-Sent Events)
//   GET  /v1/models, /health, /metrics            (Prometheus text, see metrics.h)
//   POST /v1/files, GET /v1/files/{id}[/content], POST /v1/batches, GET /v1/batches/{id},
//   POST /v1/batches/{id}/cancel                  (Batch API, files kept in data_dir)
// Interactive requests are real-time (RT); batch lines and "service_tier": "flex" requests are
// best-effort (BE). Bad requests get OpenAI error objects {"error": {message, type, param,
// code}} with the matching HTTP status, and the server carries on. A client that goes away
// (streaming or not) has its request cancelled and its KV freed. Unfinished batches found in
// data_dir at start-up are resumed, skipping the lines whose results are already written.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace blend {

struct ServerOptions {
  std::filesystem::path model;
  // Every model folder in this folder is served too, by its folder name, in one engine
  // (model/zoo.h); requests pick one with "model".
  std::filesystem::path zoo;
  std::vector<std::string> lora_modules;  // vLLM's --lora-modules NAME=DIR (model/zoo.h)
  // BlockLLM adaptive serving (blocks/adaptive.h): a `blend zoo analyze --out` file and the
  // similarity a block needs (0: the file's); which requests allow it: engine.adaptive_by_default.
  std::filesystem::path adaptive_blocks;
  double adaptive_threshold = 0;
  std::string host = "127.0.0.1";
  int port = 8000;              // 0 = any free port (see Server::port())
  std::string api_key;          // when set, /v1/* and /metrics need "Authorization: Bearer <key>"
  bool metrics_public = false;  // /metrics without the key even when api_key is set
  // The prefixes of /metrics' names: "blend", "vllm" (what vLLM's dashboards select) or "both".
  std::string metrics_prefix = "blend";
  std::filesystem::path data_dir = "blend-data";
  std::string served_model_name;  // of --model; default: the model folder's name
  // More names requests may give for --model's model (vLLM's --served-model-name A B ...);
  // answers carry served_model_name.
  std::vector<std::string> served_model_aliases;
  std::filesystem::path chat_template;  // a Jinja file for every model instead of its own
  std::string chat_template_text;       // or the template itself
  // "auto", "bf16" or "f32": the compute dtype asked for. The cpu backend's is fixed by the
  // checkpoint (and CPU); another is refused at start-up rather than silently not used.
  std::string dtype = "auto";  // a Jinja file instead of the model folder's template
  // On stderr: one line per request (method, path, status, tokens, latency), and every
  // stats_interval seconds while there is traffic, the throughput. quiet = neither.
  bool quiet = false;
  bool log_requests = true;  // the access log (off: vLLM's --disable-log-requests)
  double stats_interval = 10;
  size_t max_body_bytes = 64 << 20;  // one request's body (413 past it, any transfer encoding)
  // Request bodies held at once by all requests (server/request_body.h): past it a request
  // gets 503 with Retry-After. Parsing costs a few times a body's size.
  size_t max_body_bytes_in_flight = 256 << 20;
  // From a request's first byte, its head (request line and headers) must arrive within
  // http_head_timeout_s and all of it within http_request_timeout_s (else 408, closed): a
  // client trickling bytes (slowloris) cannot hold a connection thread.
  double http_head_timeout_s = 10;
  double http_request_timeout_s = 120;
  // Connections the kernel may hold for accept() (capped by net.core.somaxconn): httplib's 5
  // reset clients under bursts.
  int listen_backlog = 4096;
  // Requests served at once: each holds a thread while its body is read and it is answered (a
  // stream until its last token); more wait, queued, for a free thread. A connection between
  // requests, or whose request head is still arriving, holds none. llama.cpp's --threads-http.
  int http_threads = 512;
  // Connections open at once (idle ones included; each holds a file descriptor), in all and
  // from one client address: past either a new connection gets a 503 and is closed at once.
  // max_connections 0 = the open-file limit (RLIMIT_NOFILE) less 256 for models, data and KV
  // files; max_connections_per_ip 0 = no bound per address.
  int max_connections = 0;
  int max_connections_per_ip = 0;
  // Batch API jobs: "blend" (default) hands each job's lines to the engine in the order and
  // pace of a BlendServe plan of the job (prefix tree, dual scanner; as `blend batch --policy
  // blend`), "dfs" or "random" in those plans' orders, "fcfs" all at once in file order (no
  // planner). Jobs run one after another: the next one starts when the one before has handed
  // out all its lines. Real-time requests keep their priority (--scheduler hybrid) either way.
  std::string batch_policy = "blend";
  // A planned job's output-length sampling pass (BlendServe §5.1): this fraction of its lines
  // without ignore_eos runs first, their lengths estimate the others'; before that the planner
  // assumes `batch_assumed_output` tokens (at most max_tokens).
  double batch_sample_fraction = 0.01;
  double batch_assumed_output = 256;
  // The planner's view of this machine: a hardware preset or a `blend profile` file; empty =
  // the built-in CPU estimate (as `blend batch`).
  std::string batch_hardware;
  // Tests: called on the engine thread with each Batch API line's custom_id as the line is
  // handed to the engine, in that order.
  std::function<void(const std::string& custom_id)> on_batch_line_submitted;
  EngineOptions engine;
};

class Server {
 public:
  // Loads the model, opens data_dir, binds the socket and resumes unfinished batches; throws
  // blend::Error when any of that fails. Serving starts with run() or start().
  explicit Server(const ServerOptions& options);
  ~Server();  // stops
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  void run();    // serves on this thread until stop()
  void start();  // serves on a thread of its own
  void stop();   // from any thread; safe to call twice

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace blend
