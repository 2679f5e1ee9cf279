// Soak test — issue 26's reliability run against a real `blend serve` over loopback: many
// streaming clients at once for minutes, some hanging up mid-stream, Batch API jobs beside
// them, the server's memory sampled every second. It answers: does the server drop or reset
// connections, lose or leak requests, or grow without bound under sustained load?
//
// What run_soak() promises:
//  - `clients` client threads, each a closed loop for `duration_seconds`: one streamed
//    POST /v1/completions (random token-id prompt of [prompt_min, prompt_max] tokens,
//    max_tokens in [output_min, output_max], ignore_eos, greedy), read to [DONE]; then the next.
//    With probability `hang_up_fraction` a request is abandoned after 1 to 4 SSE events (the
//    client closes the connection). No request starts after the window; those in flight get
//    `drain_timeout_seconds`.
//  - Best-effort load: Batch API jobs of `be_batch_requests` lines, one after another, through
//    load_generator's BE loop (run_load with no RT rate); 0 = none.
//  - `hostile_clients` threads of harness/hostile.h's attacks beside the load (0 = none), each
//    of which must get its clean answer.
//  - Every second, the resident set (VmRSS) of process `server_pid` (when > 0), read from
//    /proc.
//  - At the end: GET /health, and the server's own account from /metrics: real-time requests
//    finished and cancelled (deltas over the run), requests running, KV bytes held by requests.
// The report's `ok` holds when no request failed (no connection error or reset, no HTTP
// error, no stream that ended early), the server is healthy, nothing is left running, every
// request the clients completed or hung up is in the server's finished + cancelled counts,
// and the RSS of the last tenth of the run is within `rss_growth_limit` of the RSS after the
// first tenth (warm-up: KV pages and caches first touched).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/hostile.h"

namespace blend::online {

struct SoakOptions {
  std::string host = "127.0.0.1";  // loopback only
  int port = 8000;
  std::string model;  // the "model" field; empty = the first id of GET /v1/models
  int32_t clients = 500;
  double duration_seconds = 600;
  double hang_up_fraction = 0.1;
  int32_t prompt_min = 16, prompt_max = 128;
  int32_t output_min = 8, output_max = 64;
  int32_t be_batch_requests = 32;  // per Batch API job; 0 = no BE load
  int32_t max_token_id = 30000;    // prompt ids are drawn from [100, max_token_id)
  double drain_timeout_seconds = 300;
  double rss_growth_limit = 0.10;
  int server_pid = 0;  // whose RSS to sample; 0 = none
  uint64_t seed = 1;
  int32_t hostile_clients = 0;  // harness/hostile.h; its other settings below
  int64_t max_body_bytes = 64 << 20;
  double head_timeout_s = 10;
  int32_t schema_values = 256;
};

struct SoakReport {
  int64_t requests = 0;                     // started by the clients
  int64_t completed = 0;                    // read to [DONE] with a finish reason
  int64_t hung_up = 0;                      // abandoned on purpose
  int64_t failed = 0;                       // everything else
  std::map<std::string, int64_t> failures;  // reason -> count
  int64_t output_tokens = 0;                // of the completed streams
  double ttft_p50 = 0, ttft_p99 = 0;        // completed streams, seconds
  int32_t max_open = 0;                     // streams open at once (client side)
  int64_t be_jobs = 0, be_requests = 0;
  HostileReport hostile;  // empty without hostile clients
  // (seconds since the start, MiB) every second; empty without server_pid.
  std::vector<std::pair<double, double>> rss_mib;
  double rss_warm_mib = 0, rss_end_mib = 0, rss_max_mib = 0;
  bool healthy = false;                                   // GET /health answered 200 at the end
  double server_finished = 0, server_cancelled = 0;       // RT, over the run (/metrics)
  double server_running = -1, server_kv_used_bytes = -1;  // at the end
  double seconds = 0;
  bool ok = false;
  std::vector<std::string> problems;  // why not ok
};

nlohmann::json to_json(const SoakOptions& options, const SoakReport& report);

// Runs the soak (above). Throws blend::Error for bad options, a non-loopback host or a server
// that does not answer at the start; every failure after that is in the report.
SoakReport run_soak(const SoakOptions& options);

}  // namespace blend::online
