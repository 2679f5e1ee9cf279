// Server::Impl — what the route files share: the engine loop, the metrics, the Batch API store,
// the handler <-> engine-thread hand-off (Pending) and the error helpers. Internal to
// src/server; server.h is the public face.
//   server.cc             set-up, the route table's hooks (auth, errors), start/stop
//   completions_routes.cc /v1/completions, /v1/chat/completions (JSON and SSE)
//   responses_routes.cc   /v1/responses (translated onto the chat path)
//   batch_routes.cc       /v1/files, /v1/batches (the Batch API)
//   info_routes.cc        /health, /version, /metrics, /v1/models[/{id}], /tokenize,
//                         /detokenize
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/batch_file.h"
#include "api/openai.h"
#include "cost/cost_model.h"
#include "grammar/json_schema.h"
#include "offline/planned_feed.h"
#include "server/batch_store.h"
#include "server/connection.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/request_body.h"
#include "server/server.h"
#include "text/chat_template.h"

namespace blend {

namespace server_internal {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Bytes that are not UTF-8 (echoed from a bad request) become U+FFFD instead of an exception.
inline std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One request between an HTTP handler thread and the engine thread. The `mu`-guarded part is
// shared; the rest belongs to the engine thread.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::string text;                  // streamed text not yet taken by the handler
  std::vector<SampledToken> tokens;  // and the tokens that made it (their logprobs)
  bool done = false;
  std::optional<GenerationResult> result;
  std::optional<nlohmann::json> error;  // error body
  int error_status = 0;

  // Engine thread only.
  RequestClass cls = RequestClass::kRealtime;
  SeqId seq = 0;
  bool submitted = false;
  bool had_first_token = false;
  Clock::time_point arrival = Clock::now();
  Clock::time_point first_token;
};

// One line's answer while its n samples (OpenAI's n) run: it is written once, with n choices,
// when the last one ends, or as an error when one cannot run.
struct LineAnswer {
  std::string id;  // custom_id
  ApiRequest request;
  int64_t created = 0;
  int32_t submitted = 0;  // samples handed to the engine
  std::vector<GenerationResult> results;
  bool written = false;
};

// A batch being run: its input lines still to do and where their results go. Engine thread
// only, except `batch` (the object clients poll), which is guarded by Impl::batches_mu.
struct BatchJob {
  nlohmann::json batch;
  std::string output_id, error_id;
  std::unique_ptr<BatchResultWriter> writer;        // successful lines (output_file_id)
  std::unique_ptr<BatchResultWriter> error_writer;  // failed lines (error_file_id)
  std::unordered_map<SeqId, std::shared_ptr<Pending>> in_flight;
  int64_t remaining = 0;
  bool cancelling = false;
  // Set by the cancel route at once (`cancelling` follows on the engine thread, after the
  // closure running the job's lines): stops a line's grammar compile and the lines after it.
  std::atomic<bool> cancel_requested{false};
  // Set when a result could not be written (a full disk): the batch then fails with this
  // reason, keeping the whole lines already written (Impl::fail_job).
  std::optional<std::string> write_failure;
  // A planned job (ServerOptions::batch_policy other than fcfs): its good lines' samples, fed to
  // the engine in the order and pace of a BlendServe plan by Impl::admit_batch_lines through
  // the runner `blend batch` uses (offline/planned_run.h: PlannedFeed). Kept until the job ends
  // (its samples in flight report to it); `admitting` while it holds samples back.
  std::unique_ptr<PlannedFeed> feed;
  bool admitting = false;
  // Each planned line's answer by custom_id, until its samples are handed out.
  std::unordered_map<std::string, std::shared_ptr<LineAnswer>> answers;
};

// What the access-log line of the request this thread is serving reports. httplib runs the
// pre-routing handler, the route handler (with its stream) and the logger on one thread per
// connection, so a thread_local carries it from the first to the last.
struct RequestLog {
  Clock::time_point start;
  int64_t prompt_tokens = -1, completion_tokens = -1;  // -1: not a generation
};
RequestLog& request_log();

}  // namespace server_internal

struct Server::Impl {
  using Pending = server_internal::Pending;
  using BatchJob = server_internal::BatchJob;
  using LineAnswer = server_internal::LineAnswer;

  ServerOptions options;
  // The engine's models by ModelId (names, chat templates, sampling defaults) and the chat
  // templates they point to.
  std::vector<ServedModel> served;
  std::vector<std::optional<ChatTemplate>> chat_templates;
  // The served model a body names (api/openai.h): ApiError 404 for an unknown one.
  ModelId model_of(const nlohmann::json& body) const { return resolve_model(body, served); }
  const std::string& model_name(ModelId model) const { return served.at(model).name; }
  const Tokenizer& tokenizer_of(ModelId model) const { return *served.at(model).tokenizer; }
  int64_t max_sequence_tokens = 0;
  // One per distinct tokenizer; each ServedModel points at its own (and at its tokenizer).
  std::vector<std::unique_ptr<GrammarCompiler>> grammar_compilers;
  Metrics metrics;
  std::unique_ptr<BatchStore> store;
  std::unique_ptr<EngineLoop> loop;
  HttpServer http;
  BodyBudget body_budget{options.max_body_bytes_in_flight};
  int port = 0;
  std::atomic<bool> stopping{false};
  std::thread serve_thread;
  // The throughput line (server.cc): a thread printing every options.stats_interval seconds.
  std::thread stats_thread;
  void stats_loop();
  std::atomic<int64_t> stat_prompt_tokens{0}, stat_output_tokens{0};  // engine totals
  std::atomic<int64_t> stat_running{0}, stat_waiting{0};

  std::mutex batches_mu;
  std::unordered_map<std::string, std::shared_ptr<BatchJob>> jobs;
  // Planned admission of Batch API jobs (batch_routes.cc): the planner's cost model and what
  // it admits against, and the jobs with lines not yet handed to the engine, oldest first
  // (engine thread only; the oldest one admits, the next starts when it has handed out all).
  std::optional<CostModel> batch_cost;
  double batch_kv_bytes = 0;
  int32_t batch_step_tokens = 0;
  std::deque<std::shared_ptr<BatchJob>> admission;

  explicit Impl(const ServerOptions& o);
  void routes();
  // Registers a handler and remembers the route, so that another method on it is a 405. POST
  // and DELETE handlers get req.body read under the body limits (server/request_body.h).
  void route(const char* method, const std::string& pattern, httplib::Server::Handler handler);
  std::vector<std::pair<std::regex, std::string>> known_routes;  // (path pattern, method)
  // Whether `method` is registered on `path`; else the methods that are ("" for none).
  bool has_route(const std::string& method, const std::string& path, std::string* allow) const;
  // A POST or DELETE with a route: the requests whose body is read (else refused unread).
  bool route_reads_body(const std::string& method, const std::string& path) const;
  // The 404 or 405 (with Allow) for a request no route takes.
  void send_no_route(const httplib::Request& req, httplib::Response& res);
  // Before routing: a body no route will read, or announced past the limit, is refused
  // without reading it.
  bool refuse_body_before_reading(const httplib::Request& req, httplib::Response& res);
  // Each route family registers its own handlers (in its own file).
  void info_routes();
  void completions_routes();
  void batch_routes();
  void responses_routes();

  // --- info (info_routes.cc) ---
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);

  // --- requests (server.cc) ---
  bool authorized(const httplib::Request& req) const;
  void send_error(httplib::Response& res, int status, const std::string& message,
                  const std::string& param = "", const std::string& code = "");
  void send_error(httplib::Response& res, const ApiError& e) {
    send_error(res, e.status(), e.what(), e.param(), e.code());
  }

  // --- completions (completions_routes.cc) ---
  void completion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  // One of the request's n samples (GenerationRequest::index).
  std::shared_ptr<Pending> submit(const ApiRequest& request, RequestClass cls, int32_t index = 0);
  void cancel(const std::shared_ptr<Pending>& p);
  // Waits for the end: false when the server is stopping or the client on `socket` (when not
  // -1) hung up.
  bool wait_done(Pending& p, int socket = -1);

  // --- responses (responses_routes.cc) ---
  void responses_create(const httplib::Request& req, httplib::Response& res);
  // What bounds a request to `model` before costly work (api/openai.h RequestLimits), its
  // schema compilation cancelled when the client of `req` hangs up.
  RequestLimits request_limits(const httplib::Request& req, ModelId model);

  // --- batches (batch_routes.cc) ---
  void files_create(const httplib::Request& req, httplib::Response& res);
  void batches_create(const httplib::Request& req, httplib::Response& res);
  void batch_get(const httplib::Request& req, httplib::Response& res);
  void batches_list(const httplib::Request& req, httplib::Response& res);
  void files_list(const httplib::Request& req, httplib::Response& res);
  void file_delete(const httplib::Request& req, httplib::Response& res);
  void batch_cancel(const httplib::Request& req, httplib::Response& res);
  void start_job(nlohmann::json batch, bool resume);
  BatchLineContext line_context(const BatchJob& job) const;
  // Tokenizes and plans the lines of a planned job (on the caller's thread); the lines that
  // fail go back in `errors`.
  void plan_job(BatchJob& job, const std::vector<BatchInputLine>& todo,
                std::vector<PreparedBatchLine>& errors);
  // Before every engine step (EngineLoop's feed): hands the engine the samples the oldest
  // planned job admits now and sets the step budget its plan wants; true while some wait.
  bool admit_batch_lines(Engine& engine);
  // False when the job was cancelled or the server is stopping: the line was not run.
  bool run_line(const std::shared_ptr<BatchJob>& job, Engine& engine, const BatchInputLine& line);
  // Submits a prepared line's n samples at once, or writes its error result.
  void submit_line(const std::shared_ptr<BatchJob>& job, Engine& engine,
                   PreparedBatchLine prepared);
  std::shared_ptr<LineAnswer> line_answer(PreparedBatchLine& prepared) const;
  // Submits one sample of `answer`'s line; `on_token` and `ended` are a planned feed's (or
  // empty). A sample that cannot run fails the line.
  void submit_sample(const std::shared_ptr<BatchJob>& job, Engine& engine,
                     const std::shared_ptr<LineAnswer>& answer, GenerationRequest sample,
                     Engine::TokenCallback on_token = {}, PlannedFeed::Ended ended = {});
  // Writes the error result of line `id` (counted as failed).
  void fail_line(const std::shared_ptr<BatchJob>& job, const std::string& id, const Error& error);
  void line_done(const std::shared_ptr<BatchJob>& job);
  // Writes one result line with `write`; when that fails (a full disk), the job fails
  // (fail_job) and false is returned.
  bool write_result(const std::shared_ptr<BatchJob>& job, const std::function<void()>& write);
  // Engine thread: the job ends as "failed" with `reason`; its other lines stop.
  void fail_job(const std::shared_ptr<BatchJob>& job, const std::string& reason);
  // Engine thread (a loop task, not a step callback): cancels the job's requests in flight and
  // the lines not yet handed out, then finishes it.
  void stop_job(const std::shared_ptr<BatchJob>& job, Engine& engine);
  void finish_job(const std::shared_ptr<BatchJob>& job);
};

}  // namespace blend
