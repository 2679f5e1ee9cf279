// Fuzzes the GGUF header reader (magic, version, counts, strings, arrays, tensor infos).
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "fuzz_file.h"
#include "gguf/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = blend::fuzz::write_input("model.gguf", data, size);
  try {
    (void)blend::read_gguf(path);
  } catch (const blend::Error&) {
  }
  return 0;
}
