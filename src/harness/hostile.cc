#include "harness/hostile.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/load_generator.h"

namespace blend::online {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A blocking loopback connection with send/receive timeouts; -1 on failure.
int connect_to(const std::string& host, int port, int timeout_s) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  const int fd = ::socket(res->ai_family, SOCK_STREAM, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    ::close(fd);
    ::freeaddrinfo(res);
    return -1;
  }
  ::freeaddrinfo(res);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

bool send_all(int fd, const std::string& data) {
  for (size_t sent = 0; sent < data.size();) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes, an error or the receive timeout: what arrived.
std::string receive_all(int fd) {
  std::string got;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  return got;
}

// The status codes of the responses in `raw`, in order.
std::vector<int> statuses(const std::string& raw) {
  std::vector<int> out;
  for (size_t at = raw.find("HTTP/1.1 "); at != std::string::npos;
       at = raw.find("HTTP/1.1 ", at + 1))
    if (at + 12 <= raw.size()) out.push_back(std::atoi(raw.c_str() + at + 9));
  return out;
}

std::string chunk_of(size_t bytes) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", bytes);
  return size + std::string(bytes, 'a') + "\r\n";
}

// Each attack returns "" when the server answered as it should, else what happened.
std::string chunked_oversize(const HostileOptions& o) {
  const int fd = connect_to(o.host, o.port, 30);
  if (fd < 0) return "cannot connect";
  send_all(fd,
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Transfer-Encoding: chunked\r\n\r\n");
  const std::string piece = chunk_of(64 << 10);
  for (int64_t sent = 0; sent <= o.max_body_bytes + (1 << 20); sent += 64 << 10)
    if (!send_all(fd, piece)) break;  // the server answered and closed: it stopped reading
  const std::string got = receive_all(fd);
  ::close(fd);
  const std::vector<int> s = statuses(got);
  if (s.size() == 1 && (s[0] == 413 || s[0] == 503)) return "";
  return s.empty() ? "no answer" : "HTTP " + std::to_string(s[0]);
}

std::string length_oversize(const HostileOptions& o) {
  const int fd = connect_to(o.host, o.port, 30);
  if (fd < 0) return "cannot connect";
  send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                   std::to_string(o.max_body_bytes + 1) + "\r\n\r\n");
  const std::vector<int> s = statuses(receive_all(fd));
  ::close(fd);
  if (s.size() == 1 && s[0] == 413) return "";
  return s.empty() ? "no answer" : "HTTP " + std::to_string(s[0]);
}

std::string slow_headers(const HostileOptions& o) {
  const int fd = connect_to(o.host, o.port, 30);
  if (fd < 0) return "cannot connect";
  const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(o.head_timeout_s + 2));
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");
  std::string got;
  while (Clock::now() < give_up) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) > 0) {
      got = receive_all(fd);
      break;
    }
    if (!send_all(fd, "X-Slow: 1\r\n")) break;
  }
  ::close(fd);
  const std::vector<int> s = statuses(got);
  if (s.size() == 1 && s[0] == 408) return "";
  return s.empty() ? "no 408 within the head timeout" : "HTTP " + std::to_string(s[0]);
}

std::string pipelined(const HostileOptions& o) {
  const int fd = connect_to(o.host, o.port, 30);
  if (fd < 0) return "cannot connect";
  std::string requests;
  for (int i = 0; i < 4; ++i) requests += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  requests += "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  send_all(fd, requests);
  const std::vector<int> s = statuses(receive_all(fd));
  ::close(fd);
  if (s == std::vector<int>(5, 200)) return "";
  return std::to_string(s.size()) + " of 5 answered";
}

std::string distinct_schema(const HostileOptions& o, uint64_t unique, int64_t* completions) {
  json values = json::array();
  for (int32_t i = 0; i < o.schema_values; ++i) {
    char v[80];
    std::snprintf(v, sizeof v, "value-%016llx-%08d-padding-padding-padding-padding",
                  static_cast<unsigned long long>(unique), i);
    values.push_back(v);
  }
  const json body = {
      {"model", o.model},
      {"messages", {{{"role", "user"}, {"content", "Pick one."}}}},
      {"max_tokens", 8},
      {"temperature", 0},
      {"response_format",
       {{"type", "json_schema"},
        {"json_schema", {{"name", "pick"}, {"schema", {{"enum", std::move(values)}}}}}}}};
  const int fd = connect_to(o.host, o.port, 300);
  if (fd < 0) return "cannot connect";
  const std::string text = body.dump();
  send_all(fd,
           "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
           "Content-Type: application/json\r\nContent-Length: " +
               std::to_string(text.size()) + "\r\n\r\n" + text);
  const std::vector<int> s = statuses(receive_all(fd));
  ::close(fd);
  if (s.size() == 1 && s[0] == 200) {
    ++*completions;
    return "";
  }
  if (s.size() == 1 && s[0] == 400) return "";  // a compile limit, refused by name
  return s.empty() ? "no answer" : "HTTP " + std::to_string(s[0]);
}

}  // namespace

HostileReport run_hostile(const HostileOptions& o, Clock::time_point end) {
  check_loopback(o.host);
  HostileReport report;
  std::mutex mu;
  std::atomic<uint64_t> schemas{o.seed << 32};  // every schema's values are new
  std::vector<std::thread> threads;
  for (int32_t k = 0; k < o.clients; ++k) {
    threads.emplace_back([&, k] {
      int64_t completions = 0;  // distinct-schema requests answered 200, this thread's
      const std::pair<const char*, std::function<std::string()>> attacks[] = {
          {"chunked-oversize", [&] { return chunked_oversize(o); }},
          {"length-oversize", [&] { return length_oversize(o); }},
          {"slow-headers", [&] { return slow_headers(o); }},
          {"pipelined", [&] { return pipelined(o); }},
          {"distinct-schema", [&] { return distinct_schema(o, schemas++, &completions); }}};
      for (size_t i = static_cast<size_t>(k); Clock::now() < end; ++i) {
        const auto& [attack, run] = attacks[i % std::size(attacks)];
        const std::string what = run();
        std::lock_guard lock(mu);
        ++report.attempts[attack];
        if (!what.empty()) ++report.unexpected[std::string(attack) + ": " + what];
      }
      std::lock_guard lock(mu);
      report.completions += completions;
    });
  }
  for (std::thread& t : threads) t.join();
  return report;
}

}  // namespace blend::online
