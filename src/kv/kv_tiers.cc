#include "kv/kv_tiers.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <system_error>

#include "core/error.h"

namespace blend {

KvTiers::KvTiers(KvTierOptions options, int64_t page_bytes, int64_t buffer_bytes)
    : options_(std::move(options)),
      host_memory_(options_.host_memory ? options_.host_memory : std::pmr::get_default_resource()),
      page_bytes_(page_bytes),
      buffer_bytes_(buffer_bytes < 0 ? page_bytes : buffer_bytes) {
  if (!options_.disk_dir.empty()) {
    if (options_.disk_bytes <= 0) throw Error("--kv-disk needs a positive size cap");
    static std::atomic<int> instance{0};
    disk_path_ = options_.disk_dir /
                 ("blend-kv-" + std::to_string(::getpid()) + "-" + std::to_string(instance++));
    std::error_code ec;
    std::filesystem::create_directories(disk_path_, ec);
    if (ec)
      throw Error("cannot create the KV disk tier " + disk_path_.string() + ": " + ec.message());
  }
}

KvTiers::~KvTiers() {
  if (disk_path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(disk_path_, ec);  // a cache: nothing in it outlives the process
}

std::filesystem::path KvTiers::file_of(EntryId id) const {
  return disk_path_ / (std::to_string(id) + ".kv");
}

void KvTiers::drop(EntryId id, std::vector<EntryId>& dropped) {
  erase(id);
  dropped.push_back(id);
  ++num_dropped_;
}

bool KvTiers::to_disk(EntryId id, Entry& e, std::vector<EntryId>& dropped) {
  if (disk_path_.empty() || e.bytes > options_.disk_bytes) return false;
  make_room_on_disk(e.bytes, dropped);
  std::ofstream out(file_of(id), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(e.data->data()),
            static_cast<std::streamsize>(e.data->size()));
  if (!out) return false;  // a full disk costs recomputation, never a wrong result
  host_lru_.erase(e.lru);
  host_used_ -= e.bytes;
  e.data.reset();
  e.tier = KvTier::kDisk;
  disk_used_ += e.bytes;
  e.lru = disk_lru_.insert(disk_lru_.end(), id);
  ++num_demoted_;
  return true;
}

void KvTiers::make_room_on_disk(int64_t bytes, std::vector<EntryId>& dropped) {
  while (disk_used_ + bytes > options_.disk_bytes && !disk_lru_.empty())
    drop(disk_lru_.front(), dropped);
}

void KvTiers::make_room_on_host(int64_t bytes, std::vector<EntryId>& dropped) {
  while (host_used_ + bytes > options_.host_bytes && !host_lru_.empty()) {
    const EntryId victim = host_lru_.front();
    if (!to_disk(victim, entries_.at(victim), dropped)) drop(victim, dropped);
  }
}

KvTiers::Blob KvTiers::make_blob(size_t bytes) const {
  return Blob(bytes, std::byte{0}, host_memory_);
}

KvTiers::EntryId KvTiers::put(Blob blob, int32_t num_pages, std::vector<EntryId>& dropped) {
  const EntryId id = next_id_++;
  Entry e;
  if (static_cast<int64_t>(blob.size()) != int64_t{num_pages} * buffer_bytes_)
    throw Error("internal: KV tier entry of the wrong size");
  e.bytes = int64_t{num_pages} * page_bytes_;
  e.num_pages = num_pages;
  if (e.bytes <= options_.host_bytes) {
    make_room_on_host(e.bytes, dropped);
    e.data = std::make_shared<const Blob>(std::move(blob));
    host_used_ += e.bytes;
    e.lru = host_lru_.insert(host_lru_.end(), id);
    entries_.emplace(id, std::move(e));
    return id;
  }
  // Too big for the host tier (or none): straight to disk.
  e.data = std::make_shared<const Blob>(std::move(blob));
  host_used_ += e.bytes;  // to_disk() moves it off the host tier's books
  e.lru = host_lru_.insert(host_lru_.end(), id);
  Entry& stored = entries_.emplace(id, std::move(e)).first->second;
  if (!to_disk(id, stored, dropped)) drop(id, dropped);
  return id;
}

std::shared_ptr<const KvTiers::Blob> KvTiers::read(EntryId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  if (e.tier == KvTier::kHost) {
    host_lru_.splice(host_lru_.end(), host_lru_, e.lru);
    return e.data;
  }
  disk_lru_.splice(disk_lru_.end(), disk_lru_, e.lru);
  auto data =
      std::make_shared<Blob>(make_blob(static_cast<size_t>(int64_t{e.num_pages} * buffer_bytes_)));
  std::ifstream in(file_of(id), std::ios::binary);
  in.read(reinterpret_cast<char*>(data->data()), static_cast<std::streamsize>(data->size()));
  if (!in) return nullptr;  // unreadable: the caller recomputes
  return data;
}

void KvTiers::erase(EntryId id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (e.tier == KvTier::kHost) {
    host_lru_.erase(e.lru);
    host_used_ -= e.bytes;
  } else {
    disk_lru_.erase(e.lru);
    disk_used_ -= e.bytes;
    std::error_code ec;
    std::filesystem::remove(file_of(id), ec);
  }
  entries_.erase(it);
}

std::optional<KvTier> KvTiers::tier_of(EntryId id) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.tier;
}

double KvTiers::load_seconds(EntryId id, int64_t pages) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return 1e30;
  // A disk entry is read whole; a host entry is copied page by page.
  if (it->second.tier == KvTier::kDisk)
    return static_cast<double>(it->second.bytes) / options_.disk_bytes_per_s;
  return static_cast<double>(pages * page_bytes_) / options_.host_bytes_per_s;
}

}  // namespace blend
