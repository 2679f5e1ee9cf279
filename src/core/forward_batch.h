// ForwardBatch — what one engine step asks a backend to compute: a flat batch of tokens from
// several sequences (prefill chunks and decode tokens mixed, Sarathi/NanoFlow style), each
// sequence's slice described by a SeqChunk. The KV of every token in the batch is written to
// the pages named by its sequence's block table before attention reads it, so a token's result
// never depends on whether its context was computed in this step or an earlier one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/types.h"

namespace blend {

struct SeqChunk {
  SeqId seq = 0;
  ModelId model = 0;         // whose weights compute it (Backend::num_models)
  int32_t num_cached = 0;    // tokens of this sequence already in the KV cache (context)
  int32_t num_tokens = 0;    // tokens of this sequence in this batch (1 for a decode step)
  int32_t token_offset = 0;  // index of this chunk's first token in ForwardBatch::tokens
  // Pages holding positions [0, num_cached + num_tokens); position p lives in
  // block_table[p / page_size], slot p % page_size.
  std::vector<PageId> block_table;
  bool wants_logits = false;  // produce logits for the chunk's last token
  // prompt_logprobs: logits for every token of the chunk, in order (the last of them is the row
  // wants_logits samples). Only a backend whose scores_every_row() is true takes it.
  bool all_logits = false;
  // Fill direction per page (BROS §5 bidirectional pages, the paper's "direction table" of
  // the block table's shape): where reversed_pages[j] is set, the sequence's tokens occupy
  // block_table[j] from the last slot backwards, slot page_size - 1 - p % page_size, so that
  // another sequence can fill the same page from slot 0. Missing entries fill from slot 0.
  // Results do not depend on the direction.
  std::vector<uint8_t> reversed_pages;
};

// The slot of position `pos` within its page.
inline int64_t kv_slot(const SeqChunk& c, int64_t pos, int64_t page_size) {
  const int64_t slot = pos % page_size;
  const auto j = static_cast<size_t>(pos / page_size);
  return j < c.reversed_pages.size() && c.reversed_pages[j] ? page_size - 1 - slot : slot;
}
// Whether any of positions [0, n) lives in a reversed page.
inline bool has_reversed_pages(const SeqChunk& c, int64_t n, int64_t page_size) {
  const auto pages = static_cast<size_t>((n + page_size - 1) / page_size);
  for (size_t j = 0; j < std::min(pages, c.reversed_pages.size()); ++j)
    if (c.reversed_pages[j]) return true;
  return false;
}

struct ForwardBatch {
  std::vector<TokenId> tokens;     // all chunks' tokens, concatenated in chunk order
  std::vector<int32_t> positions;  // position of each token within its sequence
  std::vector<SeqChunk> chunks;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  // Rows of logits forward() writes: every token of an all_logits chunk, the last token of
  // another chunk that wants logits.
  int32_t num_logit_rows() const {
    int32_t n = 0;
    for (const auto& c : chunks) n += c.all_logits ? c.num_tokens : c.wants_logits ? 1 : 0;
    return n;
  }
  // Rows that sample a token: one per chunk that wants logits.
  int32_t num_sample_rows() const {
    int32_t n = 0;
    for (const auto& c : chunks) n += c.wants_logits ? 1 : 0;
    return n;
  }
};

// A step of `sequences` chunks of `tokens` tokens each after `cached` cached ones, every chunk
// wanting logits and each sequence its own pages (page 0 on, in order): the synthetic steps a
// profile times (KV contents do not matter for timing). Token ids are fixed, not random.
ForwardBatch synthetic_batch(int64_t sequences, int32_t tokens, int32_t cached, int64_t page_size);

}  // namespace blend
