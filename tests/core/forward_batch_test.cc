// synthetic_batch (core/forward_batch.h): the steps `blend profile` times, on both backends.
#include "core/forward_batch.h"

#include <gtest/gtest.h>

#include <vector>

namespace blend {
namespace {

// Three sequences of 5 tokens after 6 cached ones, pages of 4: each sequence its own three
// pages (positions 0-10), in order from page 0; positions continue the cached ones; every chunk
// wants logits and its tokens follow the chunk before's.
TEST(SyntheticBatch, EachSequenceItsOwnPagesInOrder) {
  const ForwardBatch b = synthetic_batch(3, 5, 6, 4);
  ASSERT_EQ(b.chunks.size(), 3u);
  EXPECT_EQ(b.num_tokens(), 15);
  EXPECT_EQ(b.num_logit_rows(), 3);
  for (int s = 0; s < 3; ++s) {
    const SeqChunk& c = b.chunks[s];
    EXPECT_EQ(c.seq, s);
    EXPECT_EQ(c.num_cached, 6);
    EXPECT_EQ(c.num_tokens, 5);
    EXPECT_EQ(c.token_offset, 5 * s);
    EXPECT_EQ(c.block_table, (std::vector<PageId>{3 * s, 3 * s + 1, 3 * s + 2}));
    for (int i = 0; i < 5; ++i) EXPECT_EQ(b.positions[5 * s + i], 6 + i);
  }
  // Token ids are fixed and spread over the vocabulary's first 30,100 ids.
  EXPECT_EQ(b.tokens, synthetic_batch(3, 5, 6, 4).tokens);
  for (TokenId t : b.tokens) EXPECT_TRUE(t >= 100 && t < 30100) << t;
  EXPECT_NE(b.tokens[0], b.tokens[1]);
  // A decode step: one token each, its page the one its position falls in.
  const ForwardBatch d = synthetic_batch(2, 1, 8, 4);
  EXPECT_EQ(d.chunks[1].block_table, (std::vector<PageId>{3, 4, 5}));
  EXPECT_EQ(d.positions, (std::vector<int32_t>{8, 8}));
}

}  // namespace
}  // namespace blend
