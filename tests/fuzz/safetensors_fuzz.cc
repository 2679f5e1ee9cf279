// Fuzzes SafetensorsFile::open (header length, JSON header, offsets, the exact-tiling check):
// any input is either a file whose every tensor lies inside the data section, or a
// blend::Error. Tensor bytes are touched so that ASan sees any view outside the mapping.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "fuzz_file.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = blend::fuzz::write_input("model.safetensors", data, size);
  try {
    auto file = blend::SafetensorsFile::open(path);
    volatile uint8_t sink = 0;
    for (const auto& [name, view] : file->tensors())
      if (view.nbytes)
        sink = sink ^ static_cast<uint8_t>(view.data[0]) ^
               static_cast<uint8_t>(view.data[view.nbytes - 1]);
  } catch (const blend::Error&) {
  }
  return 0;
}
