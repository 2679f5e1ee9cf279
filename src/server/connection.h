// Socket-level helpers cpp-httplib 0.11 (Debian 12's) lacks: a listen backlog of our choosing
// and a way for a handler to notice that its client hung up.
//   - httplib listens with a backlog of CPPHTTPLIB_LISTEN_BACKLOG = 5, fixed when Debian built
//     its shared library, so the macro cannot raise it; under bursts of connections the kernel's
//     accept queue overflowed and clients got ECONNRESET. HttpServer exposes the listening
//     socket so that set_listen_backlog() can listen() on it again: Linux then just raises the
//     queue's length (capped by net.core.somaxconn).
//   - A non-streaming handler never writes until the answer is ready, so httplib (which has no
//     Request::is_connection_closed() before 0.19) cannot tell it the client left.
//     request_socket() finds the connection's socket from the addresses httplib records on the
//     request; peer_hung_up() asks it whether the peer closed.
#pragma once

#include <httplib.h>

namespace blend {

class HttpServer : public httplib::Server {
 public:
  // The listening socket once bind_to_port()/bind_to_any_port() succeeded (else invalid).
  socket_t listen_socket() const { return svr_sock_; }
};

// Re-listens on the bound socket with room for `backlog` pending connections. False on error.
bool set_listen_backlog(const HttpServer& http, int backlog);

// The server-side socket the request came on, or -1 when none is found. Valid while the
// handler runs: httplib closes the connection only after the handler returns.
int request_socket(const httplib::Request& req);

// True when the peer of `fd` closed the connection or it failed (reset). Never blocks.
bool peer_hung_up(int fd);

}  // namespace blend
