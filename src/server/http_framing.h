// HTTP/1.1 framing the connection poller needs before a worker takes a request: where a head
// ends, where a chunked body ends, and which body the poller reads at all. Scanners only: they
// find boundaries in bytes fed in order and never decode (httplib parses the request again on
// the worker and answers what is malformed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace blend {

// Finds the end of a request head, its first empty line (CRLF CRLF, or LF LF as httplib also
// takes), in bytes fed in order: each byte is looked at once, however the head is split.
class HeadEnd {
 public:
  // How many of p[0, n) belong to the head: all n when it has not ended yet.
  size_t feed(const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      last_ = (last_ << 8) | static_cast<unsigned char>(p[i]);
      if ((last_ & 0xFFFFFFFFu) == 0x0D0A0D0Au || (last_ & 0xFFFFu) == 0x0A0Au) {
        ended_ = true;
        return i + 1;
      }
    }
    return n;
  }
  bool ended() const { return ended_; }
  void reset() { *this = HeadEnd(); }

 private:
  uint32_t last_ = 0;
  bool ended_ = false;
};

// Finds the end of a chunked body (RFC 9112 §7.1: chunk-size [; extensions] CRLF, data CRLF,
// ..., a last chunk of size 0, trailer fields, an empty line) in bytes fed in order, each looked
// at once however the body is split. It only finds where the body ends: httplib decodes it again
// on the worker (and answers a malformed one), so anything unexpected just stops the scan.
class ChunkedEnd {
 public:
  // How many of p[0, n) belong to the body: all n when it has not ended (or the scan failed).
  size_t feed(const char* p, size_t n);
  bool ended() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kFailed; }

 private:
  enum class State {
    kSize,
    kExtension,
    kSizeLf,
    kData,
    kDataCr,
    kDataLf,
    kTrailerStart,
    kTrailerLine,
    kFinalLf,
    kDone,
    kFailed
  };
  void size_line_ended() { state_ = left_ == 0 ? State::kTrailerStart : State::kData; }
  void next_chunk() {
    state_ = State::kSize;
    digits_ = 0;
  }
  size_t fail(size_t n) {
    state_ = State::kFailed;
    return n;
  }
  size_t done(size_t i) {
    state_ = State::kDone;
    return i + 1;
  }

  State state_ = State::kSize;
  uint64_t left_ = 0;
  int digits_ = 0;
};

// How the body the poller reads for a request with this head before a worker takes it is framed.
struct BodyFraming {
  size_t length = 0;     // by its Content-Length
  bool chunked = false;  // Transfer-Encoding: chunked, its end found by ChunkedEnd
  bool any() const { return length > 0 || chunked; }
};

// The body the poller reads before a worker takes the request: one framed by the one
// Content-Length, or by `Transfer-Encoding: chunked` alone. None when there is no body or a worker
// reads it: Expect: 100-continue (the client waits for our answer before sending it), other
// transfer codings, both framings at once, a repeated or malformed header (httplib answers those).
BodyFraming body_to_collect(std::string_view head);

}  // namespace blend
