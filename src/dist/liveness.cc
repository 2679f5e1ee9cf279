#include "dist/liveness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include "core/error.h"

namespace blend::dist {
namespace {

constexpr auto kHandshakeTimeout = std::chrono::seconds(5);

struct Hello {
  uint64_t token;
  int32_t rank;
} __attribute__((packed));

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Reads or writes exactly `n` bytes within the handshake timeout; false on any failure.
bool transfer(int fd, void* data, size_t n, bool write) {
  const auto deadline = std::chrono::steady_clock::now() + kHandshakeTimeout;
  auto* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t k =
        write ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    done += static_cast<size_t>(k);
  }
  return true;
}

// Whether the connection on `fd` has closed; data (none is ever sent) is discarded.
bool closed(int fd, int timeout_ms) {
  pollfd pfd{fd, POLLIN, 0};
  if (::poll(&pfd, 1, timeout_ms) <= 0) return false;
  char buf[64];
  const ssize_t k = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  if (k < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return k == 0;
}

}  // namespace

LivenessServer::LivenessServer() {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw Error(std::string("liveness socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 128) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    close_fd(listen_fd_);
    throw Error("liveness socket: " + why);
  }
  token_ = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  std::vector<std::string> hosts, loopback;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN];
      const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (!::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) continue;
      (ntohl(in->sin_addr.s_addr) >> 24 == 127 ? loopback : hosts).push_back(text);
    }
    ::freeifaddrs(list);
  }
  if (loopback.empty()) loopback.push_back("127.0.0.1");
  std::ostringstream out;
  out << token_ << " " << ntohs(addr.sin_port);
  for (const auto* group : {&hosts, &loopback})
    for (const std::string& h : *group) out << " " << h;
  address_ = out.str();
}

LivenessServer::~LivenessServer() {
  close_fd(listen_fd_);
  for (int& fd : fds_) close_fd(fd);
}

void LivenessServer::accept_workers(int size, std::chrono::milliseconds timeout) {
  fds_.assign(static_cast<size_t>(size), -1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int connected = 0;
  while (connected < size - 1) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Hello hello{};
    if (!transfer(fd, &hello, sizeof hello, false) || hello.token != token_ || hello.rank <= 0 ||
        hello.rank >= size || fds_[static_cast<size_t>(hello.rank)] >= 0 ||
        !transfer(fd, &hello, sizeof hello, true)) {
      close_fd(fd);  // not one of ours (or a duplicate): ignore it
      continue;
    }
    fds_[static_cast<size_t>(hello.rank)] = fd;
    ++connected;
  }
  close_fd(listen_fd_);
  for (int r = 1; r < size; ++r)
    if (fds_[static_cast<size_t>(r)] < 0) never_connected_.push_back(r);
}

std::vector<int> LivenessServer::poll_gone(std::chrono::milliseconds timeout) {
  std::vector<int> gone;
  gone.swap(never_connected_);
  std::vector<pollfd> pfds;
  std::vector<int> ranks;
  for (size_t r = 0; r < fds_.size(); ++r)
    if (fds_[r] >= 0) {
      pfds.push_back({fds_[r], POLLIN, 0});
      ranks.push_back(static_cast<int>(r));
    }
  if (pfds.empty() || ::poll(pfds.data(), pfds.size(), static_cast<int>(timeout.count())) <= 0)
    return gone;
  for (size_t i = 0; i < pfds.size(); ++i) {
    if (pfds[i].revents == 0) continue;
    int& fd = fds_[static_cast<size_t>(ranks[i])];
    if (closed(fd, 0)) {
      close_fd(fd);
      gone.push_back(ranks[i]);
    }
  }
  return gone;
}

LivenessClient::LivenessClient(const std::string& address, int rank) {
  std::istringstream in(address);
  uint64_t token = 0;
  int port = 0;
  in >> token >> port;
  std::string host;
  std::string tried;
  while (in >> host) {
    tried += (tried.empty() ? "" : ", ") + host;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) continue;
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
        errno != EINPROGRESS) {
      close_fd(fd);
      continue;
    }
    pollfd pfd{fd, POLLOUT, 0};
    int error = 0;
    socklen_t len = sizeof error;
    Hello hello{token, rank};
    if (::poll(&pfd, 1, 2000) != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 ||
        error != 0 || !transfer(fd, &hello, sizeof hello, true) ||
        !transfer(fd, &hello, sizeof hello, false) || hello.token != token || hello.rank != rank) {
      close_fd(fd);
      continue;
    }
    fd_ = fd;
    return;
  }
  throw Error("rank " + std::to_string(rank) + " cannot reach rank 0 (port " +
              std::to_string(port) + " on " + tried + ")");
}

LivenessClient::~LivenessClient() {
  close_fd(fd_);
}

bool LivenessClient::peer_gone() {
  if (!gone_ && closed(fd_, 0)) gone_ = true;
  return gone_;
}

}  // namespace blend::dist
