// Fuzzes tokenizer.json loading: arbitrary bytes as a model folder's tokenizer.json (next to
// no tokenizer_config.json). Either a tokenizer that encodes and decodes, or a blend::Error
// naming what is wrong; never a JSON exception, crash, hang or huge allocation.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_file.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = blend::fuzz::write_input("tokenizer.json", data, size);
  try {
    const blend::Tokenizer tokenizer = blend::Tokenizer::from_files(path, {});
    // Whatever loaded must survive use: text with spaces, digits, specials-looking text,
    // bytes that are not UTF-8, and every id (plus out-of-range ones) decoded.
    const std::string text = "Hello, world! 12345 <|eot_id|> \xff\xfe caf\xc3\xa9  \n\t x";
    const std::vector<int32_t> ids = tokenizer.encode(text);
    (void)tokenizer.decode(ids);
    std::vector<int32_t> every;
    for (int32_t id = -1; id <= tokenizer.vocab_size() && every.size() < 4096; ++id)
      every.push_back(id);
    (void)tokenizer.decode(every, /*skip_special=*/true);
  } catch (const blend::Error&) {
  }
  return 0;
}
