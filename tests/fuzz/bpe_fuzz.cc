// Fuzzes BPE encode/decode of the real Llama-3 tokenizer on arbitrary bytes, and checks what
// text/tokenizer.h promises, not only that nothing crashes:
//   - decode(encode(text)) == text for valid UTF-8 text (no normalizer, byte-level BPE);
//   - for any bytes, every id encode() returns is in range;
//   - the incremental detokenizer's pushes and flush concatenate to decode() of the same ids.
// A broken promise aborts, which libFuzzer reports as a crash with the input saved.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_tokenizer.h"
#include "text/tokenizer.h"

namespace {

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "bpe_fuzz: broken promise: %s\n", what);
  std::abort();
}

}  // namespace

// Before libFuzzer's clock starts (see fuzz_tokenizer.h).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)blend::fuzz::llama3_tokenizer();
  (void)blend::fuzz::llama3_chat_template();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const blend::Tokenizer& tokenizer = blend::fuzz::llama3_tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // The first byte picks whether special-token text is parsed, so both paths are fuzzed.
  const bool parse_special = size > 0 && (data[0] & 1);
  const std::vector<int32_t> ids = tokenizer.encode(text, parse_special);
  for (int32_t id : ids) require(id >= 0 && id < tokenizer.vocab_size(), "id in range");

  const std::string decoded = tokenizer.decode(ids);
  const bool valid_utf8 = blend::sanitize_utf8(text) == text;
  if (valid_utf8) require(decoded == text, "decode(encode(text)) == text for valid UTF-8");

  blend::IncrementalDetokenizer detokenizer(tokenizer);
  std::string streamed;
  for (int32_t id : ids) streamed += detokenizer.push(id);
  streamed += detokenizer.flush();
  require(streamed == decoded, "incremental detokenizer == decode()");
  return 0;
}
