// The Batch API: /v1/files (uploads, results) and /v1/batches (create, poll, cancel). Batch lines
// run as best-effort requests on the engine thread; results are appended as lines finish, so a
// restarted server resumes a batch where it stopped.
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "api/batch_lines.h"
#include "api/json_limits.h"
#include "server/server_impl.h"

namespace blend {

using nlohmann::json;
using server_internal::BatchJob;
using server_internal::Clock;
using server_internal::Pending;
using server_internal::seconds_between;

void Server::Impl::batch_routes() {
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
    const std::string what = "line " + std::to_string(n);
    json parsed;
    try {
      parsed = parse_client_json(line, what);
    } catch (const ApiError& e) {
      return send_error(res, 400, e.what(), "file");
    }
    if (!parsed.is_object()) return send_error(res, 400, what + " is not a JSON object", "file");
  }
  json f = store->create_file(file.filename.empty() ? "upload.jsonl" : file.filename, purpose,
                              file.content);
  res.set_content(f.dump(), "application/json");
}

void Server::Impl::batches_create(const httplib::Request& req, httplib::Response& res) {
  json body;
  try {
    body = parse_client_json(req.body, "the request body");
  } catch (const ApiError& e) {
    return send_error(res, e.status(), e.what());
  }
  if (!body.is_object()) return send_error(res, 400, "the body must be a JSON object");
  // A field of the wrong type is the client's error (400), not a JSON type exception (500).
  for (const char* field : {"input_file_id", "endpoint", "completion_window"})
    if (body.contains(field) && !body[field].is_string())
      return send_error(res, 400, std::string("'") + field + "' must be a string", field);
  if (body.contains("metadata") && !body["metadata"].is_object() && !body["metadata"].is_null())
    return send_error(res, 400, "'metadata' must be an object", "metadata");
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
  // The checks `blend batch` makes too (api/batch_lines.h), against this batch's endpoint.
  BatchLineContext context;
  context.tokenizer = &engine.tokenizer();
  context.chat_template = chat_template ? &*chat_template : nullptr;
  context.max_sequence_tokens = max_sequence_tokens;
  context.max_prompt_bytes = max_prompt_bytes_;
  context.model = model_name;
  context.request_class = RequestClass::kBestEffort;
  if (job->batch.contains("endpoint") && job->batch["endpoint"].is_string())
    context.endpoint = parse_endpoint(job->batch["endpoint"].get<std::string>());
  PreparedBatchLine prepared = prepare_batch_line(line, context);
  try {
    if (prepared.error) throw *prepared.error;
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
    auto on_done = [this, job, state, request = prepared.api, created,
                    id = line.custom_id](GenerationResult&& r) {
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
    state->seq = engine.submit(std::move(prepared.generation), on_done, on_token);
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

}  // namespace blend
