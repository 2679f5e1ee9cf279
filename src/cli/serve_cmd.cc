// blend serve — the OpenAI-compatible HTTP server (server/server.h).
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "server/server.h"
#include "server/version.h"

namespace blend::cli {
namespace {

Server* g_server = nullptr;

void on_signal(int) {
  // httplib's stop() only flips a flag and shuts the listening socket down.
  if (g_server) g_server->stop();
}

void run_serve(const ServerOptions& options) {
  Server server(options);
  g_server = &server;
  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);
  std::fprintf(stderr, "blend serve: listening on http://%s:%d\n", options.host.c_str(),
               server.port());
  server.run();
  g_server = nullptr;
}

// --chat-template as vLLM takes it: a file's path, or the template's text itself.
void set_chat_template(const std::string& value, ServerOptions& o) {
  if (value.empty()) return;
  std::error_code error;
  if (std::filesystem::is_regular_file(value, error)) {
    o.chat_template = value;
  } else if (value.find("{{") != std::string::npos || value.find("{%") != std::string::npos) {
    o.chat_template_text = value;
  } else {
    throw CLI::ValidationError("--chat-template",
                               "'" + value + "' is neither a file nor a Jinja template");
  }
}

}  // namespace

void register_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServerOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", o->model, "Model folder or GGUF file (the first model, with --zoo)")
      ->transform(model_source_transform());
  auto positional = std::make_shared<std::filesystem::path>();
  cmd->add_option("MODEL", *positional, "The model folder, as vLLM's `serve MODEL` (or --model)");
  cmd->add_option("--zoo", o->zoo,
                  "Serve every model folder in this folder too, in one engine: requests pick "
                  "one by folder name (fine-tunes of one architecture and tokenizer)");
  cmd->add_option("--lora-modules", o->lora_modules,
                  "LoRA adapters on --model, as vLLM: NAME=DIR ... (requests pick them by NAME)");
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port (0 = any free port); a port in use is refused")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* and /metrics");
  cmd->add_flag("--metrics-public", o->metrics_public,
                "Serve /metrics without the API key (for a Prometheus scraper without one)");
  cmd->add_option("--metrics-prefix", o->metrics_prefix,
                  "Names on /metrics: blend:..., vllm:... (as vLLM's dashboards select them) or "
                  "both; every sample carries model_name")
      ->check(CLI::IsMember({"blend", "vllm", "both"}))
      ->capture_default_str();
  cmd->add_option("--data-dir", o->data_dir, "Where Batch API files and results are kept")
      ->capture_default_str();
  auto names = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--served-model-name", *names,
                  "Model id clients use (default: the model folder's name); several names: the "
                  "first is the one answers carry, requests may give any (as vLLM)");
  cmd->add_option("--max-body-bytes", o->max_body_bytes,
                  "Largest request body accepted (413 past it, chunked bodies included)")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes-in-flight", o->max_body_bytes_in_flight,
                  "Request bodies held at once by all requests (503 + Retry-After past it; "
                  "parsing costs a few times a body's size)")
      ->capture_default_str();
  cmd->add_option("--http-head-timeout", o->http_head_timeout_s,
                  "Seconds a request's line and headers may take to arrive (408 past it)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--http-request-timeout", o->http_request_timeout_s,
                  "Seconds a whole request, body included, may take to arrive (408 past it)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->set_version_flag("--version", kBlendVersion, "Print blend's version and exit");
  cmd->add_option("--max-model-len", o->engine.max_model_len,
                  "Longest prompt + output of a request (default: the model's context; more is "
                  "refused)")
      ->check(CLI::PositiveNumber);
  auto chat_template = std::make_shared<std::string>();
  cmd->add_option("--chat-template", *chat_template,
                  "A Jinja chat template instead of the model folder's: a file, or the "
                  "template itself (as vLLM)");
  auto dtype = std::make_shared<std::string>("auto");
  cmd->add_option("--dtype", *dtype,
                  "Compute dtype: auto (the checkpoint's: bf16 -> bf16, f16/f32 -> f32); bf16 "
                  "(bfloat16) or f32 (float32, float) are checked against what the backend "
                  "computes for the checkpoint; float16/half are refused (no f16 compute)")
      ->transform(CLI::Transformer(std::map<std::string, std::string>{
          {"bfloat16", "bf16"}, {"float32", "f32"}, {"float", "f32"}}))
      ->check(CLI::IsMember({"auto", "bf16", "f32", "float16", "half", "f16"}))
      ->capture_default_str();
  cmd->add_option("--threads-http", o->http_threads,
                  "Requests served at once (a stream holds a thread until it ends); more wait "
                  "in a queue; connections between requests hold none")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd->add_option("--max-connections", o->max_connections,
                  "Connections open at once, idle ones included (503 and closed past it; "
                  "0 = the open-file limit less 256)")
      ->capture_default_str();
  cmd->add_option("--max-connections-per-ip", o->max_connections_per_ip,
                  "Connections open at once from one client address (503 past it; 0 = no "
                  "bound)")
      ->capture_default_str();
  cmd->add_flag("--quiet", o->quiet, "No access log and no throughput lines on stderr");
  cmd->add_flag("--disable-log-requests{false},--enable-log-requests{true}", o->log_requests,
                "No access log line per request (vLLM's flag; throughput lines stay)");
  cmd->add_option("--stats-interval", o->stats_interval,
                  "Seconds between throughput lines while serving (0 = none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  add_engine_flags(cmd, o->engine);
  auto adaptive = std::make_shared<AdaptiveFlags>();
  add_adaptive_flags(cmd, *adaptive, o->engine);
  o->engine.scheduler.policy = SchedulerPolicy::kHybrid;
  cmd->add_option("--scheduler", o->engine.scheduler.policy,
                  "Scheduling of real-time and best-effort requests: hybrid (BROS), fcfs, "
                  "round-robin, prefill-first (vLLM before chunked prefill) (default hybrid)")
      ->transform(CLI::CheckedTransformer(scheduler_policy_names(), CLI::ignore_case));
  refuse_policy_flag(cmd, ", and the Batch API's plan order with --batch-policy");
  add_hybrid_flags(cmd, o->engine.scheduler.hybrid);
  auto profile = std::make_shared<std::string>();
  cmd->add_option(
      "--profile", *profile,
      "A `blend profile` file: its iteration model drives --scheduler hybrid (without one "
      "the model is fitted from the steps served), its hardware fit the batch "
      "planner's cost model (without one: a built-in CPU estimate)");
  cmd->add_option("--ttft-slo", o->engine.ttft_slo,
                  "Default time-to-first-token target of real-time requests, seconds (0.4)");
  cmd->add_option("--tpot-slo", o->engine.tpot_slo,
                  "Default time-per-output-token target of real-time requests, seconds (0.2)");
  cmd->add_option("--batch-policy", o->batch_policy,
                  "Order of Batch API lines: blend (default: each job planned as `blend batch "
                  "--policy blend` plans it, its lines handed to the engine in the plan's order "
                  "and pace), blend@alg3 (the same plan admitted as Alg. 3 publishes it), dfs, "
                  "random, or fcfs (every line queued at once in file order, no planner); "
                  "real-time requests keep their priority either way")
      ->check(CLI::IsMember({"blend", "blend@alg3", "dfs", "random", "fcfs"}))
      ->capture_default_str();
  cmd->add_option("--batch-sample-fraction", o->batch_sample_fraction,
                  "With a planned --batch-policy: this fraction of a job's lines without "
                  "ignore_eos runs first and their output lengths estimate the others' "
                  "(BlendServe §5.1)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--batch-assume-output", o->batch_assumed_output,
                  "Output length the planner assumes for lines without ignore_eos before the "
                  "sampling pass")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto layout = std::make_shared<std::string>("auto");
  cmd->add_option("--kv-layout", *layout,
                  "KV pages shared by a real-time and a best-effort request from opposite ends "
                  "(BROS §5): bidirectional, unidirectional, or auto (bidirectional with "
                  "--scheduler hybrid, as BROS; unidirectional for its baselines)")
      ->check(CLI::IsMember({"auto", "bidirectional", "unidirectional"}))
      ->capture_default_str();
  cmd->callback([o, profile, layout, dtype, adaptive, positional, names, chat_template] {
    if (!positional->empty()) {
      if (!o->model.empty())
        throw CLI::ValidationError("MODEL", "give the model once: MODEL or --model");
      o->model = *positional;
    }
    if (!names->empty()) {
      o->served_model_name = names->front();
      o->served_model_aliases.assign(names->begin() + 1, names->end());
    }
    set_chat_template(*chat_template, *o);
    if (*dtype == "float16" || *dtype == "half" || *dtype == "f16")
      throw CLI::ValidationError("--dtype",
                                 "blend computes in bf16 or f32, not float16: use "
                                 "--dtype auto (a float16 checkpoint runs in f32), "
                                 "bfloat16 or float32");
    o->dtype = *dtype;
    check_adaptive_flags(*adaptive, o->engine);
    o->adaptive_blocks = adaptive->blocks;
    o->adaptive_threshold = adaptive->threshold;
    if (!profile->empty()) {
      o->engine.scheduler.iteration_cost = read_iteration_model(*profile);
      o->batch_hardware = *profile;  // the planner's view of this machine too
    }
    o->engine.scheduler.fit_iteration_cost = profile->empty();
    o->engine.scheduler.bidirectional_kv =
        bidirectional_kv_for(*layout, o->engine.scheduler.policy);
    run_serve(*o);
  });
}

}  // namespace blend::cli
