// The poller's HTTP framing scanners on their own: where a head and a chunked body end, however
// the bytes are split, and which bodies the poller reads (server/http_framing.h).
#include "server/http_framing.h"

#include <string>

#include <gtest/gtest.h>

namespace blend {
namespace {

// Feeds `wire` to a scanner in pieces of `piece` bytes; returns the bytes it said belong to the
// message (all of them when it never ended).
template <typename Scanner>
size_t consumed(const std::string& wire, size_t piece, Scanner& s) {
  size_t used = 0;
  for (size_t at = 0; at < wire.size() && !s.ended(); at += piece) {
    const size_t n = std::min(piece, wire.size() - at);
    used += s.feed(wire.data() + at, n);
  }
  return used;
}

TEST(HttpFraming, AHeadEndsAtItsFirstEmptyLineHoweverItIsSplit) {
  const std::string head = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  for (size_t piece : {1, 2, 3, 7, 100}) {
    HeadEnd end;
    EXPECT_EQ(consumed(head + "GET /next", piece, end), head.size()) << piece;
    EXPECT_TRUE(end.ended());
  }
  const std::string lf_head = "GET / HTTP/1.1\nHost: x\n\n";
  HeadEnd lf;
  EXPECT_EQ(consumed(lf_head + "rest", 1, lf), lf_head.size());
  const std::string unended = "GET / HTTP/1.1\r\nHost: x\r\n";
  HeadEnd open;
  EXPECT_EQ(consumed(unended, 1, open), unended.size());
  EXPECT_FALSE(open.ended());
}

TEST(HttpFraming, AChunkedBodyEndsAfterItsLastChunkAndTrailers) {
  const std::string bodies[] = {
      "5\r\nhello\r\n0\r\n\r\n", "5;name=value\r\nhello\r\nA\r\n0123456789\r\n0\r\n\r\n",
      "3\r\nabc\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
      "3\nabc\n0\n\n",  // bare LF line ends, as httplib takes them
  };
  for (const std::string& body : bodies)
    for (size_t piece : {1, 2, 5, 1000}) {
      ChunkedEnd end;
      EXPECT_EQ(consumed(body + "POST /next", piece, end), body.size()) << body << " / " << piece;
      EXPECT_TRUE(end.ended());
      EXPECT_FALSE(end.failed());
    }
}

TEST(HttpFraming, AChunkedBodyThatIsNotOneStopsTheScan) {
  for (const std::string body : {"zz\r\n", "\r\n", "5\r\nhelloX", "1234567890abcdef0\r\n"}) {
    ChunkedEnd end;
    consumed(body, 1, end);
    EXPECT_TRUE(end.failed()) << body;
    EXPECT_FALSE(end.ended());
  }
  ChunkedEnd unfinished;  // data still to come: neither ended nor failed
  consumed(std::string("10\r\nonly part"), 1, unfinished);
  EXPECT_FALSE(unfinished.ended());
  EXPECT_FALSE(unfinished.failed());
}

TEST(HttpFraming, ThePollerReadsOneContentLengthOrChunkedAlone) {
  auto framing = [](const std::string& headers) {
    return body_to_collect("POST /v1/completions HTTP/1.1\r\n" + headers + "\r\n");
  };
  EXPECT_EQ(framing("Content-Length: 42\r\n").length, 42u);
  EXPECT_EQ(framing("content-length:  7 \r\n").length, 7u);
  EXPECT_TRUE(framing("Transfer-Encoding: chunked\r\n").chunked);
  EXPECT_TRUE(framing("TRANSFER-ENCODING: Chunked\r\n").chunked);
  // A worker reads these (and httplib answers the malformed ones).
  EXPECT_FALSE(framing("").any());
  EXPECT_FALSE(framing("Content-Length: 42\r\nExpect: 100-continue\r\n").any());
  EXPECT_FALSE(framing("Content-Length: 4\r\nContent-Length: 4\r\n").any());
  EXPECT_FALSE(framing("Content-Length: 4x\r\n").any());
  EXPECT_FALSE(framing("Content-Length: 1234567890123456789\r\n").any());
  EXPECT_FALSE(framing("Transfer-Encoding: gzip, chunked\r\n").any());
  EXPECT_FALSE(framing("Transfer-Encoding: chunked\r\nContent-Length: 4\r\n").any());
  EXPECT_FALSE(framing("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n").any());
}

}  // namespace
}  // namespace blend
