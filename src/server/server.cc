// Server set-up: the model, engine loop and Batch API store; the hooks every route shares (API
// key check, OpenAI error bodies for httplib's own statuses); start and stop. The routes live in
// *_routes.cc (see server_impl.h).
#include "server/server.h"

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "blocks/adaptive.h"
#include "core/regular_file.h"
#include "model/weights.h"
#include "model/zoo.h"
#include "server/server_impl.h"
#include "text/chat_template.h"

namespace blend {
namespace {

using nlohmann::json;

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
    case 405:
      return "invalid_request_error";
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

// bos_token / eos_token of tokenizer_config.json (a string or an AddedToken object), "" if none.
std::string special_token(const json& config, const char* name) {
  auto t = config.find(name);
  if (t == config.end()) return "";
  if (t->is_string()) return t->get<std::string>();
  if (t->is_object() && t->contains("content") && (*t)["content"].is_string())
    return (*t)["content"].get<std::string>();
  return "";
}

// The largest chat template or tokenizer_config.json read for --chat-template (as
// text/chat_template.cc reads a folder's).
constexpr uint64_t kMaxChatTemplateBytes = 64u << 20;

// --chat-template: its Jinja text (`what` says where it came from), with the model folder's
// special tokens.
ChatTemplate template_from_text(const std::string& text, const std::string& what,
                                const std::filesystem::path& model_dir) {
  json config = json::object();
  if (const auto path = model_dir / "tokenizer_config.json"; path_exists(path))
    config = json::parse(read_regular_file(path, kMaxChatTemplateBytes), nullptr,
                         /*allow_exceptions=*/false);
  if (!config.is_object()) config = json::object();
  try {
    return ChatTemplate(text, special_token(config, "bos_token"),
                        special_token(config, "eos_token"));
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
}

// glibc gives threads their own malloc arenas, up to 8 per core, and an arena's pages stay
// with it while any chunk on them lives: with a hundred connection threads, memory freed in
// one arena could not serve another's requests, and the 10-minute hostile soak grew RSS 14-22%
// after warm-up (distinct schemas' grammars cached beside short-lived request memory). Two
// arenas kept it flat (docs/BENCHMARKS.md, session 41); malloc_trim after each grammar compile
// did not. MALLOC_ARENA_MAX, when set, is the operator's choice and stays.
void limit_malloc_arenas() {
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) ::mallopt(M_ARENA_MAX, 2);
}

// The --chat-template of the options (a file or the text itself), or none.
std::optional<std::string> chat_template_override(const ServerOptions& o, std::string* what) {
  if (!o.chat_template_text.empty()) {
    *what = "the --chat-template text";
    return o.chat_template_text;
  }
  if (o.chat_template.empty()) return std::nullopt;
  *what = "the chat template " + o.chat_template.string();
  return read_regular_file(o.chat_template, kMaxChatTemplateBytes);
}

// The port and the HTTP limits, before anything loads.
void check_server_limits(const ServerOptions& o) {
  if (o.metrics_prefix != "blend" && o.metrics_prefix != "vllm" && o.metrics_prefix != "both")
    throw Error("--metrics-prefix must be blend, vllm or both");
  if (o.port < 0 || o.port > 65535)
    throw Error("--port must be between 0 (any free port) and 65535, not " +
                std::to_string(o.port));
  if (o.max_body_bytes_in_flight < o.max_body_bytes)
    throw Error("--max-body-bytes-in-flight (" + std::to_string(o.max_body_bytes_in_flight) +
                ") must be at least --max-body-bytes (" + std::to_string(o.max_body_bytes) + ")");
  if (!(o.http_head_timeout_s > 0) || !(o.http_request_timeout_s >= o.http_head_timeout_s))
    throw Error("--http-head-timeout must be positive and --http-request-timeout at least it");
  if (o.max_connections < 0 || o.max_connections_per_ip < 0)
    throw Error(
        "--max-connections and --max-connections-per-ip must be positive (or 0: the "
        "default)");
}

// --max-connections: as given, or 0 for the open-file limit less what the server's own files
// need (at least 16).
int max_connections(int asked) {
  if (asked > 0) return asked;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 65536;
  return static_cast<int>(std::clamp<rlim_t>(limit.rlim_cur, 16 + 256, 1 << 20) - 256);
}

// --dtype: auto, bf16 or f32; checked before the model loads.
void check_dtype_flag(const std::string& asked) {
  if (asked != "auto" && asked != "bf16" && asked != "f32")
    throw Error("--dtype must be auto, bf16 or f32");
}

// --dtype: what the engine's backend computes in must be what was asked for.
void check_compute_dtype(const std::string& asked, const Engine& engine, const std::string& backend,
                         const std::filesystem::path& model_dir) {
  if (asked == "auto") return;
  const DType compute = engine.compute_dtype();
  if (compute == (asked == "bf16" ? DType::kBF16 : DType::kF32)) return;
  const TensorStore weights = TensorStore::open_dir(model_dir);
  const DType checkpoint =
      check_tensors(ModelConfig::from_dir(model_dir), weights, QuantizedWeights::kAllowMatrices);
  throw Error(
      "--dtype " + asked + ": the " + backend + " backend computes this " +
      std::string(dtype_name(checkpoint)) + " checkpoint in " + std::string(dtype_name(compute)) +
      " on this CPU and cannot convert it; use --dtype auto or a checkpoint saved in " + asked);
}

}  // namespace

using server_internal::dump;

namespace server_internal {

RequestLog& request_log() {
  thread_local RequestLog log;
  return log;
}

}  // namespace server_internal

Server::Impl::Impl(const ServerOptions& o) : options(o) {
  check_server_limits(options);
  limit_malloc_arenas();  // before the connection and engine threads start
  const std::vector<ModelFolder> folders =
      model_folders(options.model, options.served_model_name, options.zoo, options.lora_modules);
  std::string template_source;
  const std::optional<std::string> template_text =
      chat_template_override(options, &template_source);
  for (const ModelFolder& folder : folders) {
    std::optional<ChatTemplate>& chat_template = chat_templates.emplace_back();
    if (template_text) {
      chat_template =
          template_from_text(*template_text, template_source, chat_template_dir(folder));
    } else {
      try {
        chat_template = ChatTemplate::from_dir(chat_template_dir(folder));
      } catch (const Error&) {
        // chat requests then fail with a clear message
      }
    }
  }
  check_dtype_flag(options.dtype);
  plan::parse_policy(options.batch_policy);  // an unknown name fails here, not per job
  if (!(options.batch_sample_fraction >= 0 && options.batch_sample_fraction <= 1))
    throw Error("the batch sample fraction must be in [0, 1]");
  auto engine = std::make_unique<Engine>(folders, options.engine);
  if (!options.adaptive_blocks.empty()) {
    const auto chains =
        enable_adaptive_serving(*engine, options.adaptive_blocks, options.adaptive_threshold);
    if (!options.quiet) std::fputs(describe_adaptive_chains(*engine, chains).c_str(), stderr);
  }
  for (ModelId m = 0; m < engine->num_models(); ++m) {
    const auto& chat_template = chat_templates[static_cast<size_t>(m)];
    const ModelFolder& folder = folders[static_cast<size_t>(m)];
    std::optional<std::string> parent;  // an adapter's base, when it is served too
    if (!folder.adapter.empty())
      for (const ModelFolder& other : folders)
        if (other.adapter.empty() && std::filesystem::equivalent(other.dir, folder.dir))
          parent = other.name;
    served.push_back(
        {.name = engine->model_name(m),
         .chat_template = chat_template ? &*chat_template : nullptr,
         .sampling_defaults = &engine->config(m).sampling_defaults,
         .root = (folder.adapter.empty() ? folder.dir : folder.adapter).string(),
         .parent = parent,
         .aliases = m == 0 ? options.served_model_aliases : std::vector<std::string>{}});
  }
  metrics.set_names(served[0].name, options.metrics_prefix == "both"
                                        ? std::vector<std::string>{"blend", "vllm"}
                                        : std::vector<std::string>{options.metrics_prefix});
  check_compute_dtype(options.dtype, *engine, options.engine.backend, folders[0].dir);
  max_sequence_tokens = engine->max_sequence_tokens();
  std::vector<ModelText> text;  // each model reads and writes text with its own tokenizer
  for (ModelId m = 0; m < engine->num_models(); ++m)
    text.push_back({&engine->tokenizer(m), engine->config(m).vocab_size,
                    engine->config(m).eos_token_ids, engine->tokenizer_owner(m)});
  grammar_compilers = attach_model_text(served, text, max_sequence_tokens);
  if (options.batch_policy != "fcfs") {
    batch_cost.emplace(ModelShape::from_config(engine->config(), served[0].name),
                       options.batch_hardware.empty() ? default_cpu_hardware()
                                                      : resolve_hardware(options.batch_hardware));
    batch_kv_bytes = static_cast<double>(engine->stats().kv_capacity_bytes);
    batch_step_tokens = engine->max_batch_tokens();
  }
  store = std::make_unique<BatchStore>(options.data_dir);
  engine->add_finish_observer([this, e = engine.get()](const RequestTimes& t) {
    metrics.on_request_times(t);
    metrics.on_engine_tokens(e->stats());
  });
  loop = std::make_unique<EngineLoop>(
      std::move(engine),
      [this](const Engine& e) {
        const EngineStats stats = e.stats();
        metrics.on_step(stats);
        stat_prompt_tokens = stats.prompt_tokens;
        stat_output_tokens = stats.output_tokens;
        stat_running = static_cast<int64_t>(e.num_running());
        stat_waiting = static_cast<int64_t>(e.num_waiting());
      },
      [this](Engine& e) { return admit_batch_lines(e); });
  // Streams hold a thread each for their whole life: allow many.
  http.set_worker_threads(static_cast<size_t>(options.http_threads));
  http.set_payload_max_length(options.max_body_bytes);
  http.set_connection_limits({.head_timeout_s = options.http_head_timeout_s,
                              .request_timeout_s = options.http_request_timeout_s,
                              .max_connections = max_connections(options.max_connections),
                              .max_connections_per_ip = options.max_connections_per_ip,
                              .body_budget = &body_budget,
                              .collect_body_bytes = options.max_body_bytes,
                              .route_reads_body =
                                  [this](const std::string& method, const std::string& path) {
                                    return route_reads_body(method, path);
                                  },
                              .on_own_answer = [this](int status) { metrics.on_error(status); }});
  // httplib's default sets SO_REUSEPORT: a second server on a busy port then bound it too and
  // the kernel spread requests over both. SO_REUSEADDR alone still refuses a port in use.
  http.set_socket_options([](socket_t fd) {
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  routes();
  if (options.port == 0) {
    port = http.bind_to_any_port(options.host);
  } else if (http.bind_to_port(options.host, options.port)) {
    port = options.port;
  } else {
    port = -1;
  }
  if (port < 0)
    throw Error("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                " (another server may be using the port)");
  if (!set_listen_backlog(http, options.listen_backlog))
    throw Error("cannot set the listen backlog of " + options.host + ":" + std::to_string(port));
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

void Server::Impl::route(const char* method, const std::string& pattern,
                         httplib::Server::Handler handler) {
  known_routes.emplace_back(std::regex(pattern), method);
  const std::string m = method;
  if (m == "GET") return void(http.Get(pattern, std::move(handler)));
  // httplib reads a body whole into memory before a plain handler runs (chunked ones with no
  // bound at all): a handler with a content reader reads it here, under the limits, first.
  auto with_body = [this, handler = std::move(handler)](const httplib::Request& req,
                                                        httplib::Response& res,
                                                        const httplib::ContentReader& reader) {
    // httplib hands handlers its own (non-const) Request as const: the body is ours to fill.
    auto& request = const_cast<httplib::Request&>(req);
    BodyReservation held(body_budget, take_body_reservation(req));
    if (auto refused = read_body(request, reader, options.max_body_bytes, held)) {
      HttpServer::close_connection_after_response(res);  // the rest of the body is unread
      if (refused->status == 503) res.set_header("Retry-After", "1");
      return send_error(res, refused->status, refused->message);
    }
    handler(req, res);
    // A stream's response outlives the handler and needs none of the body.
    std::string().swap(request.body);
    request.files.clear();
  };
  if (m == "POST")
    http.Post(pattern, std::move(with_body));
  else
    http.Delete(pattern, std::move(with_body));
}

bool Server::Impl::has_route(const std::string& method, const std::string& path,
                             std::string* allow) const {
  allow->clear();
  for (const auto& [pattern, m] : known_routes) {
    if (!std::regex_match(path, pattern)) continue;
    if (m == method) return true;
    if (allow->find(m) == std::string::npos) *allow += (allow->empty() ? "" : ", ") + m;
  }
  return false;
}

void Server::Impl::send_no_route(const httplib::Request& req, httplib::Response& res) {
  // httplib routes by method first: a known path asked with another method is a 404 to it.
  std::string allow;
  if (has_route(req.method, req.path, &allow) || allow.empty())
    return send_error(res, 404, default_message(404));
  res.set_header("Allow", allow);
  send_error(res, 405, req.method + " is not allowed on " + req.path + " (use " + allow + ")");
}

bool Server::Impl::route_reads_body(const std::string& method, const std::string& path) const {
  std::string allow;
  return (method == "POST" || method == "DELETE") && has_route(method, path, &allow);
}

bool Server::Impl::refuse_body_before_reading(const httplib::Request& req, httplib::Response& res) {
  const size_t announced = announced_body_bytes(req);
  if (announced == 0) return false;
  const bool reads_body = route_reads_body(req.method, req.path);
  if (reads_body && (announced <= options.max_body_bytes || announced == SIZE_MAX)) return false;
  // Whatever is answered, the body stays unread: the connection cannot carry another request.
  HttpServer::close_connection_after_response(res);
  if (reads_body) {
    send_error(res, 413,
               "the request body is larger than the server's limit of " +
                   std::to_string(options.max_body_bytes) + " bytes (--max-body-bytes)");
    return true;
  }
  // httplib reads the body of a route-less POST, PUT, PATCH or DELETE itself, without bound;
  // GET and the like are routed, the body left alone.
  if (req.method == "GET" || req.method == "HEAD" || req.method == "OPTIONS") return false;
  send_no_route(req, res);
  return true;
}

void Server::Impl::routes() {
  // Serving a client that hung up must not kill the process; nor may a file size limit
  // (ulimit -f) reached while writing results: that is an EFBIG error, handled as a full disk.
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGXFSZ, SIG_IGN);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    server_internal::request_log() = {server_internal::Clock::now(), -1, -1};
    // /tokenize and /detokenize cost CPU per byte sent: keyed like /v1/*.
    const bool needs_key = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" ||
                           req.path == "/detokenize" ||
                           (req.path == "/metrics" && !options.metrics_public);
    if (needs_key && !authorized(req)) {
      if (announced_body_bytes(req) > 0) HttpServer::close_connection_after_response(res);
      send_error(res, 401, "Incorrect API key provided.", "", "invalid_api_key");
      return httplib::Server::HandlerResponse::Handled;
    }
    return refuse_body_before_reading(req, res) ? httplib::Server::HandlerResponse::Handled
                                                : httplib::Server::HandlerResponse::Unhandled;
  });
  // Statuses httplib sets by itself (413 body too large, 404 unknown path, ...) get an OpenAI
  // error body too.
  if (!options.quiet && options.log_requests) {
    http.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      const auto& log = server_internal::request_log();
      const double seconds =
          server_internal::seconds_between(log.start, server_internal::Clock::now());
      std::string tokens;
      if (log.prompt_tokens >= 0)
        tokens = " prompt_tokens=" + std::to_string(log.prompt_tokens) +
                 " completion_tokens=" + std::to_string(log.completion_tokens);
      std::fprintf(stderr, "blend serve: %s %s %s %d%s %.3fs\n", req.remote_addr.c_str(),
                   req.method.c_str(), req.path.c_str(), res.status, tokens.c_str(), seconds);
    });
  }
  // A route that throws (say, storing an upload on a full disk) answers with the reason in
  // OpenAI's error shape: a 500 (server_error), or an ApiError's own status. Without this,
  // httplib answers a bare 500 and puts the reason in a header.
  http.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr thrown) {
        try {
          std::rethrow_exception(thrown);
        } catch (const ApiError& e) {
          send_error(res, e);
        } catch (const std::exception& e) {
          send_error(res, 500, e.what());
        } catch (...) {
          send_error(res, 500, "internal error");
        }
      });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) return send_no_route(req, res);
    send_error(res, res.status, default_message(res.status));
  });

  info_routes();
  completions_routes();
  responses_routes();
  batch_routes();
}

// Every stats_interval seconds with traffic: tokens/s in and out, requests running and waiting.
void Server::Impl::stats_loop() {
  int64_t prompt = stat_prompt_tokens, output = stat_output_tokens;
  auto last = server_internal::Clock::now();
  while (!stopping) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto now = server_internal::Clock::now();
    const double dt = server_internal::seconds_between(last, now);
    if (dt < options.stats_interval) continue;
    const int64_t p = stat_prompt_tokens, o = stat_output_tokens;
    const int64_t running = stat_running, waiting = stat_waiting;
    if (p != prompt || o != output || running > 0 || waiting > 0)
      std::fprintf(stderr,
                   "blend serve: %.1f prompt tokens/s, %.1f generated tokens/s, %lld running, "
                   "%lld waiting\n",
                   static_cast<double>(p - prompt) / dt, static_cast<double>(o - output) / dt,
                   static_cast<long long>(running), static_cast<long long>(waiting));
    prompt = p;
    output = o;
    last = now;
  }
}

Server::Server(const ServerOptions& options) : impl_(std::make_unique<Impl>(options)) {
  if (!options.quiet && options.stats_interval > 0)
    impl_->stats_thread = std::thread([this] { impl_->stats_loop(); });
}

Server::~Server() {
  stop();
  if (impl_->serve_thread.joinable()) impl_->serve_thread.join();
  if (impl_->stats_thread.joinable()) impl_->stats_thread.join();
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
  // Called from signal handlers too: no lock here (the stats loop polls `stopping`).
  impl_->stopping = true;
  impl_->http.stop();
}

}  // namespace blend
