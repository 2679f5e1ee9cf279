#include "server/http_framing.h"

#include <algorithm>
#include <cctype>

namespace blend {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == y;
         });
}

std::string_view trimmed(std::string_view value) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t' || value.back() == '\r'))
    value.remove_suffix(1);
  return value;
}

}  // namespace

size_t ChunkedEnd::feed(const char* p, size_t n) {
  for (size_t i = 0; i < n && state_ != State::kDone && state_ != State::kFailed; ++i) {
    const char c = p[i];
    switch (state_) {
      case State::kSize:
        if (const int d = hex_digit(c); d >= 0) {
          if (++digits_ > 15) return fail(n);
          left_ = left_ * 16 + static_cast<uint64_t>(d);
        } else if (digits_ == 0) {
          return fail(n);
        } else if (c == ';' || c == ' ' || c == '\t') {
          state_ = State::kExtension;
        } else if (c == '\r') {
          state_ = State::kSizeLf;
        } else if (c == '\n') {
          size_line_ended();
        } else {
          return fail(n);
        }
        break;
      case State::kExtension:
        if (c == '\r') state_ = State::kSizeLf;
        if (c == '\n') size_line_ended();
        break;
      case State::kSizeLf:
        if (c != '\n') return fail(n);
        size_line_ended();
        break;
      case State::kData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(left_, n - i));
        left_ -= take;
        i += take - 1;
        if (left_ == 0) state_ = State::kDataCr;
        break;
      }
      case State::kDataCr:
        if (c == '\r') {
          state_ = State::kDataLf;
        } else if (c == '\n') {
          next_chunk();
        } else {
          return fail(n);
        }
        break;
      case State::kDataLf:
        if (c != '\n') return fail(n);
        next_chunk();
        break;
      case State::kTrailerStart:
        if (c == '\n') return done(i);
        state_ = c == '\r' ? State::kFinalLf : State::kTrailerLine;
        break;
      case State::kTrailerLine:
        if (c == '\n') state_ = State::kTrailerStart;
        break;
      case State::kFinalLf:
        if (c != '\n') return fail(n);
        return done(i);
      case State::kDone:
      case State::kFailed:
        break;
    }
  }
  return n;
}

BodyFraming body_to_collect(std::string_view head) {
  size_t length = 0;
  int lengths = 0, encodings = 0;
  bool chunked = false;
  for (size_t at = head.find('\n'); at != std::string_view::npos && at + 1 < head.size();) {
    const size_t start = at + 1;
    at = head.find('\n', start);
    const std::string_view line =
        head.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trimmed(line.substr(colon + 1));
    if (same_name(name, "expect")) return {};
    if (same_name(name, "transfer-encoding")) {
      chunked = same_name(value, "chunked");
      ++encodings;
      continue;
    }
    if (!same_name(name, "content-length")) continue;
    if (value.empty() || value.size() > 18) return {};
    length = 0;
    for (const char c : value) {
      if (c < '0' || c > '9') return {};
      length = length * 10 + static_cast<size_t>(c - '0');
    }
    ++lengths;
  }
  if (encodings == 0 && lengths == 1) return {.length = length};
  if (encodings == 1 && lengths == 0 && chunked) return {.chunked = true};
  return {};
}

}  // namespace blend
