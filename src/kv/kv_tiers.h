// KvTiers — where cached KV goes when the device's page pool is short (NanoFlow §4.4 and §5.4
// KV offload): host memory first, then a disk directory; each tier has a byte cap and evicts its
// least recently used entries (host entries move to disk, disk entries are dropped). An entry is
// a run of pages gathered into one buffer, so KV moves in a few large copies, not page by page.
//
// Promises:
//  - put() never fails: it makes room by demoting or dropping older entries and reports the
//    entries it dropped, so their owner (the prefix cache) can forget them.
//  - read() returns a whole entry from whichever tier holds it and marks it recently used; a
//    dropped or erased entry reads as absent. A host entry is shared, not copied, and stays
//    valid for whoever holds it after the tiers move or drop it.
//  - Host entries, and entries read back from disk, live in the memory the options name (the
//    backend's host_memory(): pinned on a GPU, so copies to and from the device run at the
//    link's full speed).
//  - The disk tier lives in a fresh subdirectory of the given directory, removed with the object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <list>
#include <memory>
#include <memory_resource>
#include <optional>
#include <unordered_map>
#include <vector>

namespace blend {

struct KvTierOptions {
  int64_t host_bytes = 0;          // 0 = no host tier
  std::filesystem::path disk_dir;  // empty = no disk tier
  int64_t disk_bytes = 0;          // cap of the disk tier
  // Cost model inputs for "load it back or recompute it" (DESIGN.md §3 style: time = bytes /
  // bandwidth, FLOPs / throughput). Defaults are conservative figures for a CPU host.
  double host_bytes_per_s = 5e9;
  double disk_bytes_per_s = 0.5e9;
  // Where host entries and entries read back from disk live; null = the default heap.
  std::pmr::memory_resource* host_memory = nullptr;
};

enum class KvTier { kHost, kDisk };

class KvTiers {
 public:
  using EntryId = uint64_t;
  using Blob = std::pmr::vector<std::byte>;

  // `page_bytes`: what a page weighs on the tiers' books (caps, load times). `buffer_bytes`:
  // what a page's share of an entry's buffer holds; the default is the page's bytes, and 0
  // suits a backend whose pages hold nothing (the simulator charges its moves, KvPageIo moves
  // no bytes), so a simulated host tier of many GB takes no memory here.
  KvTiers(KvTierOptions options, int64_t page_bytes, int64_t buffer_bytes = -1);
  ~KvTiers();
  KvTiers(const KvTiers&) = delete;
  KvTiers& operator=(const KvTiers&) = delete;

  bool enabled() const { return options_.host_bytes > 0 || !disk_path_.empty(); }
  int64_t page_bytes() const { return page_bytes_; }
  int64_t buffer_bytes() const { return buffer_bytes_; }

  // A zeroed buffer of `bytes` in the tiers' host memory, to fill and put().
  Blob make_blob(size_t bytes) const;
  // Stores `blob` (num_pages pages of buffer_bytes()). Appends to `dropped` the entries pushed out
  // of every tier. An entry larger than every tier is dropped at once (and reported).
  EntryId put(Blob blob, int32_t num_pages, std::vector<EntryId>& dropped);
  // The entry's bytes, or null when it is gone.
  std::shared_ptr<const Blob> read(EntryId id);
  void erase(EntryId id);
  // Which tier holds the entry (nullopt when gone) and the seconds to bring `pages` of it back.
  std::optional<KvTier> tier_of(EntryId id) const;
  double load_seconds(EntryId id, int64_t pages) const;

  int64_t host_used() const { return host_used_; }
  int64_t disk_used() const { return disk_used_; }
  int64_t num_entries() const { return static_cast<int64_t>(entries_.size()); }
  int64_t num_demoted() const { return num_demoted_; }
  int64_t num_dropped() const { return num_dropped_; }

 private:
  struct Entry {
    KvTier tier = KvTier::kHost;
    std::shared_ptr<const Blob> data;  // host tier only
    int64_t bytes = 0;                 // on the books: pages x page_bytes
    int32_t num_pages = 0;
    std::list<EntryId>::iterator lru;  // in host_lru_ or disk_lru_
  };
  std::filesystem::path file_of(EntryId id) const;
  void make_room_on_host(int64_t bytes, std::vector<EntryId>& dropped);
  void make_room_on_disk(int64_t bytes, std::vector<EntryId>& dropped);
  void drop(EntryId id, std::vector<EntryId>& dropped);
  bool to_disk(EntryId id, Entry& e, std::vector<EntryId>& dropped);

  KvTierOptions options_;
  std::pmr::memory_resource* host_memory_;
  int64_t page_bytes_;
  int64_t buffer_bytes_;
  std::filesystem::path disk_path_;  // our own subdirectory
  std::unordered_map<EntryId, Entry> entries_;
  std::list<EntryId> host_lru_, disk_lru_;  // front = least recently used
  int64_t host_used_ = 0, disk_used_ = 0;
  EntryId next_id_ = 1;
  int64_t num_demoted_ = 0, num_dropped_ = 0;
};

}  // namespace blend
