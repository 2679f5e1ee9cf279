// Paged KV cache storage and grouped-query causal attention over it.
//
// Layout: [layer][K|V][page][kv_head][...], where a K page of one head is stored transposed,
// [head_dim][page_size], and a V page is [page_size][head_dim]: a query's scores against
// consecutive keys are then one vector FMA per head-dim element, and P x V is one vector FMA
// per key. Elements are f32 or bf16 (the backend stores bf16 when the weights are not f32).
//
// Attention reads every key, including those of tokens computed in the same step, from the
// cache, and reduces a query's keys in a fixed order: blocks of 16 absolute positions from the
// window start upward, with an online softmax. A query's result is therefore a function of
// its position and the cached K/V only, never of how its sequence was chunked or batched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/memory.h"
#include "core/dtype.h"
#include "core/forward_batch.h"

namespace blend::cpu {

class KvCache {
 public:
  KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t page_size, int64_t num_pages,
          DType dtype);

  DType dtype() const { return dtype_; }
  int64_t page_size() const { return page_size_; }
  int64_t num_pages() const { return num_pages_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t kv_heads() const { return kv_heads_; }
  // One page of one layer, one of K or V.
  size_t page_bytes() const {
    return static_cast<size_t>(kv_heads_ * page_size_ * head_dim_) * dtype_size(dtype_);
  }
  // One page across all layers, K and V.
  int64_t bytes_per_page() const { return 2 * layers_ * static_cast<int64_t>(page_bytes()); }

  std::byte* k_page(int64_t layer, PageId page) { return page_ptr(layer, 0, page); }
  std::byte* v_page(int64_t layer, PageId page) { return page_ptr(layer, 1, page); }
  const std::byte* k_page(int64_t layer, PageId page) const { return page_ptr(layer, 0, page); }
  const std::byte* v_page(int64_t layer, PageId page) const { return page_ptr(layer, 1, page); }

  void copy_page(PageId src, PageId dst);
  // One page's K and V of every layer, packed (bytes_per_page() bytes), and back.
  void read_page(PageId page, std::byte* out) const;
  void write_page(PageId page, const std::byte* in);
  // Slots [first, first + count) of a page, into / out of a read_page image.
  void read_slots(PageId page, int64_t first, int64_t count, std::byte* image) const;
  void write_slots(PageId page, int64_t first, int64_t count, const std::byte* image);

 private:
  // Copies the slots between a page and its image in either direction.
  void copy_slots(PageId page, int64_t first, int64_t count, std::byte* image, bool to_image) const;
  std::byte* page_ptr(int64_t layer, int kv, PageId page) const {
    return data_.get() + ((layer * 2 + kv) * num_pages_ + page) * page_bytes();
  }
  int64_t layers_, kv_heads_, head_dim_, page_size_, num_pages_;
  DType dtype_;
  Buffer data_;
};

struct AttentionShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t sliding_window = 0;  // 0: full causal attention
  float scale = 0;             // of q.k; 0: 1 / sqrt(head_dim) (Gemma: query_pre_attn_scalar^-1/2)
  // Scores -> softcap * tanh(scores / softcap) before the softmax (Gemma 2); 0: none. Applied
  // to each score on its own, so a query's result stays a function of its keys alone.
  float softcap = 0;
};

// One unit of parallel work: some consecutive tokens of one chunk, for one KV head (and the
// query heads of its group).
struct AttentionItem {
  int32_t chunk = 0;
  int32_t kv_head = 0;
  int32_t first = 0;  // token index within the chunk
  int32_t count = 0;
};

// The work items of a batch, longest first (the same plan serves every layer).
std::vector<AttentionItem> plan_attention(const ForwardBatch& batch, const AttentionShape& shape);

// Writes the K and V rows of every batch token into the cache pages of `layer`. qkv holds one
// row of `stride` floats per token: K at column k_col, V at v_col (heads consecutive).
void write_kv(const ForwardBatch& batch, const float* qkv, int64_t stride, int64_t k_col,
              int64_t v_col, int64_t layer, KvCache& cache, int threads);

// out[t][h * head_dim + d] (dtype out_dtype, num_heads * head_dim per token) = softmax(q k^T x
// scale, soft-capped when the shape says) v over the sequence's cached positions [window start,
// position of t]. q is at column 0 of qkv rows.
void paged_attention(const ForwardBatch& batch, const std::vector<AttentionItem>& items,
                     const float* qkv, int64_t stride, int64_t layer, const KvCache& cache,
                     const AttentionShape& shape, DType out_dtype, void* out, int threads);

}  // namespace blend::cpu
