#include "kv/radix_cache.h"

#include <random>

#include <gtest/gtest.h>

namespace blend {
namespace {

constexpr int32_t kPage = 4;

std::vector<TokenId> iota_tokens(int32_t n, TokenId first = 100) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// A sequence that computed all of `tokens` in fresh pages, as the scheduler would leave it.
struct FakeSeq {
  SeqId id;
  std::vector<TokenId> tokens;
  std::vector<PageId> pages;
};

FakeSeq computed(PagePool& pool, SeqId id, std::vector<TokenId> tokens) {
  FakeSeq s{id, std::move(tokens), {}};
  EXPECT_TRUE(pool.allocate(pool.pages_for(static_cast<int64_t>(s.tokens.size())), s.pages));
  return s;
}

void release(PagePool& pool, PrefixMatch& m) {
  pool.release_all(m.pages);
  if (m.partial_page >= 0) pool.release(m.partial_page);
}

TEST(RadixCache, SharesFullPagesOfARunningSequence) {
  PagePool pool(32, kPage);
  RadixCache cache(pool);
  FakeSeq a = computed(pool, 1, iota_tokens(10));  // pages: [100..103] [104..107] [108 109]
  cache.insert(a.id, a.tokens, 10, a.pages);
  EXPECT_EQ(cache.num_nodes(), 3);  // the page being filled too, with its computed tokens

  auto b_tokens = iota_tokens(9);
  b_tokens.push_back(7);  // differs at position 9
  PrefixMatch m = cache.match(b_tokens, 9, 2);
  ASSERT_EQ(m.pages.size(), 2u);
  EXPECT_EQ(m.pages[0], a.pages[0]);
  EXPECT_EQ(m.pages[1], a.pages[1]);
  EXPECT_EQ(m.partial_page, a.pages[2]);  // A's page being filled holds B's 9th token
  EXPECT_EQ(m.partial_tokens, 1);
  EXPECT_EQ(pool.refcount(a.pages[0]), 3);  // A, the tree, B
  release(pool, m);
  cache.check_invariants();
}

TEST(RadixCache, PartlyMatchingPagesAreCopyOnWriteSources) {
  PagePool pool(32, kPage);
  RadixCache cache(pool);
  FakeSeq a = computed(pool, 1, iota_tokens(10));
  cache.insert_finished(a.id, a.tokens, 10, a.pages);
  pool.release_all(a.pages);
  EXPECT_EQ(cache.num_nodes(), 3);  // the partial last page [108 109] too
  EXPECT_EQ(pool.num_cached_idle(), 3);

  // Same prompt: everything but the last token is served; the last page holds only one of the
  // two tokens the match may use, so it is a copy-on-write source.
  PrefixMatch same = cache.match(iota_tokens(10), 9, 2);
  EXPECT_EQ(same.pages.size(), 2u);
  EXPECT_GE(same.partial_page, 0);
  EXPECT_EQ(same.partial_tokens, 1);
  EXPECT_EQ(same.num_tokens(kPage), 9);
  release(pool, same);

  // A prompt leaving the second page midway: one full page, three tokens of the second.
  auto c_tokens = iota_tokens(7);
  c_tokens.push_back(1);
  c_tokens.push_back(2);
  PrefixMatch mid = cache.match(c_tokens, 8, 3);
  EXPECT_EQ(mid.pages.size(), 1u);
  EXPECT_EQ(mid.partial_tokens, 3);
  EXPECT_EQ(mid.num_tokens(kPage), 7);
  release(pool, mid);
  cache.check_invariants();
}

// Many prompts leave a shared prefix in the middle of a page (a few-shot prefix followed by each
// question): their second pages all start with the same two tokens. The exact page is found,
// and a prompt that shares three tokens of it with one of them (sorting before or after that
// one) copies that one's page, not any of the siblings sharing only two.
TEST(RadixCache, SiblingsSharingLeadingTokensAreToldApart) {
  constexpr int kSiblings = 40;
  PagePool pool(4 * kSiblings, kPage);
  RadixCache cache(pool);
  std::vector<FakeSeq> seqs;
  for (int k = 0; k < kSiblings; ++k) {
    std::vector<TokenId> t = iota_tokens(4);
    for (TokenId x : {7, 8, 1000 + k, 2000 + k}) t.push_back(x);
    seqs.push_back(computed(pool, k + 1, t));
    cache.insert_finished(seqs.back().id, seqs.back().tokens, 8, seqs.back().pages);
  }
  cache.check_invariants();
  for (int k : {0, 17, kSiblings - 1}) {
    std::vector<TokenId> query = seqs[static_cast<size_t>(k)].tokens;
    query.push_back(5);
    PrefixMatch exact = cache.match(query, 8, 100);
    ASSERT_EQ(exact.pages.size(), 2u);
    EXPECT_EQ(exact.pages[1], seqs[static_cast<size_t>(k)].pages[1]);
    release(pool, exact);
    for (TokenId last : {1, 5000}) {  // before and after the sibling in token order
      query[7] = last;
      PrefixMatch part = cache.match(query, 8, 100);
      ASSERT_EQ(part.pages.size(), 1u);
      EXPECT_EQ(part.partial_page, seqs[static_cast<size_t>(k)].pages[1]);
      EXPECT_EQ(part.partial_tokens, 3);
      release(pool, part);
    }
    query[6] = 3000;  // shares two tokens with every sibling
    PrefixMatch two = cache.match(query, 8, 100);
    EXPECT_EQ(two.partial_tokens, 2);
    release(pool, two);
  }
  cache.check_invariants();
}

TEST(RadixCache, DuplicatesCollapseOntoTheCachedPage) {
  PagePool pool(32, kPage);
  RadixCache cache(pool);
  FakeSeq a = computed(pool, 1, iota_tokens(8));
  FakeSeq b = computed(pool, 2, iota_tokens(8));  // computed the same tokens in its own pages
  cache.insert(a.id, a.tokens, 8, a.pages);
  const int64_t free_before = pool.num_free();
  cache.insert(b.id, b.tokens, 8, b.pages);
  EXPECT_EQ(b.pages, a.pages);  // switched to the tree's pages
  EXPECT_EQ(pool.num_free(), free_before + 2);
  EXPECT_EQ(cache.num_nodes(), 2);
  cache.forget(a.id);
  cache.forget(b.id);
  pool.release_all(a.pages);
  pool.release_all(b.pages);
  EXPECT_EQ(cache.evict(100), 2);
  EXPECT_EQ(pool.num_free(), pool.num_pages());
}

TEST(RadixCache, ClaimedPagesMakeOthersWait) {
  PagePool pool(32, kPage);
  RadixCache cache(pool);
  const auto prompt = iota_tokens(12);
  cache.claim(1, prompt, 0, 12);
  PrefixMatch m = cache.match(prompt, 11, 2);
  EXPECT_TRUE(m.claimed_by_other);
  EXPECT_TRUE(m.pages.empty());
  EXPECT_FALSE(cache.match(prompt, 11, 1).claimed_by_other);  // not by its own claim
  auto other = prompt;
  other[0] = 5;  // a different first page is not claimed
  EXPECT_FALSE(cache.match(other, 11, 2).claimed_by_other);
  cache.forget(1);
  EXPECT_FALSE(cache.match(prompt, 11, 2).claimed_by_other);
  // A claim on part of a page counts too: the 3 tokens B may reuse are all A will compute.
  cache.claim(3, std::vector<TokenId>{100, 101, 102}, 0, 3);
  EXPECT_TRUE(cache.match(std::vector<TokenId>{100, 101, 102, 50}, 3, 2).claimed_by_other);
  // Once A's tokens are in the tree, there is nothing more to wait for.
  FakeSeq a = computed(pool, 3, {100, 101, 102});
  cache.insert(a.id, a.tokens, 3, a.pages);
  PrefixMatch hit = cache.match(std::vector<TokenId>{100, 101, 102, 50}, 3, 2);
  EXPECT_FALSE(hit.claimed_by_other);
  EXPECT_EQ(hit.partial_tokens, 3);
  release(pool, hit);
}

TEST(RadixCache, EvictsLeastRecentlyUsedIdleLeavesOnly) {
  PagePool pool(6, kPage);
  RadixCache cache(pool);
  FakeSeq a = computed(pool, 1, iota_tokens(8, 100));
  FakeSeq b = computed(pool, 2, iota_tokens(8, 200));
  cache.insert_finished(a.id, a.tokens, 8, a.pages);
  cache.insert_finished(b.id, b.tokens, 8, b.pages);
  pool.release_all(a.pages);
  pool.release_all(b.pages);
  FakeSeq c = computed(pool, 3, iota_tokens(8, 300));  // still running, pages not cached
  EXPECT_EQ(pool.num_free(), 0);
  // Touch A: B becomes the least recently used.
  PrefixMatch m = cache.match(iota_tokens(8, 100), 7, 4);
  ASSERT_EQ(m.pages.size(), 1u);
  ASSERT_EQ(m.partial_page, a.pages[1]);
  EXPECT_EQ(cache.evict(2), 2);  // both of B's pages (leaf first, then its parent)
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(cache.num_nodes(), 2);
  // Both of A's pages are held by the match: nothing more can go until it lets them go.
  EXPECT_EQ(cache.evict(5), 0);
  cache.check_invariants();
  release(pool, m);
  EXPECT_EQ(cache.evict(5), 2);
  pool.release_all(c.pages);
  EXPECT_EQ(pool.num_free(), pool.num_pages());
  pool.check_invariants();
}

// A page's last use includes its descendants': once its children are gone it is evicted after
// leaves that were used before them, not at its own (older) insertion time.
TEST(RadixCache, APageThatBecomesALeafKeepsItsDescendantsLastUse) {
  PagePool pool(4, kPage);
  RadixCache cache(pool);
  FakeSeq s = computed(pool, 1, iota_tokens(8, 100));  // pages P, Q
  FakeSeq t = computed(pool, 2, iota_tokens(4, 200));
  FakeSeq u = computed(pool, 3, iota_tokens(4, 300));
  for (FakeSeq* x : {&s, &t, &u}) {
    cache.insert_finished(x->id, x->tokens, static_cast<int32_t>(x->tokens.size()), x->pages);
    pool.release_all(x->pages);
  }
  PrefixMatch hold_t = cache.match(iota_tokens(4, 200), 4, 4);
  PrefixMatch hold_u = cache.match(iota_tokens(4, 300), 4, 5);
  ASSERT_EQ(hold_t.pages.size() + hold_u.pages.size(), 2u);
  PrefixMatch use_s = cache.match(iota_tokens(8, 100), 8, 6);  // P and Q, used last
  ASSERT_EQ(use_s.pages.size(), 2u);
  release(pool, use_s);
  EXPECT_EQ(cache.evict(1), 1);  // Q: the only idle leaf
  release(pool, hold_t);
  release(pool, hold_u);
  EXPECT_EQ(cache.evict(1), 1);  // T, used before P's subtree; not P
  PrefixMatch p = cache.match(iota_tokens(8, 100), 8, 7);
  EXPECT_EQ(p.pages.size(), 1u);
  release(pool, p);
  PrefixMatch gone = cache.match(iota_tokens(4, 200), 4, 8);
  EXPECT_TRUE(gone.pages.empty());
  release(pool, gone);
  cache.check_invariants();
}

// Many sequences over a small alphabet (so prefixes collide at every depth), admitted,
// computed, finished and evicted in random order. The tree and the pool stay consistent, and
// once every sequence is gone and the cache is emptied the pool is whole again.
TEST(RadixCache, RandomWorkloadKeepsThePoolWhole) {
  PagePool pool(64, kPage);
  RadixCache cache(pool);
  std::mt19937 rng(7);
  std::vector<FakeSeq> live;
  SeqId next = 1;
  for (int iter = 0; iter < 3000; ++iter) {
    if (live.size() < 6 && rng() % 2 == 0) {
      std::vector<TokenId> tokens(1 + rng() % 14);
      for (auto& t : tokens) t = static_cast<TokenId>(rng() % 2);
      const auto n = static_cast<int32_t>(tokens.size());
      FakeSeq s{next++, tokens, {}};
      PrefixMatch m = cache.match(tokens, n - 1, s.id);
      if (m.claimed_by_other) {
        release(pool, m);
        continue;
      }
      s.pages = m.pages;
      if (m.partial_page >= 0) {
        if (pool.num_free() == 0) cache.evict(1);
        if (!pool.allocate(1, s.pages)) {
          release(pool, m);
          continue;
        }
        pool.release(m.partial_page);
      }
      const int64_t need = pool.pages_for(n) - static_cast<int64_t>(s.pages.size());
      if (pool.num_free() < need) cache.evict(need - pool.num_free());
      if (!pool.allocate(need, s.pages)) {
        pool.release_all(s.pages);
        continue;
      }
      cache.claim(s.id, s.tokens, static_cast<int32_t>(m.pages.size()), n);
      cache.insert(s.id, s.tokens, n, s.pages);
      live.push_back(std::move(s));
    } else if (!live.empty()) {
      const size_t i = rng() % live.size();
      FakeSeq& s = live[i];
      if (rng() % 4 == 0) {
        cache.forget(s.id);  // preempted
      } else {
        cache.insert_finished(s.id, s.tokens, static_cast<int32_t>(s.tokens.size()), s.pages);
      }
      pool.release_all(s.pages);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (rng() % 5 == 0) cache.evict(1 + rng() % 3);
    cache.check_invariants();
    pool.check_invariants();
  }
  for (FakeSeq& s : live) {
    cache.forget(s.id);
    pool.release_all(s.pages);
  }
  cache.evict(pool.num_pages());
  EXPECT_EQ(cache.num_nodes(), 0);
  EXPECT_EQ(pool.num_free(), pool.num_pages());
}

TEST(RadixCache, OptimalSharingFollowsTheTrie) {
  const std::vector<TokenId> a{1, 2, 3, 4}, b{1, 2, 3, 5}, c{1, 2}, d{9}, e{1, 2, 3, 4};
  // Sorted: c, a, e, b, d. a shares 2 with c; e shares all but its last token with a; b shares
  // 3 with e; d nothing.
  EXPECT_EQ(optimal_shared_tokens({a, b, c, d, e}), 2 + 3 + 3);
  EXPECT_EQ(optimal_shared_tokens({d}), 0);
}

}  // namespace
}  // namespace blend
