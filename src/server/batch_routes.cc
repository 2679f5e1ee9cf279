// The Batch API: /v1/files (uploads, results) and /v1/batches (create, poll, cancel). Batch lines
// run as best-effort requests on the engine thread; results are appended as lines finish, so a
// restarted server resumes a batch where it stopped. A job's lines reach the engine in the order
// and pace of a BlendServe plan of the job (offline/planned_feed.h, the runner `blend batch`
// uses, driven before every step by admit_batch_lines), or all at once in file order with
// --batch-policy fcfs.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "api/json_limits.h"
#include "api/utf8.h"
#include "server/server_impl.h"

namespace blend {

using nlohmann::json;
using server_internal::BatchJob;
using server_internal::Clock;
using server_internal::Pending;
using server_internal::seconds_between;

namespace {

// Longer names are a way to grow every file listing; filesystems allow 255 bytes.
constexpr size_t kMaxFilenameBytes = 255;

// Characters of UTF-8 text (JSON strings are valid UTF-8): bytes that start a code point.
size_t utf8_characters(const std::string& s) {
  return static_cast<size_t>(std::count_if(
      s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// OpenAI's bounds on a batch's metadata: at most 16 pairs, keys of at most 64 characters,
// string values of at most 512 (it is stored and returned by every listing). Why it is refused,
// or nullopt.
std::optional<std::string> check_batch_metadata(const json& metadata) {
  constexpr size_t kMaxPairs = 16, kMaxKey = 64, kMaxValue = 512;
  if (metadata.is_null()) return std::nullopt;
  if (metadata.size() > kMaxPairs)
    return "'metadata' has " + std::to_string(metadata.size()) + " pairs; at most " +
           std::to_string(kMaxPairs) + " are allowed";
  for (const auto& [key, value] : metadata.items()) {
    if (utf8_characters(key) > kMaxKey)
      return "a 'metadata' key is longer than " + std::to_string(kMaxKey) + " characters";
    if (!value.is_string()) return "'metadata' values must be strings ('" + key + "' is not)";
    if (utf8_characters(value.get_ref<const std::string&>()) > kMaxValue)
      return "'metadata." + key + "' is longer than " + std::to_string(kMaxValue) + " characters";
  }
  return std::nullopt;
}

}  // namespace

void Server::Impl::batch_routes() {
  route("POST", "/v1/files",
        [this](const httplib::Request& req, httplib::Response& res) { files_create(req, res); });
  route("GET", R"(/v1/files/([A-Za-z0-9_-]+))",
        [this](const httplib::Request& req, httplib::Response& res) {
          auto f = store->file(req.matches[1]);
          if (!f) return send_error(res, 404, "no such file", "file_id");
          res.set_content(f->dump(), "application/json");
        });
  route("GET", R"(/v1/files/([A-Za-z0-9_-]+)/content)",
        [this](const httplib::Request& req, httplib::Response& res) {
          if (!store->file(req.matches[1])) return send_error(res, 404, "no such file", "file_id");
          std::ifstream in(store->file_path(req.matches[1]), std::ios::binary);
          std::ostringstream ss;
          ss << in.rdbuf();
          res.set_content(ss.str(), "application/octet-stream");
        });
  route("GET", "/v1/files",
        [this](const httplib::Request& req, httplib::Response& res) { files_list(req, res); });
  route("DELETE", R"(/v1/files/([A-Za-z0-9_-]+))",
        [this](const httplib::Request& req, httplib::Response& res) { file_delete(req, res); });
  route("POST", "/v1/batches",
        [this](const httplib::Request& req, httplib::Response& res) { batches_create(req, res); });
  route("GET", "/v1/batches",
        [this](const httplib::Request& req, httplib::Response& res) { batches_list(req, res); });
  route("GET", R"(/v1/batches/([A-Za-z0-9_-]+))",
        [this](const httplib::Request& req, httplib::Response& res) { batch_get(req, res); });
  route("POST", R"(/v1/batches/([A-Za-z0-9_-]+)/cancel)",
        [this](const httplib::Request& req, httplib::Response& res) { batch_cancel(req, res); });
}

void Server::Impl::files_create(const httplib::Request& req, httplib::Response& res) {
  if (!req.is_multipart_form_data() || !req.has_file("file"))
    return send_error(res, 400, "expected a multipart/form-data upload with a 'file' part", "file");
  const std::string purpose = req.has_file("purpose") ? req.get_file_value("purpose").content : "";
  if (purpose != "batch")
    return send_error(res, 400, "only purpose 'batch' is supported", "purpose");
  const httplib::MultipartFormData file = req.get_file_value("file");
  // The name is stored in the file object and returned by every listing: it must be JSON text.
  try {
    check_utf8(file.filename, "file");
  } catch (const ApiError&) {
    return send_error(res, 400, "the file name is not valid UTF-8", "file");
  }
  if (file.filename.size() > kMaxFilenameBytes)
    return send_error(
        res, 400, "the file name is longer than " + std::to_string(kMaxFilenameBytes) + " bytes",
        "file");
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
  // OpenAI offers one window; another would be a promise we do not keep.
  if (body.contains("completion_window") && body["completion_window"] != "24h")
    return send_error(res, 400, "'completion_window' must be '24h'", "completion_window");
  if (const std::optional<std::string> bad = check_batch_metadata(body.value("metadata", json())))
    return send_error(res, 400, *bad, "metadata");
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
  // start_job counted the lines (request_counts.total) or failed the batch: answer with that.
  const std::string id = batch["id"];
  {
    std::lock_guard lock(batches_mu);
    if (auto it = jobs.find(id); it != jobs.end()) batch = it->second->batch;
  }
  if (batch["request_counts"]["total"] == 0)
    if (auto saved = store->batch(id)) batch = *saved;
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

namespace {

// OpenAI's cursor pages: newest first, `limit` items after the one whose id is `after`.
// Ties on created_at (whole seconds) are ordered by id, so a cursor is stable.
json page(std::vector<json> items, const httplib::Request& req, int64_t default_limit,
          int64_t max_limit) {
  int64_t limit = default_limit;
  if (req.has_param("limit")) {
    const std::string v = req.get_param_value("limit");
    char* end = nullptr;
    limit = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || limit < 1 || limit > max_limit)
      throw ApiError(400, "limit must be an integer in [1, " + std::to_string(max_limit) + "]",
                     "limit");
  }
  const bool ascending = req.has_param("order") && req.get_param_value("order") == "asc";
  if (req.has_param("order") && !ascending && req.get_param_value("order") != "desc")
    throw ApiError(400, "order must be 'asc' or 'desc'", "order");
  std::sort(items.begin(), items.end(), [&](const json& a, const json& b) {
    const auto ka = std::make_pair(a.value("created_at", int64_t{0}), a.value("id", ""));
    const auto kb = std::make_pair(b.value("created_at", int64_t{0}), b.value("id", ""));
    return ascending ? ka < kb : ka > kb;
  });
  size_t first = 0;
  if (req.has_param("after")) {
    const std::string after = req.get_param_value("after");
    auto it = std::find_if(items.begin(), items.end(),
                           [&](const json& j) { return j.value("id", "") == after; });
    if (it == items.end()) throw ApiError(404, "no such object: " + after, "after");
    first = static_cast<size_t>(it - items.begin()) + 1;
  }
  json data = json::array();
  for (size_t i = first; i < items.size() && static_cast<int64_t>(data.size()) < limit; ++i)
    data.push_back(std::move(items[i]));
  const bool has_more = first + data.size() < items.size();
  json out = {{"object", "list"}, {"data", data}, {"has_more", has_more}};
  out["first_id"] = data.empty() ? json(nullptr) : data.front()["id"];
  out["last_id"] = data.empty() ? json(nullptr) : data.back()["id"];
  return out;
}

}  // namespace

void Server::Impl::files_list(const httplib::Request& req, httplib::Response& res) {
  std::vector<json> files = store->files();
  if (req.has_param("purpose")) {
    const std::string purpose = req.get_param_value("purpose");
    std::erase_if(files, [&](const json& f) { return f.value("purpose", "") != purpose; });
  }
  try {
    res.set_content(page(std::move(files), req, 10000, 10000).dump(), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

void Server::Impl::file_delete(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  if (!store->file(id)) return send_error(res, 404, "no such file", "file_id");
  {
    // A running batch still reads its input (and reads it again if the server restarts).
    std::lock_guard lock(batches_mu);
    for (const auto& [batch_id, job] : jobs) {
      const std::string status = job->batch.value("status", "");
      if (job->batch.value("input_file_id", "") == id &&
          (status == "in_progress" || status == "validating" || status == "cancelling"))
        return send_error(
            res, 400, "file " + id + " is the input of batch " + batch_id + ", which is " + status,
            "file_id");
    }
  }
  if (!store->delete_file(id)) return send_error(res, 404, "no such file", "file_id");
  res.set_content(json{{"id", id}, {"object", "file"}, {"deleted", true}}.dump(),
                  "application/json");
}

void Server::Impl::batches_list(const httplib::Request& req, httplib::Response& res) {
  std::vector<json> batches = store->batches();
  {
    // Running batches: their live counts, not the last saved ones.
    std::lock_guard lock(batches_mu);
    for (json& b : batches)
      if (auto it = jobs.find(b.value("id", "")); it != jobs.end()) b = it->second->batch;
  }
  try {
    res.set_content(page(std::move(batches), req, 20, 100).dump(), "application/json");
  } catch (const ApiError& e) {
    send_error(res, e);
  }
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
  job->cancel_requested = true;
  loop->post([this, job](Engine& engine) {
    job->cancelling = true;
    stop_job(job, engine);
  });
  res.set_content(snapshot.dump(), "application/json");
}

// Counts the results already written (a resumed batch) and hands the other lines to the engine
// thread as BE requests: all at once (fcfs), or planned, for admit_batch_lines to admit.
void Server::Impl::start_job(json batch, bool resume) {
  auto job = std::make_shared<BatchJob>();
  const std::string id = batch["id"];
  job->output_id = store->output_id(id);
  job->error_id = store->error_id(id);
  std::vector<BatchInputLine> lines;
  try {
    lines = read_batch_input(store->file_path(batch["input_file_id"]));
    job->writer = std::make_unique<BatchResultWriter>(store->file_path(job->output_id));
    job->error_writer = std::make_unique<BatchResultWriter>(store->file_path(job->error_id));
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
    // Both files: batches run before error files existed have their failures in the output.
    for (const std::string& file : {job->output_id, job->error_id}) {
      std::ifstream in(store->file_path(file));
      std::string line;
      while (std::getline(in, line)) {
        json r = json::parse(line, nullptr, false);
        if (!r.is_object()) continue;
        const bool ok = r.contains("response") && r["response"].is_object() &&
                        r["response"].value("status_code", 0) == 200;
        ++(ok ? completed : failed);
      }
    }
  }
  batch["request_counts"] = {
      {"total", static_cast<int64_t>(lines.size())}, {"completed", completed}, {"failed", failed}};
  std::vector<BatchInputLine> todo;
  for (BatchInputLine& l : lines)
    if (!job->writer->done_ids().count(l.custom_id) &&
        !job->error_writer->done_ids().count(l.custom_id))
      todo.push_back(std::move(l));
  job->remaining = static_cast<int64_t>(todo.size());
  job->batch = batch;
  // A batch cancelled just before a restart only needs its final status.
  job->cancelling = batch["status"] == "cancelling";
  if (job->cancelling) todo.clear();
  // A planned job is tokenized and planned here, on the caller's thread, not on the engine's.
  std::vector<PreparedBatchLine> errors;
  const bool planned = options.batch_policy != "fcfs";
  if (planned) plan_job(*job, todo, errors);
  {
    std::lock_guard lock(batches_mu);
    jobs[id] = job;
  }
  if (planned) {
    loop->post([this, job, errors = std::move(errors)](Engine& engine) mutable {
      for (PreparedBatchLine& line : errors) submit_line(job, engine, std::move(line));
      if (job->admitting && !job->cancelling) admission.push_back(job);
      if (job->remaining == 0 || job->cancelling) finish_job(job);
    });
    return;
  }
  loop->post([this, job, todo = std::move(todo)](Engine& engine) {
    for (const BatchInputLine& line : todo)
      if (!run_line(job, engine, line)) break;
    if (job->remaining == 0 || job->cancelling) finish_job(job);
  });
}

BatchLineContext Server::Impl::line_context(const BatchJob& job) const {
  // The checks `blend batch` makes too (api/batch_file.h: prepare_batch_line), against this batch's
  // endpoint.
  BatchLineContext context;
  context.models = served;
  context.max_sequence_tokens = max_sequence_tokens;
  context.request_class = RequestClass::kBestEffort;
  if (job.batch.contains("endpoint") && job.batch["endpoint"].is_string())
    context.endpoint = parse_endpoint(job.batch["endpoint"].get<std::string>());
  // As a request's compile stops when its client leaves: the job outlives the context's uses.
  context.cancelled = [this, &job] { return stopping.load() || job.cancel_requested.load(); };
  return context;
}

void Server::Impl::plan_job(BatchJob& job, const std::vector<BatchInputLine>& todo,
                            std::vector<PreparedBatchLine>& errors) {
  // The engine's immutable parts (tokenizer, limits) may be read from any thread.
  const Engine& engine = loop->engine();
  const BatchLineContext context = line_context(job);
  std::vector<OfflineRequest> requests;
  for (const BatchInputLine& line : todo) {
    PreparedBatchLine prepared = prepare_batch_line(line, context);
    // Stopping (or cancelled: only its status remains to write): this line and the rest stay
    // undone, as a restart finds them (its error, if the compile was cut short, is not its own).
    if (context.cancelled()) return;
    if (!prepared.error) {
      try {
        engine.check_request(prepared.generation);  // what submit() refuses, refused now
      } catch (const Error& e) {
        prepared.error = ApiError(400, e.what());
      }
    }
    if (prepared.error) {
      errors.push_back(std::move(prepared));
      continue;
    }
    // As `blend batch` plans a line (offline/planned_run.h: line_samples).
    for (OfflineRequest& q :
         line_samples(prepared.generation, prepared.api.n, options.batch_assumed_output))
      requests.push_back(std::move(q));
    prepared.generation = {};  // the samples hold it
    std::shared_ptr<LineAnswer> answer = line_answer(prepared);
    job.answers.emplace(answer->id, std::move(answer));
  }
  if (requests.empty()) return;
  job.feed = std::make_unique<PlannedFeed>(
      std::move(requests), *batch_cost, engine,
      PlannedFeed::Options{.policy = plan::parse_policy(options.batch_policy),
                           .kv_memory_bytes = batch_kv_bytes,
                           .max_step_tokens = batch_step_tokens,
                           .sampling = {.fraction = options.batch_sample_fraction, .seed = 1}});
  job.admitting = true;
}

bool Server::Impl::admit_batch_lines(Engine& engine) {
  // What ended in the last step, then the oldest job's admission: one job's stream at a time,
  // as BlendServe plans one batch (two would each count the whole KV memory as theirs).
  for (const auto& job : admission)
    if (job->feed) job->feed->report_ended();
  std::optional<int32_t> budget;
  while (!admission.empty()) {
    const std::shared_ptr<BatchJob> job = admission.front();
    if (job->cancelling || !job->admitting) {
      admission.pop_front();
      continue;
    }
    PlannedFeed& feed = *job->feed;
    const PlannedFeed::Submit submit = [&](int32_t, GenerationRequest sample,
                                           Engine::TokenCallback on_token,
                                           PlannedFeed::Ended ended) {
      const auto it = job->answers.find(sample.id);
      const std::shared_ptr<LineAnswer> answer = it->second;
      if (++answer->submitted == answer->request.n) job->answers.erase(it);
      submit_sample(job, engine, answer, std::move(sample), std::move(on_token), std::move(ended));
    };
    if (feed.admit(submit) == 0 && feed.stalled()) {
      // Nothing of the job runs and its stream admits nothing: it would wait forever (the
      // streams never do this). Hand the rest out rather than hang the job.
      std::string id;
      {
        std::lock_guard lock(batches_mu);
        id = job->batch.value("id", "");
      }
      std::fprintf(stderr,
                   "blend serve: batch %s: the planner admits nothing while none of its lines "
                   "runs; queueing the rest at once\n",
                   id.c_str());
      feed.admit(submit, /*all=*/true);
    }
    if (!feed.exhausted()) {
      // The plan paces the engine's steps as `blend batch` does, while no real-time request
      // needs the engine's own budget.
      if (metrics.in_engine(RequestClass::kRealtime) == 0) budget = feed.step_token_budget();
      break;
    }
    // Every sample is handed out: the next job starts (this one's feed stays for the samples
    // in flight, which report to it).
    job->admitting = false;
    admission.pop_front();
  }
  engine.set_max_batch_tokens(budget.value_or(batch_step_tokens));
  int64_t pending = 0;
  for (const auto& job : admission)
    if (job->admitting) pending += static_cast<int64_t>(job->feed->waiting());
  metrics.set_batch_lines_pending(pending);
  return !admission.empty();
}

bool Server::Impl::run_line(const std::shared_ptr<BatchJob>& job, Engine& engine,
                            const BatchInputLine& line) {
  const BatchLineContext context = line_context(*job);
  PreparedBatchLine prepared = prepare_batch_line(line, context);
  if (context.cancelled()) return false;  // as in plan_job: left undone, not failed
  submit_line(job, engine, std::move(prepared));
  return true;
}

void Server::Impl::submit_line(const std::shared_ptr<BatchJob>& job, Engine& engine,
                               PreparedBatchLine prepared) {
  if (prepared.error) return fail_line(job, prepared.custom_id, *prepared.error);
  GenerationRequest generation = std::move(prepared.generation);
  const std::shared_ptr<LineAnswer> answer = line_answer(prepared);
  const int32_t n = answer->request.n;
  for (int32_t index = 0; index < n && !answer->written; ++index) {
    GenerationRequest sample = index + 1 < n ? generation : std::move(generation);
    sample.index = index;
    ++answer->submitted;
    submit_sample(job, engine, answer, std::move(sample));
  }
}

std::shared_ptr<Server::Impl::LineAnswer> Server::Impl::line_answer(
    PreparedBatchLine& prepared) const {
  auto answer = std::make_shared<LineAnswer>();
  answer->id = prepared.custom_id;
  answer->request = std::move(prepared.api);
  answer->created = unix_seconds();
  return answer;
}

void Server::Impl::submit_sample(const std::shared_ptr<BatchJob>& job, Engine& engine,
                                 const std::shared_ptr<LineAnswer>& answer,
                                 GenerationRequest sample, Engine::TokenCallback progress,
                                 PlannedFeed::Ended ended) {
  if (answer->written) {  // an earlier sample could not run: the line has its error already
    if (ended) ended(std::nullopt);
    return;
  }
  metrics.on_queued(RequestClass::kBestEffort);
  auto state = std::make_shared<Pending>();
  state->cls = RequestClass::kBestEffort;
  auto on_token = [this, state, progress = std::move(progress)](const SampledToken& t,
                                                                std::string_view text) {
    if (progress) progress(t, text);
    if (state->had_first_token) return;
    state->had_first_token = true;
    state->first_token = Clock::now();
    metrics.on_first_token(state->cls, seconds_between(state->arrival, state->first_token));
  };
  auto on_done = [this, job, state, answer, ended](GenerationResult&& r) {
    const auto now = Clock::now();
    const int64_t tokens = static_cast<int64_t>(r.tokens.size());
    metrics.on_finished(
        state->cls, state->had_first_token, finish_reason_name(r.finish), r.prompt_tokens, tokens,
        seconds_between(state->arrival, now),
        tokens > 1 ? seconds_between(state->first_token, now) / static_cast<double>(tokens - 1)
                   : 0.0);
    job->in_flight.erase(state->seq);
    state->done = true;
    if (ended) ended(static_cast<double>(tokens));
    if (answer->written) return;
    answer->results.push_back(std::move(r));
    const ApiRequest& request = answer->request;
    if (static_cast<int32_t>(answer->results.size()) < request.n) return;
    answer->written = true;
    const char* prefix = request.endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-";
    // A sample that failed while generating fails the line (the error file holds it).
    const auto failed =
        std::find_if(answer->results.begin(), answer->results.end(),
                     [](const GenerationResult& s) { return s.finish == FinishReason::kError; });
    const bool line_failed = failed != answer->results.end();
    const bool written = write_result(job, [&] {
      if (line_failed) {
        const ApiError e = generation_error(*failed);
        job->error_writer->write_error(answer->id, e.status(), e.body());
      } else {
        job->writer->write_success(
            answer->id,
            make_response(request, answer->results, make_id(prefix), model_name(request.model_id),
                          answer->created, tokenizer_of(request.model_id)));
      }
    });
    answer->results = {};
    if (!written) return;  // the job has failed; stop_job finishes it
    {
      std::lock_guard lock(batches_mu);
      auto& counts = job->batch["request_counts"];
      const char* count = line_failed ? "failed" : "completed";
      counts[count] = counts[count].get<int64_t>() + 1;
    }
    line_done(job);
  };
  try {
    state->seq = engine.submit(std::move(sample), on_done, on_token);
  } catch (const Error& e) {
    metrics.on_cancelled(state->cls, false);
    if (ended) ended(std::nullopt);
    answer->written = true;
    return fail_line(job, answer->id, e);
  }
  // A request with max_tokens 0 finished inside submit(); only the others are in flight.
  if (!state->done) job->in_flight.emplace(state->seq, state);
  if (answer->submitted == answer->request.n && options.on_batch_line_submitted)
    options.on_batch_line_submitted(answer->id);
}

void Server::Impl::fail_line(const std::shared_ptr<BatchJob>& job, const std::string& id,
                             const Error& error) {
  const ApiError* api = dynamic_cast<const ApiError*>(&error);
  const int status = api ? api->status() : 400;
  const bool written = write_result(job, [&] {
    job->error_writer->write_error(id, status,
                                   api ? api->body() : ApiError(400, error.what()).body());
  });
  if (!written) return;
  {
    std::lock_guard lock(batches_mu);
    auto& counts = job->batch["request_counts"];
    counts["failed"] = counts["failed"].get<int64_t>() + 1;
  }
  line_done(job);
}

void Server::Impl::line_done(const std::shared_ptr<BatchJob>& job) {
  if (--job->remaining == 0) finish_job(job);
}

bool Server::Impl::write_result(const std::shared_ptr<BatchJob>& job,
                                const std::function<void()>& write) {
  if (job->write_failure) return false;  // a line that ends after the failure is dropped
  try {
    write();
    return true;
  } catch (const Error& e) {
    fail_job(job, e.what());
    return false;
  }
}

// A result that cannot be written cannot be kept: rather than compute the rest of the batch
// into the void (or stop the server), the batch fails at once with the reason, as OpenAI's
// batches do. What was written stays: whole lines only (BatchResultWriter cuts a torn one),
// published as the output file (issue 26: disk full leaves a clear error, no corrupt file).
void Server::Impl::fail_job(const std::shared_ptr<BatchJob>& job, const std::string& reason) {
  if (job->write_failure) return;
  job->write_failure = reason;
  std::fprintf(stderr, "blend serve: batch %s failed: %s\n", job->batch.value("id", "").c_str(),
               reason.c_str());
  // This may run inside an engine step (a result callback): cancel between steps instead.
  loop->post([this, job](Engine& engine) { stop_job(job, engine); });
}

void Server::Impl::stop_job(const std::shared_ptr<BatchJob>& job, Engine& engine) {
  for (const auto& [seq, state] : job->in_flight)
    if (engine.cancel(seq)) metrics.on_cancelled(state->cls, state->had_first_token);
  job->in_flight.clear();
  // Lines the planner has not handed out yet never reach the engine.
  std::erase(admission, job);
  job->admitting = false;
  job->answers.clear();
  finish_job(job);
}
// Engine thread: publishes the results file and the final status.
void Server::Impl::finish_job(const std::shared_ptr<BatchJob>& job) {
  std::string id;
  {
    std::lock_guard lock(batches_mu);
    const json& b = job->batch;
    if (b["status"] == "completed" || b["status"] == "cancelled" || b["status"] == "failed") return;
    id = b["id"];
  }
  // The results are all written: publish their files before the status that points at them.
  // On a full disk even that may fail; the batch then fails with the reason, and its status is
  // still served from memory (jobs) if it cannot be saved either.
  std::optional<std::string> failure = job->write_failure;
  const bool any_failed = !job->error_writer->done_ids().empty();
  bool published = true;
  try {
    store->register_file(job->output_id, id + "_output.jsonl", "batch_output");
    if (any_failed) store->register_file(job->error_id, id + "_errors.jsonl", "batch_output");
  } catch (const Error& e) {
    published = false;
    if (!failure) failure = e.what();
  }
  json b;
  {
    std::lock_guard lock(batches_mu);
    b = job->batch;
  }
  const int64_t now = unix_seconds();
  if (failure) {
    b["status"] = "failed";
    b["failed_at"] = now;
    b["errors"] = {{"object", "list"},
                   {"data", json::array({{{"code", "write_failed"}, {"message", *failure}}})}};
  } else {
    const bool cancelled = job->cancelling || b["status"] == "cancelling";
    b["status"] = cancelled ? "cancelled" : "completed";
    b[cancelled ? "cancelled_at" : "completed_at"] = now;
  }
  b["finalizing_at"] = now;
  if (published) {
    b["output_file_id"] = job->output_id;
    if (any_failed) b["error_file_id"] = job->error_id;
  }
  // Saved before anyone is shown the final status: a client told "failed" must not see the
  // batch resume after a restart (save_batch keeps a failed status even on a full disk). This
  // thread is the only one that changes a running job's counts, so none is lost meanwhile.
  try {
    store->save_batch(b);
  } catch (const Error& e) {
    std::fprintf(stderr, "blend serve: cannot save batch %s: %s\n", id.c_str(), e.what());
  }
  std::lock_guard lock(batches_mu);
  job->batch = std::move(b);
}

}  // namespace blend
