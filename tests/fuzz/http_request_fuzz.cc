// Fuzzes the HTTP connection layer of `blend serve` (server/connection, server/request_body):
// the bytes are what one client sends on one connection — pipelined requests, chunked and
// multipart bodies, bad framing — served by the real connection loop over a socketpair, with a
// POST route that reads its body under the server's limits. Nothing may crash or hang, and no
// body past the limit may reach a handler, whatever the transfer encoding.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "server/connection.h"
#include "server/request_body.h"

namespace {

constexpr size_t kMaxBody = 4096;

blend::HttpServer& server() {
  static blend::HttpServer* http = [] {
    auto* h = new blend::HttpServer();
    static blend::BodyBudget budget(2 * kMaxBody);
    h->set_connection_limits({.head_timeout_s = 2, .request_timeout_s = 4});
    h->set_payload_max_length(kMaxBody);
    h->Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    h->Post("/echo", [](const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& reader) {
      auto& request = const_cast<httplib::Request&>(req);
      blend::BodyReservation held(budget);
      if (auto refused = blend::read_body(request, reader, kMaxBody, held)) {
        blend::HttpServer::close_connection_after_response(res);
        res.status = refused->status;
        return;
      }
      size_t bytes = request.body.size();
      for (const auto& [name, part] : request.files) bytes += part.content.size();
      if (bytes > kMaxBody || held.held() > 2 * kMaxBody) std::abort();  // past the limit
      res.set_content(std::to_string(bytes), "text/plain");
    });
    // A bound socket makes the connection loop run (it stops when the server does).
    if (h->bind_to_any_port("127.0.0.1") < 0) std::abort();
    return h;
  }();
  return *http;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;  // within one socket buffer: written before serving
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
  const int buffer = 256 * 1024;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  ::setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  if (size > 0 && ::send(fds[0], data, size, MSG_NOSIGNAL) != static_cast<ssize_t>(size))
    std::abort();
  ::shutdown(fds[0], SHUT_WR);  // the client has said everything
  // The responses are read as they come, so that the server never waits on a full buffer.
  std::thread reader([fd = fds[0]] {
    char buf[4096];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
  });
  server().serve_connection(fds[1]);  // closes fds[1]
  reader.join();
  ::close(fds[0]);
  return 0;
}
