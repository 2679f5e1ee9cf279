#include "server/connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/http_framing.h"
#include "server/request_body.h"

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
  // `received`: bytes of the connection read before (by the ConnectionQueue's poller), served
  // before any read from the socket; `body_reserved`: what limits.body_budget holds for the
  // body among them, until its handler takes it over (take_body_reservation) or it is served.
  ConnectionStream(int fd, time_t read_timeout_s, time_t write_timeout_s, ConnectionLimits limits,
                   std::string received = {}, size_t body_reserved = 0)
      : fd_(fd),
        read_timeout_ms_(static_cast<int>(read_timeout_s * 1000)),
        write_timeout_ms_(static_cast<int>(write_timeout_s * 1000)),
        limits_(limits),
        received_(std::move(received)),
        body_reserved_(body_reserved) {}
  ~ConnectionStream() override { release_body_reservation(); }
  ConnectionStream(const ConnectionStream&) = delete;
  ConnectionStream& operator=(const ConnectionStream&) = delete;

  size_t take_body_reservation() { return std::exchange(body_reserved_, 0); }
  const ConnectionLimits& limits() const { return limits_; }
  void release_body_reservation() {
    if (body_reserved_ > 0) limits_.body_budget->release(std::exchange(body_reserved_, 0));
  }

  // The next request starts: its deadlines count from `now` (its first byte).
  void begin_request(Clock::time_point now = Clock::now()) {
    head_deadline_ = now + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(limits_.head_timeout_s));
    request_deadline_ = now + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(limits_.request_timeout_s));
    head_end_.reset();
    written_ = 0;
  }
  bool has_buffered() const { return received_off_ < received_.size() || off_ < size_; }
  bool timed_out() const { return timed_out_; }
  bool wrote_anything() const { return written_ > 0; }
  bool close_requested() const { return close_requested_; }
  void request_close() { close_requested_ = true; }

  bool is_readable() const override { return has_buffered() || wait_readable(); }
  bool is_writable() const override {
    return !timed_out_ && poll_for(fd_, POLLOUT, write_timeout_ms_) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (received_off_ < received_.size()) {
      const size_t n = std::min(size, received_.size() - received_off_);
      std::memcpy(ptr, received_.data() + received_off_, n);
      received_off_ += n;
      if (received_off_ == received_.size()) {  // all served: its memory goes
        std::string().swap(received_);
        received_off_ = 0;
      }
      if (!head_end_.ended()) head_end_.feed(ptr, n);
      return static_cast<ssize_t>(n);
    }
    if (off_ == size_) {
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
    if (!head_end_.ended()) head_end_.feed(ptr, n);
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
    const Clock::time_point deadline = head_end_.ended() ? request_deadline_ : head_deadline_;
    const int rc = poll_for(fd_, POLLIN, std::min(read_timeout_ms_, milliseconds_until(deadline)));
    if (rc > 0) return true;
    if (rc == 0) timed_out_ = true;
    return false;
  }

  const int fd_;
  const int read_timeout_ms_, write_timeout_ms_;
  const ConnectionLimits limits_;
  std::string received_;
  size_t received_off_ = 0;
  size_t body_reserved_;
  char buffer_[16 * 1024];
  size_t off_ = 0, size_ = 0;
  Clock::time_point head_deadline_, request_deadline_;
  HeadEnd head_end_;
  size_t written_ = 0;
  mutable bool timed_out_ = false;
  bool close_requested_ = false;
};

// The connection this thread serves (handlers run on their connection's thread).
thread_local ConnectionStream* current_connection = nullptr;

void send_request_timeout(int fd, const ConnectionLimits& limits) {
  if (limits.on_own_answer) limits.on_own_answer(408);
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

// A refused connection's answer: whatever it sent so far is read first, so that closing does
// not reset the connection (and drop the answer) over unread bytes.
void send_too_many_connections(int fd, const std::string& why, const ConnectionLimits& limits) {
  if (limits.on_own_answer) limits.on_own_answer(503);
  char buf[16 * 1024];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
  const std::string body =
      R"({"error":{"message":")" + why + R"(","type":"server_error","param":null,"code":null}})";
  const std::string response =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  (void)::send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_WR);
}

// Heads longer than this go to a worker unfinished, which reads the rest under the head's
// deadline (httplib takes heads of any length).
constexpr size_t kMaxPolledHead = 32 * 1024;

using RequestProcessor = std::function<bool(httplib::Stream&, bool close_connection, bool& closed)>;

// Serves requests on `stream` for as long as `next_request` says one is there, at most `left`
// (counted down). True when the connection may stay open for another request.
bool serve_requests(ConnectionStream& stream, size_t& left, const RequestProcessor& process,
                    const std::function<bool()>& next_request, Clock::time_point first_byte) {
  for (; left > 0 && next_request(); --left, first_byte = Clock::now()) {
    stream.begin_request(first_byte);
    bool closed = false;
    const bool ok = process(stream, /*close_connection=*/left == 1, closed);
    stream.release_body_reservation();  // a route that reads no body did not take it
    if (stream.timed_out()) {
      if (!stream.wrote_anything()) send_request_timeout(stream.socket(), stream.limits());
      return false;
    }
    if (stream.close_requested()) {
      linger_and_drop_input(stream.socket());
      return false;
    }
    if (closed || !ok) return false;
  }
  return left > 0;
}

// The ConnectionQueue an accept is being handed to, on the accepting thread (see enqueue).
thread_local ConnectionQueue* accepting_into = nullptr;

}  // namespace

// A connection between requests, waiting for its next request's head.
struct ParkedConnection {
  int fd = -1;
  std::string ip;
  size_t requests_left = 0;         // keep-alive's count
  Clock::time_point idle_deadline;  // no byte of a request by then: closed (keep-alive timeout)
  bool head_started = false;
  Clock::time_point first_byte;  // of the request, once head_started
  // What the poller read of the request so far (recv'd, not peeked: a head trickled in byte by
  // byte was peeked whole at each byte, quadratic in its length), handed to the worker's stream.
  std::string received;
  HeadEnd head_end;       // over `received`
  size_t head_bytes = 0;  // once the head ended: its length in `received`
  // The body the poller reads before a worker takes the request (body_to_collect), and what
  // ConnectionLimits::body_budget holds for it. A chunked body's length is unknown until
  // chunked_end finds its end: its bytes so far are reserved as they arrive.
  size_t body_bytes = 0, body_reserved = 0;
  bool chunked = false;
  ChunkedEnd chunked_end;
};

// httplib's task queue for accepted connections, which it hands over one closure each (that
// calls process_and_close_socket). Here that closure runs at once on the accepting thread and
// admits the socket (or refuses it: the connection bounds); admitted sockets wait in an epoll
// set until a request's head has arrived whole, and its body where ConnectionLimits says the
// poller reads it (read into the connection's buffer, which the worker's stream serves first),
// then go to a pool thread, which serves the requests it has and hands the connection back. So
// a thread is held only while a request is answered (and the bodies the poller leaves are read).
class ConnectionQueue final : public httplib::TaskQueue {
 public:
  ConnectionQueue(HttpServer& server, size_t threads)
      : server_(server),
        limits_(server.limits_),
        keep_alive_s_(server.keep_alive_timeout_sec_),
        requests_per_connection_(server.keep_alive_max_count_),
        pool_(threads),
        epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)),
        wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = wake_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &e);
    poller_ = std::thread([this] { poll_loop(); });
  }
  ~ConnectionQueue() override {
    ::close(epoll_fd_);
    ::close(wake_fd_);
  }

  void enqueue(std::function<void()> fn) override {
    accepting_into = this;
    fn();  // process_and_close_socket(sock), which calls admit(sock) (accepting_into is set)
    accepting_into = nullptr;
  }

  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
    poller_.join();
    {
      std::lock_guard lock(mu_);
      for (auto& [fd, c] : parked_) close_locked(c);
      parked_.clear();
    }
    pool_.shutdown();  // requests being served finish; their connections then close
  }

  // A new connection, on the accepting thread: refused past a bound, else waits for a request.
  void admit(int fd) {
    ParkedConnection c;
    c.fd = fd;
    int port = 0;
    endpoint_of(fd, /*peer=*/true, c.ip, port);
    c.requests_left = requests_per_connection_;
    std::unique_lock lock(mu_);
    std::string refused;
    if (limits_.max_connections > 0 && open_ >= limits_.max_connections)
      refused = "too many connections: " + std::to_string(open_) + " are open (--max-connections)";
    else if (limits_.max_connections_per_ip > 0 && per_ip_[c.ip] >= limits_.max_connections_per_ip)
      refused = "too many connections from this address: " + std::to_string(per_ip_[c.ip]) +
                " are open (--max-connections-per-ip)";
    if (!refused.empty() || stopping_) {
      if (per_ip_[c.ip] == 0) per_ip_.erase(c.ip);
      lock.unlock();
      if (!refused.empty()) send_too_many_connections(fd, refused, limits_);
      ::close(fd);
      return;
    }
    ++open_;
    ++per_ip_[c.ip];
    park_locked(std::move(c));
  }

  // From a worker: the connection waits for its next request (or closes, when stopping).
  void park(ParkedConnection c) {
    std::lock_guard lock(mu_);
    if (stopping_) return close_locked(c);
    c.head_started = false;
    c.received.clear();
    c.head_end.reset();
    c.head_bytes = c.body_bytes = c.body_reserved = 0;
    c.chunked = false;
    c.chunked_end = ChunkedEnd();
    park_locked(std::move(c));
  }

  // From a worker: the connection is done with.
  void close(const ParkedConnection& c) {
    std::lock_guard lock(mu_);
    close_locked(c);
  }

 private:
  void park_locked(ParkedConnection c) {
    c.idle_deadline = Clock::now() + std::chrono::seconds(keep_alive_s_);
    const int fd = c.fd;
    parked_[fd] = std::move(c);
    // Edge-triggered: a head that arrives in pieces wakes the poller once per piece, not
    // again and again while it lies unread. Adding a socket that holds bytes already reports it.
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    e.data.fd = fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e);
  }

  void close_locked(const ParkedConnection& c) {
    if (c.body_reserved > 0) limits_.body_budget->release(c.body_reserved);
    ::shutdown(c.fd, SHUT_RDWR);
    ::close(c.fd);
    --open_;
    if (--per_ip_[c.ip] <= 0) per_ip_.erase(c.ip);
  }

  // Takes a parked connection out of the set (to be served or closed).
  ParkedConnection unpark_locked(int fd) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    auto it = parked_.find(fd);
    ParkedConnection c = std::move(it->second);
    parked_.erase(it);
    return c;
  }

  // New bytes (or an end) on a parked connection: read (edge-triggered: until none are left)
  // and served once its head is whole, and its body too where the poller reads it.
  void on_readable_locked(int fd) {
    auto it = parked_.find(fd);
    if (it == parked_.end()) return;
    ParkedConnection& c = it->second;
    for (;;) {
      const size_t want =
          c.chunked ? scratch_.size()
                    : std::min(scratch_.size(),
                               c.head_end.ended() ? c.head_bytes + c.body_bytes - c.received.size()
                                                  : kMaxPolledHead - c.received.size());
      const ssize_t n = ::recv(fd, scratch_.data(), want, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) return close_locked(unpark_locked(fd));  // closed by the client, or failed
      if (!c.head_started) {
        c.head_started = true;
        c.first_byte = Clock::now();
      }
      c.received.append(scratch_.data(), static_cast<size_t>(n));
      size_t in_head = 0;
      if (!c.head_end.ended()) {
        in_head = c.head_end.feed(scratch_.data(), static_cast<size_t>(n));
        if (!c.head_end.ended()) {
          if (c.received.size() >= kMaxPolledHead) return dispatch_locked(fd);
          continue;
        }
        c.head_bytes = c.received.size() - static_cast<size_t>(n) + in_head;
        if (!collect_body_locked(c)) return dispatch_locked(fd);
      }
      if (c.chunked) {
        if (!collect_chunks_locked(c, scratch_.data() + in_head, static_cast<size_t>(n) - in_head))
          return dispatch_locked(fd);
      } else if (c.received.size() >= c.head_bytes + c.body_bytes) {
        return dispatch_locked(fd);
      }
      // A short read took all the socket held: what comes later is a new edge, which wakes the
      // poller again (a second recv only to hear EAGAIN doubled the calls of a trickled head).
      if (static_cast<size_t>(n) < want) return;
    }
  }

  // Whether the poller reads the body of the request whose head `c` holds before a worker takes
  // it: a body announced by its Content-Length within ConnectionLimits::collect_body_bytes, and
  // held in the body budget (else the handler reads it, or refuses it: 413, 503).
  // A chunked body is read while its bytes so far (framing included: a bound on what it decodes
  // to) stay within collect_body_bytes and the budget.
  bool collect_body_locked(ParkedConnection& c) {
    const std::string_view head = std::string_view(c.received).substr(0, c.head_bytes);
    const BodyFraming framing = body_to_collect(head);
    if (!framing.any() || limits_.collect_body_bytes == 0 || limits_.body_budget == nullptr)
      return false;
    if (limits_.route_reads_body) {
      // The request line: METHOD SP target SP version; the path is the target up to its query.
      const size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
      if (sp1 == std::string_view::npos || sp2 == std::string_view::npos) return false;
      const std::string_view target = head.substr(sp1 + 1, sp2 - sp1 - 1);
      if (!limits_.route_reads_body(std::string(head.substr(0, sp1)),
                                    std::string(target.substr(0, target.find('?')))))
        return false;
    }
    if (framing.chunked) {
      c.chunked = true;
      return true;
    }
    const size_t n = framing.length;
    if (n > limits_.collect_body_bytes || !limits_.body_budget->reserve(n)) return false;
    c.body_bytes = c.body_reserved = n;
    c.received.reserve(c.head_bytes + n);
    return true;
  }

  // The bytes of a chunked body just read, p[0, n) (what follows its end belongs to the next
  // request). False when the poller is done with it: it ended, or a worker reads (or refuses)
  // the rest — malformed, past collect_body_bytes, or past the budget.
  bool collect_chunks_locked(ParkedConnection& c, const char* p, size_t n) {
    const size_t in_body = c.chunked_end.feed(p, n);
    if (c.chunked_end.failed() || !limits_.body_budget->reserve(in_body)) return false;
    c.body_reserved += in_body;
    return !c.chunked_end.ended() && c.received.size() - c.head_bytes <= limits_.collect_body_bytes;
  }

  void dispatch_locked(int fd) {
    pool_.enqueue([this, ready = unpark_locked(fd)]() mutable {
      server_.serve_ready(*this, std::move(ready));
    });
  }

  // Idle connections past the keep-alive timeout close; heads past --http-head-timeout and
  // bodies the poller reads past --http-request-timeout get 408.
  void expire_locked(Clock::time_point now) {
    const auto head_timeout = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(limits_.head_timeout_s));
    const auto request_timeout = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(limits_.request_timeout_s));
    std::vector<int> expired;
    for (const auto& [fd, c] : parked_) {
      const auto timeout = c.head_end.ended() ? request_timeout : head_timeout;
      if (c.head_started ? now - c.first_byte >= timeout : now >= c.idle_deadline)
        expired.push_back(fd);
    }
    for (const int fd : expired) {
      ParkedConnection c = unpark_locked(fd);
      if (c.head_started) send_request_timeout(fd, limits_);
      close_locked(c);
    }
  }

  void poll_loop() {
    epoll_event events[64];
    auto next_expiry = Clock::now();
    for (;;) {
      const int n = ::epoll_wait(epoll_fd_, events, 64, 100);
      std::lock_guard lock(mu_);
      if (stopping_) return;
      for (int i = 0; i < n; ++i)
        if (events[i].data.fd != wake_fd_) on_readable_locked(events[i].data.fd);
      const auto now = Clock::now();
      if (now >= next_expiry) {
        expire_locked(now);
        next_expiry = now + std::chrono::milliseconds(100);
      }
    }
  }

  HttpServer& server_;
  const ConnectionLimits limits_;
  const time_t keep_alive_s_;
  const size_t requests_per_connection_;
  httplib::ThreadPool pool_;
  const int epoll_fd_, wake_fd_;
  std::mutex mu_;
  bool stopping_ = false;
  std::unordered_map<int, ParkedConnection> parked_;  // by socket
  int open_ = 0;                                      // connections admitted and not closed
  std::unordered_map<std::string, int> per_ip_;       // of them, by client address
  std::vector<char> scratch_ = std::vector<char>(kMaxPolledHead);  // the poller's recv buffer
  std::thread poller_;
};

std::function<bool(httplib::Stream&, bool, bool&)> HttpServer::request_processor() {
  return [this](httplib::Stream& stream, bool close_connection, bool& closed) {
    return process_request(stream, close_connection, closed, nullptr);
  };
}

void HttpServer::set_worker_threads(size_t threads) {
  new_task_queue = [this, threads] { return new ConnectionQueue(*this, threads); };
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  if (accepting_into) {  // a new connection, on the accepting thread
    accepting_into->admit(sock);
    return true;
  }
  // Served here to its end (serve_connection), waiting on this thread between requests.
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
  size_t left = keep_alive_max_count_;
  serve_requests(stream, left, request_processor(), next_request, Clock::now());
  current_connection = nullptr;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return true;
}

void HttpServer::serve_ready(ConnectionQueue& queue, ParkedConnection c) {
  ConnectionStream stream(c.fd, read_timeout_sec_, write_timeout_sec_, limits_,
                          std::move(c.received), std::exchange(c.body_reserved, 0));
  current_connection = &stream;
  // Only requests whose bytes are here already: for the next one the connection waits parked.
  bool first = true;
  auto next_request = [&] { return std::exchange(first, false) || stream.has_buffered(); };
  const bool keep =
      serve_requests(stream, c.requests_left, request_processor(), next_request, c.first_byte);
  current_connection = nullptr;
  if (keep && svr_sock_ != INVALID_SOCKET) {
    queue.park(std::move(c));
  } else {
    queue.close(c);
  }
}

void HttpServer::close_connection_after_response(httplib::Response& res) {
  res.set_header("Connection", "close");
  if (current_connection) current_connection->request_close();
}

bool set_listen_backlog(const HttpServer& http, int backlog) {
  const socket_t fd = http.listen_socket();
  return fd != INVALID_SOCKET && ::listen(fd, backlog) == 0;
}

size_t take_body_reservation(const httplib::Request&) {
  return current_connection ? current_connection->take_body_reservation() : 0;
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
