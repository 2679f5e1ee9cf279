// Large, long-lived buffers of the cpu backend (packed weights, KV cache, activations): 64-byte
// aligned, and backed by transparent huge pages where the kernel allows it, because the GEMMs
// stream hundreds of MB of weights and attention reads KV pages scattered over GBs; with 4 KiB
// pages nearly every 2 KiB KV block costs a TLB miss.
#pragma once

#include <cstddef>
#include <memory>

namespace blend::cpu {

struct FreeDeleter {
  void operator()(std::byte* p) const;
};
using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;

// Uninitialised; throws blend::Error when the memory is not available. `bytes` may be 0 (null).
Buffer allocate_buffer(size_t bytes);

}  // namespace blend::cpu
