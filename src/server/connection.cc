#include "server/connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace blend {
namespace {

// The numeric address and port of a socket address ("" for other families).
std::string address_of(const sockaddr_storage& a, int* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    *port = ntohs(in.sin_port);
    ::inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    *port = ntohs(in6.sin6_port);
    ::inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof buf);
  }
  return buf;
}

bool endpoint_is(int fd, bool peer, const std::string& addr, int port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) return false;
  int got_port = -1;
  return address_of(a, &got_port) == addr && got_port == port;
}

}  // namespace

bool set_listen_backlog(const HttpServer& http, int backlog) {
  const socket_t fd = http.listen_socket();
  return fd != INVALID_SOCKET && ::listen(fd, backlog) == 0;
}

int request_socket(const httplib::Request& req) {
  if (req.remote_port < 0 || req.local_port < 0) return -1;
  // A connection is the one socket whose two ends are the request's: compare each socket of
  // the process with them (a few hundred getsockname calls at most, once per request).
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    if (fd == ::dirfd(dir)) continue;
    if (endpoint_is(fd, /*peer=*/true, req.remote_addr, req.remote_port) &&
        endpoint_is(fd, /*peer=*/false, req.local_addr, req.local_port)) {
      found = fd;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

bool peer_hung_up(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  // Readable: either the next pipelined request (the client is still there) or end of stream.
  char c;
  return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace blend
