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
  // Offsets, in int32 elements, of each array inside `data`.
  int64_t tokens = 0;       // [num_tokens] token ids
  int64_t positions = 0;    // [num_tokens] position of each token in its sequence
  int64_t token_chunk = 0;  // [num_tokens] index of the chunk each token belongs to
  int64_t chunk_table = 0;  // [num_chunks] where each chunk's pages start in `tables`
  int64_t tables = 0;       // the chunks' block tables, the pages their tokens reach only
  int64_t reversed = 0;     // parallel to `tables`: 1 where the page fills from its last slot
  int64_t logit_rows = 0;   // [num_logit_rows] the token rows whose logits are wanted
  std::vector<int32_t> data;
};

// Packs `batch` (checked beforehand with check_forward_batch) for pages of `page_size` tokens.
BatchLayout layout_batch(const ForwardBatch& batch, int64_t page_size);

}  // namespace blend::cuda
