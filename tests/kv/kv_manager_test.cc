// KvManager: the page mechanics the scheduler asks for (issue 24 moved them out of the
// scheduler), checked on a real PagePool and RadixCache.
#include "kv/kv_manager.h"

#include <gtest/gtest.h>

namespace blend {
namespace {

constexpr int32_t kPage = 4;

Sequence sequence(SeqId id, int32_t prompt_tokens, TokenId first = 100) {
  Sequence s;
  s.id = id;
  for (int32_t i = 0; i < prompt_tokens; ++i) s.tokens.push_back(first + i);
  s.prompt_len = prompt_tokens;
  s.params.max_tokens = 4;
  return s;
}

KvManager::Peers no_peers(const std::vector<Sequence*>& running) {
  return {running, [](const Sequence&) { return false; }};
}

TEST(KvManager, GrowTakesThePagesForTheNewTokensOrNothing) {
  PagePool pool(4, kPage);
  KvManager kv(pool, nullptr, false, 0);
  const std::vector<Sequence*> running;
  Sequence a = sequence(1, 10);
  KvStepOps ops;
  ASSERT_TRUE(kv.grow(&a, 10, ops, no_peers(running)));
  EXPECT_EQ(a.block_table.size(), 3u);  // ceil(10 / 4)
  EXPECT_EQ(pool.num_free(), 1);
  a.num_computed = 10;
  EXPECT_TRUE(kv.grow(&a, 2, ops, no_peers(running)));  // 12 tokens: still three pages
  EXPECT_EQ(a.block_table.size(), 3u);
  Sequence b = sequence(2, 8);
  EXPECT_FALSE(kv.grow(&b, 8, ops, no_peers(running)));  // two pages wanted, one free
  EXPECT_TRUE(b.block_table.empty());
  EXPECT_EQ(pool.num_free(), 1);
  kv.drop(&a, nullptr);
  EXPECT_TRUE(a.block_table.empty());
  EXPECT_EQ(a.num_computed, 0);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_TRUE(ops.copies.empty() && ops.checkpoints.empty() && ops.restores.empty());
}

TEST(KvManager, AFinishedPrefixIsReusedAndItsPartlyMatchedPageCopied) {
  PagePool pool(8, kPage);
  RadixCache cache(pool);
  KvManager kv(pool, &cache, false, 0);
  const std::vector<Sequence*> running;
  Sequence a = sequence(1, 10);
  KvStepOps ops;
  ASSERT_TRUE(kv.reuse_cached_prefix(&a, ops));  // empty cache: nothing reused
  EXPECT_EQ(a.num_computed, 0);
  ASSERT_TRUE(kv.grow(&a, 10, ops, no_peers(running)));
  kv.claim(a, 0);
  a.num_computed = 10;
  kv.computed(a);
  const std::vector<PageId> a_pages = a.block_table;
  kv.release_finished(&a);
  EXPECT_EQ(pool.num_available(), 8);  // idle cached pages count as available

  // The same 10-token prompt: the two full pages are shared, the third (2 of its 4 slots
  // computed, and the last token must be computed again for its logits) is copied.
  Sequence b = sequence(2, 10);
  ASSERT_TRUE(kv.reuse_cached_prefix(&b, ops));
  ASSERT_EQ(b.block_table.size(), 3u);
  EXPECT_EQ(b.block_table[0], a_pages[0]);
  EXPECT_EQ(b.block_table[1], a_pages[1]);
  EXPECT_EQ(b.num_computed, 9);
  ASSERT_EQ(ops.copies.size(), 1u);
  EXPECT_EQ(ops.copies[0].first, a_pages[2]);
  EXPECT_EQ(ops.copies[0].second, b.block_table[2]);
  // An admission that fails after all gives the copy's source reference back.
  const int64_t available = pool.num_available();
  kv.undo_copies(ops, 0);
  EXPECT_TRUE(ops.copies.empty());
  kv.drop(&b, &ops);
  EXPECT_EQ(pool.num_available(), 8);
  EXPECT_GT(pool.num_available(), available);
  pool.check_invariants();
}

TEST(KvManager, GrowEvictsIdleCachedPagesWhenThePoolIsShort) {
  PagePool pool(4, kPage);
  RadixCache cache(pool);
  KvManager kv(pool, &cache, false, 0);
  const std::vector<Sequence*> running;
  Sequence a = sequence(1, 16);
  KvStepOps ops;
  ASSERT_TRUE(kv.grow(&a, 16, ops, no_peers(running)));
  a.num_computed = 16;
  kv.computed(a);
  kv.release_finished(&a);
  EXPECT_EQ(pool.num_free(), 0);                // all four pages idle in the cache
  Sequence b = sequence(2, 12, /*first=*/500);  // shares nothing with a
  ASSERT_TRUE(kv.grow(&b, 12, ops, no_peers(running)));
  EXPECT_EQ(b.block_table.size(), 3u);
  EXPECT_EQ(pool.num_free(), 0);
  pool.check_invariants();
}

}  // namespace
}  // namespace blend
