// Request bodies read under two bounds, whatever their transfer encoding (Content-Length,
// chunked, multipart inside either), checked while the bytes arrive rather than after:
//   - one request's: ServerOptions::max_body_bytes (413 past it, before reading a byte when
//     Content-Length announces it);
//   - all requests' at once: a BodyBudget (503 with Retry-After past it). Parsing a body costs
//     a few times its size (3.7x measured for a 60 MB prompt, issue 54), so without it a few
//     hundred concurrent bodies under the limit could exhaust memory.
// A refused body is left unread: the caller closes the connection after answering.
#pragma once

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>

#include <httplib.h>

namespace blend {

class BodyBudget {
 public:
  explicit BodyBudget(size_t capacity) : capacity_(capacity) {}
  // Takes n bytes, or nothing and false when that would pass the capacity.
  bool reserve(size_t n);
  void release(size_t n) { used_ -= n; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  std::atomic<size_t> used_{0};
};

// The bytes one request holds in a BodyBudget, given back (and, for a large body, the freed
// heap returned to the system) when it goes.
class BodyReservation {
 public:
  // `adopted`: bytes of `budget` reserved for this body before (take_body_reservation), which
  // take() draws on first and the destructor gives back with the rest.
  explicit BodyReservation(BodyBudget& budget, size_t adopted = 0)
      : budget_(budget), held_(adopted), adopted_left_(adopted) {}
  ~BodyReservation();
  BodyReservation(const BodyReservation&) = delete;
  BodyReservation& operator=(const BodyReservation&) = delete;
  bool take(size_t n);
  size_t held() const { return held_; }

 private:
  BodyBudget& budget_;
  size_t held_, adopted_left_;
};

struct BodyRefusal {
  int status;  // 413, 503, or 400 for a body that could not be read (malformed, cut short)
  std::string message;
};

// Reads the body of `req` through `reader` into req.body, or multipart parts into req.files
// (as httplib's own reading would), within `max_bytes` and the reservation's budget. A request
// without Content-Length or chunked encoding has no body (RFC 9112 §6.3).
std::optional<BodyRefusal> read_body(httplib::Request& req, const httplib::ContentReader& reader,
                                     size_t max_bytes, BodyReservation& reservation);

// The body length a request's head announces: its Content-Length, SIZE_MAX for a chunked body
// (unknown until read), 0 for none.
size_t announced_body_bytes(const httplib::Request& req);

}  // namespace blend
