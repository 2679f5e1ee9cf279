// Internal to the tokenizer. Hashing and flat tables: the vocabulary and merge lookups are the
// inner loop of BPE, so they avoid std::string temporaries and node-based maps. And the
// per-thread cache of piece -> ids.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace blend::tok {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix64(h ^ w) + 0x9E3779B97F4A7C15ull;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  return mix64(h ^ w);
}

inline size_t table_capacity(size_t n) {
  size_t cap = 16;
  while (cap < n + n / 2 + 1) cap <<= 1;
  return cap;
}

// String -> id, open addressing; the keys live in a vector owned by the caller (indexed by id).
class StringIdTable {
 public:
  void init(const std::vector<std::string>* keys, size_t expected) {
    keys_ = keys;
    slots_.assign(table_capacity(expected), 0);
    mask_ = slots_.size() - 1;
  }
  // Inserts id under (*keys_)[id]; an existing entry with the same key is replaced.
  void insert(int32_t id) {
    const std::string& key = (*keys_)[static_cast<size_t>(id)];
    const uint64_t h = hash_bytes(key);
    const uint64_t tag = h >> 32;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      uint64_t& slot = slots_[i];
      if (slot == 0 || ((slot >> 32) == tag && (*keys_)[static_cast<uint32_t>(slot) - 1] == key)) {
        slot = (tag << 32) | (static_cast<uint64_t>(id) + 1);
        return;
      }
    }
  }
  int32_t find(std::string_view key) const {
    const uint64_t h = hash_bytes(key);
    const uint64_t tag = h >> 32;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const uint64_t slot = slots_[i];
      if (slot == 0) return -1;
      const auto id = static_cast<uint32_t>(slot) - 1;
      if ((slot >> 32) == tag && (*keys_)[id] == key) return static_cast<int32_t>(id);
    }
  }

 private:
  const std::vector<std::string>* keys_ = nullptr;
  std::vector<uint64_t> slots_;  // (hash >> 32) << 32 | (id + 1); 0 = empty
  size_t mask_ = 0;
};

// (left id, right id) -> (merge rank, merged id), open addressing.
class PairTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = kNoRank;
    int32_t merged = -1;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  void init(size_t expected) {
    entries_.assign(table_capacity(expected), Entry{});
    mask_ = entries_.size() - 1;
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // A pair listed twice keeps its last rank (as the Rust and JavaScript tokenizers do).
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t k = key(a, b);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      Entry& e = entries_[i];
      if (e.key == kEmpty || e.key == k) {
        e = Entry{k, rank, merged};
        return;
      }
    }
  }
  const Entry* find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == k) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  std::vector<Entry> entries_;
  size_t mask_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Per-thread cache of piece -> ids. Direct-mapped fixed-size slots: no allocation after the
// first use, bounded memory (256 KiB per thread and tokenizer), no locks. Tokenizers are told
// apart by a serial number that is never reused, so a cache never outlives its meaning.

constexpr size_t kMaxCachedKey = 22;
constexpr size_t kMaxCachedIds = 8;
constexpr size_t kCacheSlots = 4096;
struct CacheSlot {
  uint64_t hash = 0;
  uint8_t key_len = 0;  // 0 = empty (empty pieces are never cached)
  uint8_t n_ids = 0;
  char key[kMaxCachedKey] = {};
  int32_t ids[kMaxCachedIds] = {};
};
static_assert(sizeof(CacheSlot) == 64);

extern std::atomic<uint64_t> next_tokenizer_serial;

// This thread's kCacheSlots slots for the tokenizer with this serial number.
CacheSlot* thread_cache(uint64_t serial);

}  // namespace blend::tok
