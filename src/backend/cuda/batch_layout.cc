#include "backend/cuda/batch_layout.h"

#include <algorithm>

namespace blend::cuda {

BatchLayout layout_batch(const ForwardBatch& batch, int64_t page_size, int32_t tile_tokens,
                         int32_t min_tile_chunk, int64_t table_capacity) {
  return layout_chunks(batch, 0, batch.chunks.size(), page_size, tile_tokens, min_tile_chunk,
                       table_capacity);
}

BatchLayout layout_chunks(const ForwardBatch& batch, size_t first, size_t end, int64_t page_size,
                          int32_t tile_tokens, int32_t min_tile_chunk, int64_t table_capacity) {
  BatchLayout l;
  l.num_chunks = static_cast<int32_t>(end - first);
  // Chunks hold consecutive tokens in chunk order: the range's tokens are one slice.
  const int32_t base = end > first ? batch.chunks[first].token_offset : 0;
  const int32_t stop =
      end > first ? batch.chunks[end - 1].token_offset + batch.chunks[end - 1].num_tokens : 0;
  l.num_tokens = stop - base;
  std::vector<int32_t> table_start, tables, reversed, logit_rows, token_chunk(l.num_tokens);
  std::vector<int32_t> tiles, singles;
  for (size_t ci = first; ci < end; ++ci) {
    const SeqChunk& c = batch.chunks[ci];
    const int32_t offset = c.token_offset - base;
    table_start.push_back(static_cast<int32_t>(tables.size()));
    const int64_t pages = (int64_t{c.num_cached} + c.num_tokens + page_size - 1) / page_size;
    for (int64_t p = 0; p < pages; ++p) {
      tables.push_back(c.block_table[p]);
      const auto j = static_cast<size_t>(p);
      reversed.push_back(j < c.reversed_pages.size() && c.reversed_pages[j] ? 1 : 0);
    }
    for (int32_t i = 0; i < c.num_tokens; ++i)
      token_chunk[offset + i] = static_cast<int32_t>(ci - first);
    if (c.wants_logits) logit_rows.push_back(offset + c.num_tokens - 1);
    if (tile_tokens > 0 && c.num_tokens >= min_tile_chunk) {
      for (int32_t i = 0; i < c.num_tokens; i += tile_tokens) {
        tiles.push_back(offset + i);
        tiles.push_back(std::min(tile_tokens, c.num_tokens - i));
      }
    } else {
      for (int32_t i = 0; i < c.num_tokens; ++i) singles.push_back(offset + i);
      l.max_single_context = std::max(l.max_single_context, c.num_cached + c.num_tokens);
    }
  }
  l.num_prefill_tiles = static_cast<int32_t>(tiles.size() / 2);
  l.num_single_tokens = static_cast<int32_t>(singles.size());
  l.num_logit_rows = static_cast<int32_t>(logit_rows.size());
  auto append = [&](int64_t& offset, const std::vector<int32_t>& v) {
    offset = static_cast<int64_t>(l.data.size());
    l.data.insert(l.data.end(), v.begin(), v.end());
  };
  auto append_slice = [&](int64_t& offset, const std::vector<int32_t>& v) {
    offset = static_cast<int64_t>(l.data.size());
    l.data.insert(l.data.end(), v.begin() + base, v.begin() + stop);
  };
  append_slice(l.tokens, batch.tokens);
  append_slice(l.positions, batch.positions);
  append(l.token_chunk, token_chunk);
  append(l.chunk_table, table_start);
  append(l.logit_rows, logit_rows);
  append(l.prefill_tiles, tiles);
  append(l.single_tokens, singles);
  l.table_capacity = std::max<int64_t>(table_capacity, static_cast<int64_t>(tables.size()));
  tables.resize(static_cast<size_t>(l.table_capacity), 0);
  reversed.resize(static_cast<size_t>(l.table_capacity), 0);
  append(l.tables, tables);
  append(l.reversed, reversed);
  return l;
}

int32_t graph_rows(int32_t rows) {
  if (rows <= 0 || rows > kMaxGraphRows) return 0;
  if (rows <= 4) return rows == 3 ? 4 : rows;
  return (rows + 7) / 8 * 8;
}

ForwardBatch pad_decode_batch(const ForwardBatch& batch, int32_t rows, PageId scratch_page) {
  ForwardBatch padded = batch;
  for (int32_t i = batch.num_tokens(); i < rows; ++i) {
    padded.chunks.push_back(SeqChunk{.seq = 0,
                                     .num_cached = 0,
                                     .num_tokens = 1,
                                     .token_offset = i,
                                     .block_table = {scratch_page},
                                     .wants_logits = true});
    padded.tokens.push_back(0);
    padded.positions.push_back(0);
  }
  return padded;
}

}  // namespace blend::cuda
