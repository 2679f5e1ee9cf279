#include "server/server.h"

#include <signal.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "api/openai.h"
#include "server/batch_store.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "text/chat_template.h"

namespace blend {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

// What the error handler fills in for the statuses httplib sets by itself.
const char* default_message(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 404:
      return "no such endpoint";
    case 405:
      return "method not allowed";
    case 413:
      return "the request body is too large";
    default:
      return "request failed";
  }
}

// Bytes that are not UTF-8 (echoed from a bad request) become U+FFFD instead of an exception.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse(const json& chunk) {
  return "data: " + dump(chunk) + "\n\n";
}

}  // namespace

// Named outside the anonymous namespace because Server::Impl holds them.
namespace server_internal {

// One request between an HTTP handler thread and the engine thread. The `mu`-guarded part is
// shared; the rest belongs to the engine thread.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::string text;  // streamed text not yet taken by the handler
  bool done = false;
  std::optional<GenerationResult> result;
  std::optional<json> error;  // error body
  int error_status = 0;

  // Engine thread only.
  RequestClass cls = RequestClass::kRealtime;
  SeqId seq = 0;
  bool submitted = false;
  bool had_first_token = false;
  Clock::time_point arrival = Clock::now();
  Clock::time_point first_token;
};

// A batch being run: its input lines still to do and where their results go. Engine thread
// only, except `batch` (the object clients poll), which is guarded by Impl::batches_mu.
struct BatchJob {
  json batch;
  std::string output_id;
  std::unique_ptr<BatchResultWriter> writer;
  std::unordered_map<SeqId, std::shared_ptr<Pending>> in_flight;
  int64_t remaining = 0;
  bool cancelling = false;
};

}  // namespace server_internal

using server_internal::BatchJob;
using server_internal::Pending;

struct Server::Impl {
  ServerOptions options;
  std::string model_name;
  std::optional<ChatTemplate> chat_template;
  int64_t max_sequence_tokens = 0;
  Metrics metrics;
  std::unique_ptr<BatchStore> store;
  std::unique_ptr<EngineLoop> loop;
  httplib::Server http;
  int port = 0;
  std::atomic<bool> stopping{false};
  std::thread serve_thread;

  std::mutex batches_mu;
  std::unordered_map<std::string, std::shared_ptr<BatchJob>> jobs;

  explicit Impl(const ServerOptions& o);
  void routes();

  // --- requests ---
  bool authorized(const httplib::Request& req) const;
  void send_error(httplib::Response& res, int status, const std::string& message,
                  const std::string& param = "", const std::string& code = "");
  void completion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  std::shared_ptr<Pending> submit(const ApiRequest& request, RequestClass cls);
  void cancel(const std::shared_ptr<Pending>& p);
  // Waits for the end (or the server stopping: then false).
  bool wait_done(Pending& p);
  void check_request(const ApiRequest& request, const json& body);

  // --- batches ---
  void files_create(const httplib::Request& req, httplib::Response& res);
  void batches_create(const httplib::Request& req, httplib::Response& res);
  void batch_get(const httplib::Request& req, httplib::Response& res);
  void batch_cancel(const httplib::Request& req, httplib::Response& res);
  void start_job(json batch, bool resume);
  void run_line(const std::shared_ptr<BatchJob>& job, Engine& engine, const BatchInputLine& line);
  void line_done(const std::shared_ptr<BatchJob>& job);
  void finish_job(const std::shared_ptr<BatchJob>& job);
};

Server::Impl::Impl(const ServerOptions& o) : options(o) {
  model_name = options.served_model_name;
  if (model_name.empty()) {
    model_name = options.model.filename().string();
    if (model_name.empty()) model_name = options.model.parent_path().filename().string();
  }
  try {
    chat_template = ChatTemplate::from_dir(options.model);
  } catch (const Error&) {
    // chat requests then fail with a clear message
  }
  auto engine = std::make_unique<Engine>(options.model, options.engine);
  max_sequence_tokens = engine->max_sequence_tokens();
  store = std::make_unique<BatchStore>(options.data_dir);
  loop = std::make_unique<EngineLoop>(std::move(engine),
                                      [this](const Engine& e) { metrics.on_step(e.stats()); });
  // Streams hold a handler thread each for their whole life: allow many.
  http.new_task_queue = [] { return new httplib::ThreadPool(64); };
  http.set_payload_max_length(options.max_body_bytes);
  routes();
  if (options.port == 0) {
    port = http.bind_to_any_port(options.host);
  } else if (http.bind_to_port(options.host, options.port)) {
    port = options.port;
  } else {
    port = -1;
  }
  if (port < 0)
    throw Error("cannot listen on " + options.host + ":" + std::to_string(options.port));
  for (json& b : store->batches()) {
    const std::string status = b.value("status", "");
    if (status == "in_progress" || status == "validating" || status == "finalizing" ||
        status == "cancelling")
      start_job(std::move(b), /*resume=*/true);
  }
}

bool Server::Impl::authorized(const httplib::Request& req) const {
  if (options.api_key.empty()) return true;
  return req.get_header_value("Authorization") == "Bearer " + options.api_key;
}

void Server::Impl::send_error(httplib::Response& res, int status, const std::string& message,
                              const std::string& param, const std::string& code) {
  metrics.on_error(status);
  res.status = status;
  res.set_content(dump(error_body(message, error_type(status), param, code)), "application/json");
}

void Server::Impl::routes() {
  // Serving a client that hung up must not kill the process.
  ::signal(SIGPIPE, SIG_IGN);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 && !authorized(req)) {
      send_error(res, 401, "Incorrect API key provided.", "", "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Statuses httplib sets by itself (413 body too large, 404 unknown path, ...) get an OpenAI
  // error body too.
  http.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    send_error(res, res.status, default_message(res.status));
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("", "text/plain");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model = {{"id", model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "blend"},
                  {"max_model_len", max_sequence_tokens}};
    res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(),
                    "application/json");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, Endpoint::kCompletions);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, Endpoint::kChatCompletions);
  });
  http.Post("/v1/files", [this](const httplib::Request& req, httplib::Response& res) {
    files_create(req, res);
  });
  http.Get(R"(/v1/files/([A-Za-z0-9_-]+))",
           [this](const httplib::Request& req, httplib::Response& res) {
             auto f = store->file(req.matches[1]);
             if (!f) return send_error(res, 404, "no such file", "file_id");
             res.set_content(f->dump(), "application/json");
           });
  http.Get(R"(/v1/files/([A-Za-z0-9_-]+)/content)",
           [this](const httplib::Request& req, httplib::Response& res) {
             if (!store->file(req.matches[1]))
               return send_error(res, 404, "no such file", "file_id");
             std::ifstream in(store->file_path(req.matches[1]), std::ios::binary);
             std::ostringstream ss;
             ss << in.rdbuf();
             res.set_content(ss.str(), "application/octet-stream");
           });
  http.Post("/v1/batches", [this](const httplib::Request& req, httplib::Response& res) {
    batches_create(req, res);
  });
  http.Get(R"(/v1/batches/([A-Za-z0-9_-]+))",
           [this](const httplib::Request& req, httplib::Response& res) { batch_get(req, res); });
  http.Post(
      R"(/v1/batches/([A-Za-z0-9_-]+)/cancel)",
      [this](const httplib::Request& req, httplib::Response& res) { batch_cancel(req, res); });
}

// Limits the engine would quietly apply become errors here, as in vLLM: a client asking for
// more than fits should know.
void Server::Impl::check_request(const ApiRequest& request, const json& body) {
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  const char* prompt_param = request.endpoint == Endpoint::kCompletions ? "prompt" : "messages";
  if (prompt >= max_sequence_tokens)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(max_sequence_tokens) +
                       " tokens. However, your prompt has " + std::to_string(prompt) + " tokens.",
                   prompt_param);
  const bool asked = body.contains("max_tokens") || body.contains("max_completion_tokens");
  if (asked && prompt + request.params.max_tokens > max_sequence_tokens)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(max_sequence_tokens) +
                       " tokens. However, you requested " +
                       std::to_string(prompt + request.params.max_tokens) + " tokens (" +
                       std::to_string(prompt) + " in the prompt, " +
                       std::to_string(request.params.max_tokens) +
                       " for the completion). Please reduce the prompt or max_tokens.",
                   "max_tokens");
}

std::shared_ptr<Pending> Server::Impl::submit(const ApiRequest& request, RequestClass cls) {
  auto p = std::make_shared<Pending>();
  p->cls = cls;
  GenerationRequest gen{make_id("req-"),  request.prompt,  request.params, cls,
                        request.ttft_slo, request.tpot_slo};
  loop->post([this, p, gen = std::move(gen)](Engine& engine) mutable {
    metrics.on_queued(p->cls);
    auto on_token = [this, p](TokenId, std::string_view delta) {
      if (!p->had_first_token) {
        p->had_first_token = true;
        p->first_token = Clock::now();
        metrics.on_first_token(p->cls, seconds_between(p->arrival, p->first_token));
      }
      if (delta.empty()) return;
      {
        std::lock_guard lock(p->mu);
        p->text += delta;
      }
      p->cv.notify_all();
    };
    auto on_done = [this, p](GenerationResult&& r) {
      const auto now = Clock::now();
      const int64_t n = static_cast<int64_t>(r.tokens.size());
      const double tpot =
          n > 1 ? seconds_between(p->first_token, now) / static_cast<double>(n - 1) : 0.0;
      metrics.on_finished(p->cls, p->had_first_token, finish_reason_name(r.finish), r.prompt_tokens,
                          n, seconds_between(p->arrival, now), tpot);
      {
        std::lock_guard lock(p->mu);
        p->result = std::move(r);
        p->done = true;
      }
      p->cv.notify_all();
    };
    try {
      p->seq = engine.submit(std::move(gen), on_done, on_token);
      p->submitted = true;
    } catch (const Error& e) {
      metrics.on_cancelled(p->cls, false);
      {
        std::lock_guard lock(p->mu);
        p->error = ApiError(400, e.what()).body();
        p->error_status = 400;
        p->done = true;
      }
      p->cv.notify_all();
    }
  });
  return p;
}

void Server::Impl::cancel(const std::shared_ptr<Pending>& p) {
  loop->post([this, p](Engine& engine) {
    if (p->submitted && engine.cancel(p->seq)) metrics.on_cancelled(p->cls, p->had_first_token);
  });
}

bool Server::Impl::wait_done(Pending& p) {
  std::unique_lock lock(p.mu);
  while (!p.done) {
    if (stopping) return false;
    p.cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  return true;
}

void Server::Impl::completion(const httplib::Request& req, httplib::Response& res,
                              Endpoint endpoint) {
  json body;
  ApiRequest request;
  try {
    body = json::parse(req.body);
  } catch (const json::exception& e) {
    return send_error(res, 400, std::string("the body is not valid JSON: ") + e.what());
  }
  try {
    if (body.is_object() && body.contains("model") && body["model"].is_string() &&
        body["model"] != model_name)
      return send_error(res, 404,
                        "The model '" + body["model"].get<std::string>() + "' does not exist.",
                        "model", "model_not_found");
    request = parse_api_request(endpoint, body, loop->engine().tokenizer(),
                                chat_template ? &*chat_template : nullptr);
    check_request(request, body);
  } catch (const ApiError& e) {
    return send_error(res, e.status(), e.what(), e.param());
  } catch (const Error& e) {
    return send_error(res, 400, e.what());
  }
  const RequestClass cls = body.value("service_tier", "") == "flex" ? RequestClass::kBestEffort
                                                                    : RequestClass::kRealtime;
  const bool chat = endpoint == Endpoint::kChatCompletions;
  const std::string id = make_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = unix_seconds();
  auto p = submit(request, cls);

  if (!request.stream) {
    if (!wait_done(*p)) return send_error(res, 503, "the server is shutting down");
    std::lock_guard lock(p->mu);
    if (p->error) {
      metrics.on_error(p->error_status);
      res.status = p->error_status;
      return res.set_content(dump(*p->error), "application/json");
    }
    res.set_content(
        make_response(request, *p->result, id, model_name, created, loop->engine().tokenizer())
            .dump(-1, ' ', false, json::error_handler_t::replace),
        "application/json");
    return;
  }

  // Server-Sent Events in OpenAI's chunk format.
  request.prompt.clear();
  auto chunk = [this, id, created, chat, request](const json& choice) {
    json c = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model_name},
              {"choices", choice.is_null() ? json::array() : json::array({choice})}};
    if (request.include_usage) c["usage"] = nullptr;
    return c;
  };
  auto text_choice = [chat](const std::string& text, const json& finish) {
    if (chat)
      return json{
          {"index", 0},
          {"delta", text.empty() && !finish.is_null() ? json::object() : json{{"content", text}}},
          {"logprobs", nullptr},
          {"finish_reason", finish}};
    return json{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}};
  };
  auto sent_role = std::make_shared<bool>(false);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, p, chunk, text_choice, sent_role, chat, request](size_t, httplib::DataSink& sink) {
        std::string delta;
        bool done;
        {
          std::unique_lock lock(p->mu);
          p->cv.wait_for(lock, std::chrono::milliseconds(100),
                         [&] { return p->done || !p->text.empty() || stopping; });
          if (stopping) return false;
          delta.swap(p->text);
          done = p->done;
        }
        std::string out;
        if (chat && !*sent_role && !(done && p->error)) {
          out += sse(chunk({{"index", 0},
                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                            {"logprobs", nullptr},
                            {"finish_reason", nullptr}}));
          *sent_role = true;
        }
        if (!delta.empty()) out += sse(chunk(text_choice(delta, nullptr)));
        if (done) {
          std::lock_guard lock(p->mu);
          if (p->error) {
            metrics.on_error(p->error_status);
            out += sse(*p->error);
          } else {
            const GenerationResult& r = *p->result;
            out += sse(chunk(text_choice("", finish_reason_name(r.finish))));
            if (request.include_usage) {
              json c = chunk(nullptr);
              const int64_t n = static_cast<int64_t>(r.tokens.size());
              c["usage"] = {{"prompt_tokens", r.prompt_tokens},
                            {"completion_tokens", n},
                            {"total_tokens", r.prompt_tokens + n}};
              out += sse(c);
            }
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (done) sink.done();
        return true;
      },
      // Not a success: the client went away (or we are stopping). Free the sequence now.
      [this, p](bool success) {
        if (!success) cancel(p);
      });
}

// --- Batch API ---

void Server::Impl::files_create(const httplib::Request& req, httplib::Response& res) {
  if (!req.is_multipart_form_data() || !req.has_file("file"))
    return send_error(res, 400, "expected a multipart/form-data upload with a 'file' part", "file");
  const std::string purpose = req.has_file("purpose") ? req.get_file_value("purpose").content : "";
  if (purpose != "batch")
    return send_error(res, 400, "only purpose 'batch' is supported", "purpose");
  const httplib::MultipartFormData file = req.get_file_value("file");
  // Reject what could never run before storing it: every line must be a JSON object.
  std::istringstream in(file.content);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object())
      return send_error(res, 400, "line " + std::to_string(n) + " is not a JSON object", "file");
  }
  json f = store->create_file(file.filename.empty() ? "upload.jsonl" : file.filename, purpose,
                              file.content);
  res.set_content(f.dump(), "application/json");
}

void Server::Impl::batches_create(const httplib::Request& req, httplib::Response& res) {
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (!body.is_object()) return send_error(res, 400, "the body must be a JSON object");
  const std::string input = body.value("input_file_id", "");
  const std::string endpoint = body.value("endpoint", "");
  if (!store->file(input)) return send_error(res, 404, "no such file", "input_file_id");
  try {
    parse_endpoint(endpoint);
  } catch (const ApiError& e) {
    return send_error(res, 400, e.what(), "endpoint");
  }
  std::string output_id;
  json batch = store->create_batch(input, endpoint, body.value("completion_window", "24h"),
                                   body.value("metadata", json(nullptr)), &output_id);
  start_job(batch, /*resume=*/false);
  res.set_content(batch.dump(), "application/json");
}

void Server::Impl::batch_get(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  {
    std::lock_guard lock(batches_mu);
    if (auto it = jobs.find(id); it != jobs.end())
      return res.set_content(it->second->batch.dump(), "application/json");
  }
  auto b = store->batch(id);
  if (!b) return send_error(res, 404, "no such batch", "batch_id");
  res.set_content(b->dump(), "application/json");
}

void Server::Impl::batch_cancel(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  std::shared_ptr<BatchJob> job;
  {
    std::lock_guard lock(batches_mu);
    if (auto it = jobs.find(id); it != jobs.end()) job = it->second;
  }
  if (!job) {
    auto b = store->batch(id);
    if (!b) return send_error(res, 404, "no such batch", "batch_id");
    return send_error(res, 400,
                      "batch " + id + " is " + b->value("status", "") + " and cannot be cancelled");
  }
  json snapshot;
  {
    std::lock_guard lock(batches_mu);
    const std::string status = job->batch["status"];
    if (status != "in_progress" && status != "validating")
      return send_error(res, 400, "batch " + id + " is " + status + " and cannot be cancelled");
    job->batch["status"] = "cancelling";
    job->batch["cancelling_at"] = unix_seconds();
    snapshot = job->batch;
  }
  store->save_batch(snapshot);
  loop->post([this, job](Engine& engine) {
    job->cancelling = true;
    for (const auto& [seq, state] : job->in_flight)
      if (engine.cancel(seq)) metrics.on_cancelled(state->cls, state->had_first_token);
    job->in_flight.clear();
    finish_job(job);
  });
  res.set_content(snapshot.dump(), "application/json");
}

// Counts the results already written (a resumed batch) and queues the other lines as BE
// requests on the engine thread.
void Server::Impl::start_job(json batch, bool resume) {
  auto job = std::make_shared<BatchJob>();
  const std::string id = batch["id"];
  job->output_id = store->output_id(id);
  std::vector<BatchInputLine> lines;
  try {
    lines = read_batch_input(store->file_path(batch["input_file_id"]));
    job->writer = std::make_unique<BatchResultWriter>(store->file_path(job->output_id));
  } catch (const Error& e) {
    batch["status"] = "failed";
    batch["failed_at"] = unix_seconds();
    batch["errors"] = {{"object", "list"},
                       {"data", json::array({{{"code", "invalid_file"}, {"message", e.what()}}})}};
    store->save_batch(batch);
    return;
  }
  int64_t completed = 0, failed = 0;
  if (resume) {
    std::ifstream in(store->file_path(job->output_id));
    std::string line;
    while (std::getline(in, line)) {
      json r = json::parse(line, nullptr, false);
      if (!r.is_object()) continue;
      const bool ok = r.contains("response") && r["response"].is_object() &&
                      r["response"].value("status_code", 0) == 200;
      ++(ok ? completed : failed);
    }
  }
  batch["request_counts"] = {
      {"total", static_cast<int64_t>(lines.size())}, {"completed", completed}, {"failed", failed}};
  std::vector<BatchInputLine> todo;
  for (BatchInputLine& l : lines)
    if (!job->writer->done_ids().count(l.custom_id)) todo.push_back(std::move(l));
  job->remaining = static_cast<int64_t>(todo.size());
  job->batch = batch;
  // A batch cancelled just before a restart only needs its final status.
  job->cancelling = batch["status"] == "cancelling";
  if (job->cancelling) todo.clear();
  {
    std::lock_guard lock(batches_mu);
    jobs[id] = job;
  }
  loop->post([this, job, todo = std::move(todo)](Engine& engine) {
    for (const BatchInputLine& line : todo) run_line(job, engine, line);
    if (job->remaining == 0 || job->cancelling) finish_job(job);
  });
}

void Server::Impl::run_line(const std::shared_ptr<BatchJob>& job, Engine& engine,
                            const BatchInputLine& line) {
  try {
    if (line.error) throw ApiError(400, *line.error);
    const Endpoint endpoint = parse_endpoint(line.url);
    if (line.body.is_object() && line.body.contains("model") && line.body["model"].is_string() &&
        line.body["model"] != model_name)
      throw ApiError(404,
                     "The model '" + line.body["model"].get<std::string>() + "' does not exist.",
                     "model");
    ApiRequest request = parse_api_request(endpoint, line.body, engine.tokenizer(),
                                           chat_template ? &*chat_template : nullptr);
    check_request(request, line.body);
    GenerationRequest gen{line.custom_id, std::move(request.prompt), request.params,
                          RequestClass::kBestEffort};
    request.prompt.clear();
    metrics.on_queued(RequestClass::kBestEffort);
    auto state = std::make_shared<Pending>();
    state->cls = RequestClass::kBestEffort;
    const int64_t created = unix_seconds();
    auto on_token = [this, state](TokenId, std::string_view) {
      if (state->had_first_token) return;
      state->had_first_token = true;
      state->first_token = Clock::now();
      metrics.on_first_token(state->cls, seconds_between(state->arrival, state->first_token));
    };
    auto on_done = [this, job, state, request, created, id = line.custom_id](GenerationResult&& r) {
      const auto now = Clock::now();
      const int64_t n = static_cast<int64_t>(r.tokens.size());
      metrics.on_finished(
          state->cls, state->had_first_token, finish_reason_name(r.finish), r.prompt_tokens, n,
          seconds_between(state->arrival, now),
          n > 1 ? seconds_between(state->first_token, now) / static_cast<double>(n - 1) : 0.0);
      const char* prefix = request.endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-";
      job->writer->write_success(id, make_response(request, r, make_id(prefix), model_name, created,
                                                   loop->engine().tokenizer()));
      job->in_flight.erase(state->seq);
      state->done = true;
      {
        std::lock_guard lock(batches_mu);
        auto& counts = job->batch["request_counts"];
        counts["completed"] = counts["completed"].get<int64_t>() + 1;
      }
      line_done(job);
    };
    state->seq = engine.submit(std::move(gen), on_done, on_token);
    // A request with max_tokens 0 finished inside submit(); only the others are in flight.
    if (!state->done) job->in_flight.emplace(state->seq, state);
  } catch (const Error& e) {
    const ApiError* api = dynamic_cast<const ApiError*>(&e);
    const int status = api ? api->status() : 400;
    job->writer->write_error(line.custom_id, status,
                             api ? api->body() : ApiError(400, e.what()).body());
    {
      std::lock_guard lock(batches_mu);
      auto& counts = job->batch["request_counts"];
      counts["failed"] = counts["failed"].get<int64_t>() + 1;
    }
    line_done(job);
  }
}

void Server::Impl::line_done(const std::shared_ptr<BatchJob>& job) {
  if (--job->remaining == 0) finish_job(job);
}

// Engine thread: publishes the results file and the final status.
void Server::Impl::finish_job(const std::shared_ptr<BatchJob>& job) {
  std::string id;
  {
    std::lock_guard lock(batches_mu);
    const json& b = job->batch;
    if (b["status"] == "completed" || b["status"] == "cancelled") return;
    id = b["id"];
  }
  // The results are all written: publish their file before the status that points at it.
  store->register_file(job->output_id, id + "_output.jsonl", "batch_output");
  json snapshot;
  {
    std::lock_guard lock(batches_mu);
    json& b = job->batch;
    const int64_t now = unix_seconds();
    const bool cancelled = job->cancelling || b["status"] == "cancelling";
    b["status"] = cancelled ? "cancelled" : "completed";
    b[cancelled ? "cancelled_at" : "completed_at"] = now;
    b["finalizing_at"] = now;
    b["output_file_id"] = job->output_id;
    snapshot = b;
  }
  store->save_batch(snapshot);
}

Server::Server(const ServerOptions& options) : impl_(std::make_unique<Impl>(options)) {}

Server::~Server() {
  stop();
  if (impl_->serve_thread.joinable()) impl_->serve_thread.join();
  // The engine thread runs callbacks that use the rest of Impl, `loop` included: stop it while
  // all of that still exists. (Resetting `loop` alone nulled it before joining the thread, and a
  // batch line finishing in the last step then crashed on loop->engine().)
  impl_->loop->stop();
  impl_->loop.reset();
}

int Server::port() const {
  return impl_->port;
}

void Server::run() {
  if (!impl_->http.listen_after_bind())
    if (!impl_->stopping) throw Error("the HTTP server stopped unexpectedly");
}

void Server::start() {
  impl_->serve_thread = std::thread([this] { impl_->http.listen_after_bind(); });
  // Return once requests are accepted, so callers can connect at once.
  for (int i = 0; i < 5000 && !impl_->http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void Server::stop() {
  impl_->stopping = true;
  impl_->http.stop();
}

}  // namespace blend
