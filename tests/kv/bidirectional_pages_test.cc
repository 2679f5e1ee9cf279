#include "kv/bidirectional_pages.h"

#include <gtest/gtest.h>

namespace blend {
namespace {

Sequence make_seq(SeqId id, RequestClass cls, int32_t tokens, int32_t computed,
                  std::vector<PageId> pages, std::vector<uint8_t> reversed = {}) {
  Sequence s;
  s.id = id;
  s.request_class = cls;
  s.tokens.assign(static_cast<size_t>(tokens), 1);
  s.prompt_len = tokens;
  s.num_computed = computed;
  s.block_table = std::move(pages);
  s.reversed_pages = std::move(reversed);
  return s;
}

// Hand-built pages of 16 slots (BROS §5.2): FindBlock / FindPreemptBlock pick the pages with
// the most empty slots, a newcomer fills from the end opposite its peer, and an RT sequence
// reaching a BE peer's slots checkpoints exactly the computed ones it overwrites.
TEST(BidirectionalPages, OffersCollisionsAndThePreemptionTable) {
  BidirectionalPages b(16, 16, 64);
  Sequence rt = make_seq(1, RequestClass::kRealtime, 5, 5, {5});            // 5 slots of page 5
  Sequence rt_long = make_seq(2, RequestClass::kRealtime, 30, 30, {3, 4});  // 14 slots of 4
  Sequence be = make_seq(3, RequestClass::kBestEffort, 20, 19, {7, 8});     // 4 slots of 8
  std::vector<Sequence*> running{&rt, &rt_long, &be};

  // A BE sequence needing 4 slots: page 5 (11 empty) beats page 4 (2 empty); 12 fit nowhere.
  auto offer = b.find_page_for_be(running, 4);
  EXPECT_EQ(offer.page, 5);
  EXPECT_EQ(offer.holder, &rt);
  EXPECT_TRUE(offer.reversed);
  EXPECT_EQ(b.find_page_for_be(running, 12).page, -1);

  // An RT sequence takes the BE page with the most empty slots: page 8 (12 empty), not 7.
  offer = b.find_page_for_rt(running, [](const Sequence&, PageId) { return true; });
  EXPECT_EQ(offer.page, 8);
  EXPECT_EQ(offer.holder, &be);
  EXPECT_TRUE(offer.reversed);  // the BE fills page 8 from slot 0, so the RT from the end
  EXPECT_EQ(b.find_page_for_rt(running, [](const Sequence&, PageId p) { return p != 8; }).page, 7);

  Sequence rt2 = make_seq(4, RequestClass::kRealtime, 14, 0, {8}, {1});
  b.share(8, &rt2, &be);
  running.push_back(&rt2);
  b.check_invariants();
  // The BE holds positions 16..19 of page 8 in slots 0..3, three of them computed (0..2). The
  // RT writing its positions 0..13 from the end covers slots 2..15: slot 2 is saved, slot 3
  // holds nothing yet, and the BE must now restore the page before it runs.
  EXPECT_EQ(b.collide(8, rt2, 0, 14), std::vector<int32_t>{2});
  EXPECT_TRUE(b.needs_restore(be));
  EXPECT_EQ(b.pages_to_restore(be), std::vector<PageId>{8});
  ASSERT_EQ(b.preemption_table().size(), 1u);
  EXPECT_EQ(b.preemption_table()[0].rt, 4);
  EXPECT_EQ(b.preemption_table()[0].be, 3);
  EXPECT_EQ(b.collide(8, rt2, 0, 14), std::vector<int32_t>{});  // already saved
  EXPECT_EQ(b.collide(8, rt2, 14, 16), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(b.checkpointed_slots(), 3);
  auto saved = b.take_checkpoint(be, 8);
  EXPECT_EQ(saved->saved, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(saved->image.size(), 64u);
  EXPECT_FALSE(b.needs_restore(be));

  // The BE joins page 5 (its third page, reversed) where the RT uses slots 0..4: up to 11
  // of its tokens fit there, the 12th would overwrite the RT's.
  be.block_table.push_back(5);
  be.reversed_pages = {0, 0, 1};
  b.share(5, &rt, &be);
  EXPECT_FALSE(b.be_would_collide(5, be, 32 + 11));
  EXPECT_TRUE(b.be_would_collide(5, be, 32 + 12));
  // When the RT leaves, the prefix cache may still hold its slots: they stay out of reach.
  b.forget(&rt);
  EXPECT_EQ(b.rt_holder(5), nullptr);
  EXPECT_TRUE(b.be_would_collide(5, be, 32 + 12));
  b.check_invariants();
}

}  // namespace
}  // namespace blend
