// The HTTP connection layer under cpp-httplib 0.11 (Debian 12's), which lacks what a server
// facing one hostile client needs:
//   - A listen backlog of our choosing: httplib listens with CPPHTTPLIB_LISTEN_BACKLOG = 5,
//     fixed when Debian built its shared library; under bursts of connections the kernel's
//     accept queue overflowed and clients got ECONNRESET. set_listen_backlog() listen()s on the
//     bound socket again: Linux then just raises the queue's length (capped by somaxconn).
//   - Its own connection loop (HttpServer::process_and_close_socket), because httplib's:
//       * reads each request through a fresh buffered stream and drops what that buffer held,
//         so pipelined requests after the first were lost (1 of 5 answered, then a 5 s wait);
//       * has a per-read timeout only, so a client sending one header line every 3 s held a
//         thread forever (slowloris). Here a request's head must arrive within
//         ConnectionLimits::head_timeout_s and the whole request within request_timeout_s;
//         past either the client gets a 408 and the connection is closed;
//       * cannot be told to close a connection whose body a handler left unread (a body
//         refused as too large): close_connection_after_response() does.
//   - A way for a handler to notice that its client hung up: a non-streaming handler never
//     writes until the answer is ready, and httplib has no Request::is_connection_closed()
//     before 0.19. request_socket() gives the connection's socket; peer_hung_up() asks it.
#pragma once

#include <httplib.h>

namespace blend {

struct ConnectionLimits {
  // From a request's first byte: its request line and headers must have arrived within
  // head_timeout_s, the whole request (body included) within request_timeout_s. A 64 MiB body
  // within the default 120 s needs 0.55 MB/s.
  double head_timeout_s = 10;
  double request_timeout_s = 120;
};

class HttpServer : public httplib::Server {
 public:
  // The listening socket once bind_to_port()/bind_to_any_port() succeeded (else invalid).
  socket_t listen_socket() const { return svr_sock_; }
  void set_connection_limits(const ConnectionLimits& limits) { limits_ = limits; }

  // From a handler: close the connection this thread serves once `res` is written, whatever
  // keep-alive would do (and say so in its headers). For a body left unread, which would
  // otherwise be read as the next request.
  static void close_connection_after_response(httplib::Response& res);

  // Serves one connected socket on this thread as an accepted connection is served, then
  // closes it (the fuzz harness's way in). Needs a bound server: stop() ends the loop.
  bool serve_connection(socket_t sock) { return process_and_close_socket(sock); }

 private:
  // httplib calls it for each accepted connection on a thread of its pool (private virtual in
  // httplib::Server, overridden here): serves its requests in order, then closes it.
  bool process_and_close_socket(socket_t sock) override;

  ConnectionLimits limits_;
};

// Re-listens on the bound socket with room for `backlog` pending connections. False on error.
bool set_listen_backlog(const HttpServer& http, int backlog);

// The server-side socket of the connection this thread serves (the request's), or -1 off a
// connection thread. Valid while the handler runs: the connection is closed after it returns.
int request_socket(const httplib::Request& req);

// True when the peer of `fd` closed the connection or it failed (reset). Never blocks.
bool peer_hung_up(int fd);

}  // namespace blend
