#include "backend/cpu/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace blend::cpu {

void FreeDeleter::operator()(std::byte* p) const {
  std::free(p);
}

Buffer allocate_buffer(size_t bytes) {
  if (bytes == 0) return nullptr;
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  const size_t size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (!p) throw Error("cpu backend: cannot allocate " + std::to_string(bytes >> 20) + " MiB");
#ifdef MADV_HUGEPAGE
  if (align == kHuge) ::madvise(p, size, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
  return Buffer(static_cast<std::byte*>(p));
}

}  // namespace blend::cpu
