// How one ForwardBatch travels to the GPU: every int32 the kernels read (tokens, positions, the
// chunk of each token, the chunks' block tables and page directions, the rows that want
// logits) packed into one host buffer, so one host-to-device copy per step moves it. Pure host
// code, tested without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "core/forward_batch.h"

namespace blend::cuda {

struct BatchLayout {
  int32_t num_tokens = 0;
  int32_t num_chunks = 0;
  int32_t num_logit_rows = 0;
  // Offsets, in int32 elements, of each array inside `data`, in this order: the arrays whose
  // sizes the batch's counts fix first, the block tables last (so a step of the same counts
  // has the same offsets whatever its sequences' lengths, up to the tables' capacity: what a
  // CUDA graph of the step needs).
  int64_t tokens = 0;       // [num_tokens] token ids
  int64_t positions = 0;    // [num_tokens] position of each token in its sequence
  int64_t token_chunk = 0;  // [num_tokens] index of the chunk each token belongs to
  int64_t chunk_table = 0;  // [num_chunks] where each chunk's pages start in `tables`
  int64_t logit_rows = 0;   // [num_logit_rows] the token rows whose logits are wanted
  // Attention's two kernels split the tokens: prefill tiles (up to tile_tokens consecutive
  // tokens of one chunk, [first token, count] pairs) and single tokens (decodes, short chunks).
  int32_t num_prefill_tiles = 0;
  int32_t num_single_tokens = 0;
  int32_t max_single_context = 0;  // the most keys a single token attends to (its position + 1)
  int64_t prefill_tiles = 0;       // [num_prefill_tiles][2]
  int64_t single_tokens = 0;       // [num_single_tokens] token indices
  int64_t tables = 0;              // the chunks' block tables, the pages their tokens reach only
  int64_t reversed = 0;        // parallel to `tables`: 1 where the page fills from its last slot
  int64_t table_capacity = 0;  // entries `tables` and `reversed` each take (zeros past the used)
  std::vector<int32_t> data;
};

// Packs `batch` (checked beforehand with check_forward_batch) for pages of `page_size` tokens.
// Chunks of at least `min_tile_chunk` tokens are cut into prefill tiles of `tile_tokens`
// tokens; tile_tokens 0 makes every token a single token. The block tables take at least
// `table_capacity` entries.
BatchLayout layout_batch(const ForwardBatch& batch, int64_t page_size, int32_t tile_tokens = 0,
                         int32_t min_tile_chunk = 8, int64_t table_capacity = 0);
// The same for chunks [first, end) alone (a nano-batch, nano_split.h): token indices, chunk
// indices and logit rows count from the range's first token and chunk.
BatchLayout layout_chunks(const ForwardBatch& batch, size_t first, size_t end, int64_t page_size,
                          int32_t tile_tokens = 0, int32_t min_tile_chunk = 8,
                          int64_t table_capacity = 0);

// CUDA graphs of decode steps (BLEND_CUDA_GRAPHS=decode) are captured for a few row counts, as
// vLLM's are: 1, 2, 4, then the multiples of 8 up to kMaxGraphRows. graph_rows(n) is the
// smallest of them that holds n rows; 0 past the largest (the step keeps its own count).
constexpr int32_t kMaxGraphRows = 512;
int32_t graph_rows(int32_t rows);

// `batch` (decode chunks only) grown to `rows` chunks, so that steps of different counts replay
// one graph. Each added chunk is token 0 at position 0 on `scratch_page` (a page outside the
// pool, which every added chunk writes alike: one key, whatever the page size) and wants logits:
// its rows come after the batch's own, and nothing reads them.
ForwardBatch pad_decode_batch(const ForwardBatch& batch, int32_t rows, PageId scratch_page);

}  // namespace blend::cuda
