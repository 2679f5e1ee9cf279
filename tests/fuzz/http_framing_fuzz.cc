// Fuzzes the poller's framing scanners (server/http_framing): whatever the bytes, a scanner fed
// them one byte at a time, or split where the input's first byte says, finds the same end as
// one fed them whole (the poller gets a client's bytes in whatever pieces the network makes),
// and never claims more bytes than it was given. body_to_collect takes any head.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/http_framing.h"

namespace {

struct Outcome {
  size_t used = 0;
  bool ended = false;
  bool failed = false;
  bool operator==(const Outcome&) const = default;
};

template <typename Scanner>
bool failed_of(const Scanner& s) {
  if constexpr (requires { s.failed(); })
    return s.failed();
  else
    return false;
}

// The bytes in pieces of `piece` (the last one shorter), stopping once the scanner has ended.
template <typename Scanner>
Outcome scan(std::string_view bytes, size_t piece) {
  Scanner s;
  Outcome o;
  for (size_t at = 0; at < bytes.size() && !s.ended(); at += piece) {
    const size_t n = std::min(piece, bytes.size() - at);
    const size_t used = s.feed(bytes.data() + at, n);
    if (used > n) std::abort();  // claimed bytes it was not given
    o.used += used;
  }
  o.ended = s.ended();
  o.failed = failed_of(s);
  return o;
}

template <typename Scanner>
void check(std::string_view bytes, size_t piece) {
  const Outcome whole = scan<Scanner>(bytes, bytes.size() + 1);
  if (!(scan<Scanner>(bytes, 1) == whole) || !(scan<Scanner>(bytes, piece) == whole)) std::abort();
  if (whole.used > bytes.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = data[0] % 16 + 1;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  check<blend::HeadEnd>(bytes, piece);
  check<blend::ChunkedEnd>(bytes, piece);
  (void)blend::body_to_collect(bytes);
  return 0;
}
