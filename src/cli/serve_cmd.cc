// blend serve — the OpenAI-compatible HTTP server (server/server.h).
#include <signal.h>

#include <cstdio>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "server/server.h"

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

}  // namespace

void register_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServerOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", o->model, "Model folder")->required();
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port (0 = any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  cmd->add_option("--data-dir", o->data_dir, "Where Batch API files and results are kept")
      ->capture_default_str();
  cmd->add_option("--served-model-name", o->served_model_name,
                  "Model id clients use (default: the model folder's name)");
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body accepted")
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", o->engine.scheduler.max_batch_tokens,
                  "Token budget of one step (prefill chunks + decodes)");
  cmd->add_option("--max-running", o->engine.scheduler.max_running,
                  "Most sequences decoding at once");
  cmd->add_option("--kv-memory", o->engine.kv_memory_gb,
                  "KV cache size in GB (fractions allowed); default: a share of free memory");
  cmd->add_option("--page-size", o->engine.page_size, "Tokens per KV page");
  cmd->add_option("--threads", o->engine.threads, "Compute threads (default: all)");
  cmd->add_flag("--deterministic", o->engine.deterministic,
                "Same seed, same tokens, whatever the batch or order");
  cmd->add_option("--seed", o->engine.seed, "Seed for requests without one");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace blend::cli
