#include "server/connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

namespace blend {
namespace {

using Clock = std::chrono::steady_clock;

// The numeric address and port of a socket address ("" for other families).
void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  port = -1;
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    port = ntohs(in.sin_port);
    ::inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    port = ntohs(in6.sin6_port);
    ::inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof buf);
  }
  ip = buf;
}

void endpoint_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) {
    ip.clear();
    port = -1;
    return;
  }
  address_of(a, ip, port);
}

// poll() for `events` up to `ms` milliseconds, retrying on EINTR: >0 ready, 0 timeout, <0 error.
int poll_for(int fd, short events, int ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int rc = ::poll(&p, 1, ms);
    if (rc >= 0 || errno != EINTR) return rc;
  }
}

// Rounded up: a poll() for that long ends at or after `t`.
int milliseconds_until(Clock::time_point t) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}

// One connection's byte stream, kept for all its requests (so that bytes of a pipelined request
// read ahead with the one before it stay here), with the request deadlines of ConnectionLimits.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, time_t read_timeout_s, time_t write_timeout_s, ConnectionLimits limits)
      : fd_(fd),
        read_timeout_ms_(static_cast<int>(read_timeout_s * 1000)),
        write_timeout_ms_(static_cast<int>(write_timeout_s * 1000)),
        limits_(limits) {}

  // The next request starts: its deadlines count from now.
  void begin_request() {
    const auto now = Clock::now();
    head_deadline_ = now + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(limits_.head_timeout_s));
    request_deadline_ = now + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(limits_.request_timeout_s));
    in_head_ = true;
    last_bytes_ = 0;
    written_ = 0;
  }
  bool has_buffered() const { return off_ < size_; }
  bool timed_out() const { return timed_out_; }
  bool wrote_anything() const { return written_ > 0; }
  bool close_requested() const { return close_requested_; }
  void request_close() { close_requested_ = true; }

  bool is_readable() const override { return has_buffered() || wait_readable(); }
  bool is_writable() const override {
    return !timed_out_ && poll_for(fd_, POLLOUT, write_timeout_ms_) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (!has_buffered()) {
      if (!wait_readable()) return -1;
      ssize_t n;
      do {
        n = ::recv(fd_, buffer_, sizeof buffer_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n < 0 ? -1 : 0;
      off_ = 0;
      size_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, size_ - off_);
    std::memcpy(ptr, buffer_ + off_, n);
    off_ += n;
    if (in_head_) track_head(ptr, n);
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    // After a timeout the connection layer answers 408 itself (httplib would answer 400).
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n > 0) written_ += static_cast<size_t>(n);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    endpoint_of(fd_, /*peer=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    endpoint_of(fd_, /*peer=*/false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  // Waits for bytes until the read timeout or the request's deadline, whichever is first;
  // missing either marks the stream timed out (the request then gets a 408, not httplib's 400
  // on a connection kept alive).
  bool wait_readable() const {
    if (timed_out_) return false;
    const Clock::time_point deadline = in_head_ ? head_deadline_ : request_deadline_;
    const int rc = poll_for(fd_, POLLIN, std::min(read_timeout_ms_, milliseconds_until(deadline)));
    if (rc > 0) return true;
    if (rc == 0) timed_out_ = true;
    return false;
  }

  // The head ends at its first empty line (CRLF CRLF, or LF LF as httplib also takes).
  void track_head(const char* p, size_t n) {
    for (size_t i = 0; i < n && in_head_; ++i) {
      last_bytes_ = (last_bytes_ << 8) | static_cast<unsigned char>(p[i]);
      if ((last_bytes_ & 0xFFFFFFFFu) == 0x0D0A0D0Au || (last_bytes_ & 0xFFFFu) == 0x0A0Au)
        in_head_ = false;
    }
  }

  const int fd_;
  const int read_timeout_ms_, write_timeout_ms_;
  const ConnectionLimits limits_;
  char buffer_[16 * 1024];
  size_t off_ = 0, size_ = 0;
  Clock::time_point head_deadline_, request_deadline_;
  bool in_head_ = true;
  uint32_t last_bytes_ = 0;
  size_t written_ = 0;
  mutable bool timed_out_ = false;
  bool close_requested_ = false;
};

// The connection this thread serves (handlers run on their connection's thread).
thread_local ConnectionStream* current_connection = nullptr;

void send_request_timeout(int fd) {
  static const std::string body =
      R"({"error":{"message":"the request did not arrive in time","type":"invalid_request_error","param":null,"code":null}})";
  const std::string response =
      "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  (void)::send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// A connection closed with a request's body unread (refused before it was read): say nothing
// more, then read and drop what the client still sends, for a while, before closing. Closing at
// once would reset the connection while the client still writes its body, and a reset can
// discard the answer before the client reads it (nginx's lingering close, for the same reason).
void linger_and_drop_input(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  char buf[64 * 1024];
  while (Clock::now() < give_up) {
    if (poll_for(fd, POLLIN, std::min(500, milliseconds_until(give_up))) <= 0) return;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return;
  }
}

}  // namespace

bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream stream(sock, read_timeout_sec_, write_timeout_sec_, limits_);
  current_connection = &stream;
  // Waits up to the keep-alive timeout for the next request, watching for stop().
  auto next_request = [&] {
    if (stream.has_buffered()) return true;
    const auto deadline = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    while (svr_sock_ != INVALID_SOCKET) {
      const int rc = poll_for(sock, POLLIN, std::min(100, milliseconds_until(deadline)));
      if (rc != 0) return rc > 0;  // readable (or closed: the read then ends the loop)
      if (Clock::now() >= deadline) return false;
    }
    return false;
  };
  bool ok = true;
  for (size_t left = keep_alive_max_count_; left > 0 && ok && next_request(); --left) {
    stream.begin_request();
    bool closed = false;
    ok = process_request(stream, /*close_connection=*/left == 1, closed, nullptr);
    if (stream.timed_out()) {
      if (!stream.wrote_anything()) send_request_timeout(sock);
      break;
    }
    if (stream.close_requested()) {
      linger_and_drop_input(sock);
      break;
    }
    if (closed) break;
  }
  current_connection = nullptr;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

void HttpServer::close_connection_after_response(httplib::Response& res) {
  res.set_header("Connection", "close");
  if (current_connection) current_connection->request_close();
}

bool set_listen_backlog(const HttpServer& http, int backlog) {
  const socket_t fd = http.listen_socket();
  return fd != INVALID_SOCKET && ::listen(fd, backlog) == 0;
}

int request_socket(const httplib::Request&) {
  return current_connection ? current_connection->socket() : -1;
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
