#include "kv/page_pool.h"

#include <random>

#include <gtest/gtest.h>

#include "core/error.h"

namespace blend {
namespace {

TEST(PagePool, AllocateIsAllOrNothing) {
  PagePool pool(4, 16);
  std::vector<PageId> a;
  EXPECT_TRUE(pool.allocate(3, a));
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(pool.num_free(), 1);
  std::vector<PageId> b;
  EXPECT_FALSE(pool.allocate(2, b));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.peak_used(), 3);
  pool.release_all(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(pool.num_free(), 4);
  pool.check_invariants();
}

TEST(PagePool, SharedPagesReturnOnLastRelease) {
  PagePool pool(2, 16);
  std::vector<PageId> a;
  ASSERT_TRUE(pool.allocate(1, a));
  pool.retain(a[0]);
  EXPECT_EQ(pool.refcount(a[0]), 2);
  pool.release(a[0]);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(a[0]);
  EXPECT_EQ(pool.num_free(), 2);
  pool.check_invariants();
}

TEST(PagePool, PagesFor) {
  PagePool pool(1, 16);
  EXPECT_EQ(pool.pages_for(0), 0);
  EXPECT_EQ(pool.pages_for(1), 1);
  EXPECT_EQ(pool.pages_for(16), 1);
  EXPECT_EQ(pool.pages_for(17), 2);
}

TEST(PagePool, RandomWorkloadNeverLeaks) {
  PagePool pool(64, 8);
  std::mt19937 rng(1);
  std::vector<std::vector<PageId>> owners(10);
  for (int i = 0; i < 5000; ++i) {
    auto& o = owners[rng() % owners.size()];
    if (rng() % 3 == 0) {
      pool.release_all(o);
    } else {
      pool.allocate(static_cast<int64_t>(rng() % 5), o);
    }
    if (i % 500 == 0) pool.check_invariants();
  }
  for (auto& o : owners) pool.release_all(o);
  EXPECT_EQ(pool.num_free(), 64);
  pool.check_invariants();
}

TEST(PagePoolDeathTest, DoubleFreeAborts) {
  PagePool pool(2, 16);
  std::vector<PageId> a;
  ASSERT_TRUE(pool.allocate(1, a));
  const PageId p = a[0];
  pool.release(p);
  EXPECT_DEATH(pool.release(p), "double free");
}

TEST(PagePool, RejectsEmptyPool) {
  EXPECT_THROW(PagePool(0, 16), Error);
}

}  // namespace
}  // namespace blend
