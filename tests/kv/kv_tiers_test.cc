#include "kv/kv_tiers.h"

#include <cstring>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/radix_cache.h"
#include "test_util.h"

namespace blend {
namespace {

constexpr int64_t kPageBytes = 64;

KvTiers::Blob blob(int32_t pages, uint8_t fill) {
  return KvTiers::Blob(static_cast<size_t>(pages * kPageBytes), std::byte{fill});
}

size_t files_in(const std::filesystem::path& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    n += e.is_regular_file() ? 1 : 0;
  return n;
}

// A backend whose pages hold nothing (the simulator) hands the tiers empty buffers: entries
// weigh their pages on the books (caps, eviction order, load times) and hold no bytes, on the
// host and on disk alike.
TEST(KvTiers, EmptyBuffersWeighTheirPagesOnTheBooks) {
  testing::TempDir dir;
  KvTierOptions o;
  o.host_bytes = 2 * kPageBytes;
  o.host_bytes_per_s = 64.0;  // one page a second
  o.disk_dir = dir.path();
  o.disk_bytes = 4 * kPageBytes;
  KvTiers tiers(o, kPageBytes, /*buffer_bytes=*/0);
  std::vector<KvTiers::EntryId> dropped;
  const auto a = tiers.put({}, 2, dropped);
  EXPECT_EQ(tiers.host_used(), 2 * kPageBytes);
  EXPECT_DOUBLE_EQ(tiers.load_seconds(a, 2), 2.0);
  const auto b = tiers.put({}, 1, dropped);  // the host is full: a goes to disk
  EXPECT_EQ(tiers.tier_of(a), KvTier::kDisk);
  EXPECT_EQ(tiers.tier_of(b), KvTier::kHost);
  EXPECT_EQ(tiers.host_used(), kPageBytes);
  EXPECT_EQ(tiers.disk_used(), 2 * kPageBytes);
  auto from_disk = tiers.read(a);
  ASSERT_TRUE(from_disk);
  EXPECT_TRUE(from_disk->empty());
  EXPECT_TRUE(dropped.empty());
  EXPECT_THROW(tiers.put(blob(1, 1), 1, dropped), Error);  // bytes where none belong
}

TEST(KvTiers, HostEntriesMoveToDiskThenDropLeastRecentlyUsedFirst) {
  testing::TempDir dir;
  KvTierOptions o;
  o.host_bytes = 2 * kPageBytes;
  o.disk_dir = dir.path();
  o.disk_bytes = 2 * kPageBytes;
  std::vector<KvTiers::EntryId> dropped;
  {
    KvTiers tiers(o, kPageBytes);
    const auto a = tiers.put(blob(1, 1), 1, dropped);
    const auto b = tiers.put(blob(1, 2), 1, dropped);
    EXPECT_EQ(tiers.tier_of(a), KvTier::kHost);
    ASSERT_TRUE(tiers.read(a));  // a is now more recent than b
    const auto c = tiers.put(blob(1, 3), 1, dropped);
    EXPECT_EQ(tiers.tier_of(b), KvTier::kDisk);  // b was least recently used on the host
    EXPECT_EQ(tiers.tier_of(a), KvTier::kHost);
    EXPECT_EQ(tiers.tier_of(c), KvTier::kHost);
    EXPECT_TRUE(dropped.empty());
    auto from_disk = tiers.read(b);
    ASSERT_TRUE(from_disk);
    EXPECT_EQ(*from_disk, blob(1, 2));
    // A 2-page entry: the host sends a (LRU) and c to disk, where b (LRU there) is dropped.
    const auto d = tiers.put(blob(2, 4), 2, dropped);
    EXPECT_EQ(tiers.tier_of(d), KvTier::kHost);
    EXPECT_EQ(dropped, std::vector<KvTiers::EntryId>{b});
    EXPECT_FALSE(tiers.read(b));
    EXPECT_LE(tiers.disk_used(), o.disk_bytes);
    EXPECT_LE(tiers.host_used(), o.host_bytes);
    EXPECT_EQ(files_in(dir.path()), 2u);
    // Bigger than every tier: dropped at once.
    dropped.clear();
    const auto huge = tiers.put(blob(5, 5), 5, dropped);
    EXPECT_EQ(dropped, std::vector<KvTiers::EntryId>{huge});
    tiers.erase(a);
    EXPECT_FALSE(tiers.tier_of(a));
  }
  EXPECT_EQ(files_in(dir.path()), 0u);  // the disk tier goes with the object
}

// Memory that counts what it hands out (a backend's host_memory(): pinned on a GPU).
class CountingMemory : public std::pmr::memory_resource {
 public:
  int64_t live_bytes = 0, allocations = 0;

 private:
  void* do_allocate(size_t bytes, size_t align) override {
    live_bytes += static_cast<int64_t>(bytes);
    ++allocations;
    return std::pmr::new_delete_resource()->allocate(bytes, align);
  }
  void do_deallocate(void* p, size_t bytes, size_t align) override {
    live_bytes -= static_cast<int64_t>(bytes);
    std::pmr::new_delete_resource()->deallocate(p, bytes, align);
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }
};

// Host entries and entries read back from disk live in the memory the options name; a host
// entry is read without a copy, and one held by a reader stays whole after the tiers demote it.
TEST(KvTiers, EntriesLiveInTheGivenHostMemoryAndReadsShareThem) {
  testing::TempDir dir;
  CountingMemory memory;
  KvTierOptions o;
  o.host_bytes = 2 * kPageBytes;
  o.disk_dir = dir.path();
  o.disk_bytes = 8 * kPageBytes;
  o.host_memory = &memory;
  std::vector<KvTiers::EntryId> dropped;
  {
    KvTiers tiers(o, kPageBytes);
    KvTiers::Blob a_bytes = tiers.make_blob(2 * kPageBytes);
    EXPECT_EQ(a_bytes.get_allocator().resource(), &memory);
    EXPECT_EQ(memory.live_bytes, 2 * kPageBytes);
    std::fill(a_bytes.begin(), a_bytes.end(), std::byte{7});
    const auto a = tiers.put(std::move(a_bytes), 2, dropped);
    const std::shared_ptr<const KvTiers::Blob> first = tiers.read(a), second = tiers.read(a);
    ASSERT_TRUE(first);
    EXPECT_EQ(first.get(), second.get());  // shared, not copied
    EXPECT_EQ(memory.live_bytes, 2 * kPageBytes);
    tiers.put(tiers.make_blob(2 * kPageBytes), 2, dropped);  // a goes to disk
    ASSERT_EQ(tiers.tier_of(a), KvTier::kDisk);
    EXPECT_EQ(*first, KvTiers::Blob(2 * kPageBytes, std::byte{7}));  // the reader's copy stays
    const std::shared_ptr<const KvTiers::Blob> from_disk = tiers.read(a);
    ASSERT_TRUE(from_disk);
    EXPECT_EQ(from_disk->get_allocator().resource(), &memory);
    EXPECT_EQ(*from_disk, *first);
    EXPECT_TRUE(dropped.empty());
    // a as first read (held here), the second entry on the host, a as read back from disk.
    EXPECT_EQ(memory.live_bytes, 6 * kPageBytes);
    EXPECT_EQ(memory.allocations, 3);
  }
  EXPECT_EQ(memory.live_bytes, 0);  // all of it goes back to the memory it came from
}

// Device pages as plain memory: a page's content records which tokens it holds, so a test can
// check that what comes back from the tiers is the right KV in the right place.
class FakeDevice : public KvPageIo {
 public:
  explicit FakeDevice(int64_t pages) : data_(static_cast<size_t>(pages * kPageBytes)) {}
  void read_pages(std::span<const PageId> pages, std::byte* out) override {
    for (PageId p : pages) std::memcpy(out, at(p), kPageBytes), out += kPageBytes;
  }
  void write_pages(std::span<const PageId> pages, const std::byte* in) override {
    for (PageId p : pages) std::memcpy(at(p), in, kPageBytes), in += kPageBytes;
  }
  // "Computes" the KV of tokens[i * ps, (i + 1) * ps) into page p: a digest of the whole prefix.
  void compute(PageId p, std::span<const TokenId> prefix) { fill(at(p), prefix); }
  bool holds(PageId p, std::span<const TokenId> prefix) {
    std::byte expect[kPageBytes];
    fill(expect, prefix);
    return std::memcmp(expect, at(p), kPageBytes) == 0;
  }

 private:
  std::byte* at(PageId p) { return data_.data() + static_cast<size_t>(p) * kPageBytes; }
  static void fill(std::byte* out, std::span<const TokenId> prefix) {
    uint64_t h = 1469598103934665603ull;
    for (TokenId t : prefix) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
    for (int64_t i = 0; i < kPageBytes; ++i)
      out[i] = std::byte(static_cast<uint8_t>(h >> (i % 8 * 8)));
  }
  std::vector<std::byte> data_;
};

// Sequences over a small alphabet come and go on a pool far too small for them; evicted pages
// go to a small host tier and a smaller disk tier and come back on later matches. Every page a
// match returns must hold exactly the KV of its prefix, and the tree, the pool and the tiers
// must stay consistent.
TEST(KvTiers, RadixCacheLoadsBackExactlyWhatItOffloaded) {
  constexpr int32_t kPs = 4;
  testing::TempDir dir;
  KvTierOptions o;
  o.host_bytes = 6 * kPageBytes;
  o.disk_dir = dir.path();
  o.disk_bytes = 10 * kPageBytes;
  o.host_bytes_per_s = 1e12;
  o.disk_bytes_per_s = 1e12;
  KvTiers tiers(o, kPageBytes);
  PagePool pool(12, kPs);
  FakeDevice device(12);
  RadixCacheTiers t{&tiers, &device, /*recompute_seconds_per_token=*/1.0, /*max_run_pages=*/3};
  RadixCache cache(pool, t);
  auto allocate = [&](int64_t n, std::vector<PageId>& out) {
    if (pool.num_free() < n) cache.evict(n - pool.num_free());
    return pool.allocate(n, out);
  };
  std::mt19937 rng(3);
  int64_t loaded_checked = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<TokenId> tokens(2 + rng() % 14);
    for (auto& x : tokens) x = static_cast<TokenId>(rng() % 2);
    const auto n = static_cast<int32_t>(tokens.size());
    const SeqId id = iter + 1;
    const int64_t loads_before = cache.num_loaded_pages();
    PrefixMatch m = cache.match(tokens, n - 1, id, allocate);
    ASSERT_FALSE(m.claimed_by_other);
    for (size_t i = 0; i < m.pages.size(); ++i)
      ASSERT_TRUE(device.holds(m.pages[i], std::span(tokens).first((i + 1) * kPs)))
          << "iteration " << iter << " page " << i;
    loaded_checked += cache.num_loaded_pages() - loads_before;
    std::vector<PageId> pages = m.pages;
    if (m.partial_page >= 0) pool.release(m.partial_page);  // no copy: recompute that page
    const int64_t need = pool.pages_for(n) - static_cast<int64_t>(pages.size());
    if (!allocate(need, pages)) {
      pool.release_all(pages);
      continue;
    }
    for (size_t i = m.pages.size(); i < pages.size(); ++i)
      device.compute(pages[i], std::span(tokens).first(std::min<size_t>((i + 1) * kPs, n)));
    if (rng() % 3 == 0)
      cache.insert_finished(id, tokens, n, pages);
    else
      cache.insert(id, tokens, n, pages), cache.forget(id);
    pool.release_all(pages);
    cache.check_invariants();
    pool.check_invariants();
    ASSERT_LE(tiers.host_used(), o.host_bytes);
    ASSERT_LE(tiers.disk_used(), o.disk_bytes);
  }
  EXPECT_GT(cache.num_offloaded_pages(), 0);
  EXPECT_GT(loaded_checked, 0);
  EXPECT_GT(tiers.num_demoted(), 0);
  EXPECT_GT(tiers.num_dropped(), 0);
  cache.evict(pool.num_pages());
  EXPECT_EQ(pool.num_free(), pool.num_pages());
}

TEST(KvTiers, RecomputingWinsWhenLoadingIsSlower) {
  constexpr int32_t kPs = 4;
  KvTierOptions o;
  o.host_bytes = 100 * kPageBytes;
  o.host_bytes_per_s = 1;  // absurdly slow host memory
  KvTiers tiers(o, kPageBytes);
  PagePool pool(4, kPs);
  FakeDevice device(4);
  RadixCache cache(pool, RadixCacheTiers{&tiers, &device, 1e-6, 64});
  auto allocate = [&](int64_t n, std::vector<PageId>& out) {
    if (pool.num_free() < n) cache.evict(n - pool.num_free());
    return pool.allocate(n, out);
  };
  std::vector<TokenId> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.allocate(3, pages));
  cache.insert_finished(1, tokens, 9, pages);
  pool.release_all(pages);
  EXPECT_EQ(cache.evict(4), 3);
  EXPECT_EQ(cache.num_offloaded_pages(), 3);
  PrefixMatch m = cache.match(tokens, 8, 2, allocate);
  EXPECT_TRUE(m.pages.empty());  // not worth loading: computed again instead
  EXPECT_EQ(cache.num_loaded_pages(), 0);
}

}  // namespace
}  // namespace blend
