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
//         past either the client gets a 408 and the connection is closed (a body, of known
//         length or chunked, waits off the threads, as heads do: collect_body_bytes);
//       * cannot be told to close a connection whose body a handler left unread (a body
//         refused as too large): close_connection_after_response() does.
//   - Bounds on connections, and threads for requests only: httplib gives each accepted
//     connection a pool thread for its whole life, so idle keep-alive connections and clients
//     trickling their headers held threads, and enough of them left /health waiting (40
//     slowloris clients made it take 52 s). Here a connection waits for its next request's
//     head on one epoll thread (ConnectionQueue in connection.cc) and takes a thread once the
//     head has arrived; past ConnectionLimits::max_connections open connections in all, or
//     max_connections_per_ip from one address, a new one gets a 503 at accept and is closed.
//   - A way for a handler to notice that its client hung up: a non-streaming handler never
//     writes until the answer is ready, and httplib has no Request::is_connection_closed()
//     before 0.19. request_socket() gives the connection's socket; peer_hung_up() asks it.
#pragma once

#include <httplib.h>

#include <functional>

namespace blend {

class BodyBudget;

struct ConnectionLimits {
  // From a request's first byte: its request line and headers must have arrived within
  // head_timeout_s, the whole request (body included) within request_timeout_s. A 64 MiB body
  // within the default 120 s needs 0.55 MB/s.
  double head_timeout_s = 10;
  double request_timeout_s = 120;
  // Connections open at once (waiting for a request or being served), in all and from one
  // client address; 0 = no bound.
  int max_connections = 0;
  int max_connections_per_ip = 0;
  // A body of at most collect_body_bytes, announced by a Content-Length or sent chunked (its
  // wire bytes counted), is read before a thread takes its request, by the thread that waits
  // for heads, into memory held in *body_budget (the handler takes that over:
  // take_body_reservation). So a client trickling its body holds a connection until
  // request_timeout_s, not a thread: a few of them held every --threads-http thread and left
  // /health waiting. Longer bodies, those past the budget, other transfer codings and
  // Expect: 100-continue are read (or refused) by the handler on its thread. 0 or no budget: none.
  BodyBudget* body_budget = nullptr;
  size_t collect_body_bytes = 0;
  // Whether a route reads the body of a request with this method and path (no query): the
  // poller collects only such bodies. Others go to a thread at once, to be refused unread (a
  // 404 for a body no route takes). Unset: every body.
  std::function<bool(const std::string& method, const std::string& path)> route_reads_body;
  // Called with the status of each answer the connection layer gives by itself, before any
  // route sees a request: 503 to a connection past a bound, 408 to a request past a deadline
  // (the server counts them with the routes' errors in /metrics). Called on the accepting,
  // polling or serving thread; unset: not reported.
  std::function<void(int http_status)> on_own_answer;
};

class ConnectionQueue;
struct ParkedConnection;

class HttpServer : public httplib::Server {
 public:
  // The listening socket once bind_to_port()/bind_to_any_port() succeeded (else invalid).
  socket_t listen_socket() const { return svr_sock_; }
  void set_connection_limits(const ConnectionLimits& limits) { limits_ = limits; }
  // Requests are served on `threads` threads; connections between requests wait off them.
  // Before listening.
  void set_worker_threads(size_t threads);

  // From a handler: close the connection this thread serves once `res` is written, whatever
  // keep-alive would do (and say so in its headers). For a body left unread, which would
  // otherwise be read as the next request.
  static void close_connection_after_response(httplib::Response& res);

  // Serves one connected socket on this thread as an accepted connection is served, then
  // closes it (the fuzz harness's way in). Needs a bound server: stop() ends the loop.
  bool serve_connection(socket_t sock) { return process_and_close_socket(sock); }

 private:
  friend class ConnectionQueue;
  // httplib calls it for each accepted connection (private virtual in httplib::Server,
  // overridden here): hands it to the ConnectionQueue listening made (set_worker_threads);
  // called otherwise (serve_connection), serves its requests in order, then closes it.
  bool process_and_close_socket(socket_t sock) override;
  // On a worker of `queue`: serves the requests whose bytes the connection holds, then hands it
  // back to the queue to wait for more, or closes it.
  void serve_ready(ConnectionQueue& queue, ParkedConnection connection);
  // httplib's process_request for one request on `stream` (`closed`: the connection must close).
  std::function<bool(httplib::Stream& stream, bool close_connection, bool& closed)>
  request_processor();

  ConnectionLimits limits_;
};

// Re-listens on the bound socket with room for `backlog` pending connections. False on error.
bool set_listen_backlog(const HttpServer& http, int backlog);

// The bytes of ConnectionLimits::body_budget held for the body of the request this thread
// serves, read before a thread took the request. The caller takes them over (releases them);
// 0 after that, off a connection thread, or when the handler reads the body itself.
size_t take_body_reservation(const httplib::Request& req);

// The server-side socket of the connection this thread serves (the request's), or -1 off a
// connection thread. Valid while the handler runs: the connection is closed after it returns.
int request_socket(const httplib::Request& req);

// True when the peer of `fd` closed the connection or it failed (reset). Never blocks.
bool peer_hung_up(int fd);

}  // namespace blend
