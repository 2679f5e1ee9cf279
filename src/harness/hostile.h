// Hostile clients for the soak (issue 54): what one client can do to a server beside its real
// load, each attack in turn, again and again, over loopback. For every attempt the server must
// give the clean answer below — never a reset, a hang, a 5xx or a crash — and its memory must
// stay flat (the soak judges RSS):
//   chunked-oversize  a chunked POST body past --max-body-bytes: 413 (or 503 while the body
//                     budget is busy) before the body ends, then the connection closed;
//   length-oversize   a Content-Length past the limit: 413 before a byte of the body is sent;
//   slow-headers      one header line a second: 408 within the head timeout (+2 s);
//   pipelined         five GET requests in one write: five answers, in order, all 200;
//   distinct-schema   a chat completion whose JSON schema is an enum of long strings never
//                     seen before: 200 (counted in `completions`) or a 400 naming a limit.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace blend::online {

struct HostileOptions {
  std::string host = "127.0.0.1";  // loopback only
  int port = 8000;
  std::string model;                  // the "model" field of the schema requests
  int32_t clients = 4;                // threads, each cycling through the attacks
  int64_t max_body_bytes = 64 << 20;  // the server's --max-body-bytes
  double head_timeout_s = 10;         // the server's --http-head-timeout
  int32_t schema_values = 256;        // enum values per schema (64 bytes each)
  uint64_t seed = 1;
};

struct HostileReport {
  std::map<std::string, int64_t> attempts;    // attack -> tries
  std::map<std::string, int64_t> unexpected;  // "attack: what happened" -> count
  int64_t completions = 0;                    // distinct-schema requests answered 200
};

// Runs the attacks until `end`; the report counts them. Throws blend::Error for a
// non-loopback host.
HostileReport run_hostile(const HostileOptions& options, std::chrono::steady_clock::time_point end);

}  // namespace blend::online
