#include "text/bpe_tables.h"

#include <algorithm>
#include <array>
#include <memory>

namespace blend::tok {

std::atomic<uint64_t> next_tokenizer_serial{1};

CacheSlot* thread_cache(uint64_t serial) {
  struct Entry {
    uint64_t serial = 0;
    uint64_t last_use = 0;
    std::unique_ptr<CacheSlot[]> slots;
  };
  thread_local std::array<Entry, 4> entries;
  thread_local uint64_t clock = 0;
  ++clock;
  Entry* victim = &entries[0];
  for (Entry& e : entries) {
    if (e.serial == serial) {
      e.last_use = clock;
      return e.slots.get();
    }
    if (e.last_use < victim->last_use) victim = &e;
  }
  if (!victim->slots) victim->slots = std::make_unique<CacheSlot[]>(kCacheSlots);
  std::fill(victim->slots.get(), victim->slots.get() + kCacheSlots, CacheSlot{});
  victim->serial = serial;
  victim->last_use = clock;
  return victim->slots.get();
}

}  // namespace blend::tok
