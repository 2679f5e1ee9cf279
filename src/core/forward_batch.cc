#include "core/forward_batch.h"

namespace blend {

ForwardBatch synthetic_batch(int64_t sequences, int32_t tokens, int32_t cached, int64_t page_size) {
  ForwardBatch b;
  const int64_t pages_per_seq = (int64_t{cached} + tokens + page_size - 1) / page_size;
  for (int64_t s = 0; s < sequences; ++s) {
    SeqChunk c;
    c.seq = s;
    c.num_cached = cached;
    c.num_tokens = tokens;
    c.token_offset = static_cast<int32_t>(s * tokens);
    c.wants_logits = true;
    for (int64_t p = 0; p < pages_per_seq; ++p)
      c.block_table.push_back(static_cast<PageId>(s * pages_per_seq + p));
    for (int32_t i = 0; i < tokens; ++i) {
      b.tokens.push_back(static_cast<TokenId>(100 + ((s * tokens + i) * 7919) % 30000));
      b.positions.push_back(cached + i);
    }
    b.chunks.push_back(std::move(c));
  }
  return b;
}

}  // namespace blend
