// Backend — one interface, several implementations (DESIGN.md §2): cpu (real arithmetic),
// cuda, sim (virtual clock). A backend owns the model weights in its preferred layout and the
// KV cache storage; which pages belong to whom is decided outside (kv/), the backend only reads
// and writes the pages a ForwardBatch names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/forward_batch.h"
#include "model/config.h"

namespace blend {

class TensorStore;

struct BackendOptions {
  int threads = 0;             // 0 = all hardware threads
  bool deterministic = false;  // results independent of batch composition (see cpu backend)
  int page_size = 16;          // tokens per KV page
  int64_t num_pages = 0;       // KV pages to allocate (the engine sizes this from --kv-memory)
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const ModelConfig& config() const = 0;
  virtual std::string name() const = 0;
  // Bytes of KV cache storage one page takes across all layers (K and V).
  virtual int64_t kv_bytes_per_page() const = 0;
  virtual int64_t num_pages() const = 0;

  // Runs all layers over the batch, writes the batch's K/V into its pages, and fills `logits`
  // with one row of vocab_size floats per chunk that wants logits (in chunk order).
  virtual void forward(const ForwardBatch& batch, std::span<float> logits) = 0;

  // Copies one page's K/V (all layers) to another page (copy-on-write of a shared last page).
  virtual void copy_page(PageId src, PageId dst) = 0;

  // Gathers the K/V of `pages` (all layers) into one contiguous buffer of
  // pages.size() * kv_bytes_per_page() bytes, page after page, and scatters such a buffer back.
  // This is how KV leaves for and returns from the host and disk tiers: one run, one buffer.
  virtual void read_pages(std::span<const PageId> pages, std::byte* out) const = 0;
  virtual void write_pages(std::span<const PageId> pages, const std::byte* in) = 0;
  // Slots [first, first + count) of one page's K/V (all layers) into / out of `image`, a
  // kv_bytes_per_page() buffer laid out as read_pages writes one page; the other bytes of the
  // image are left alone. BROS lazy checkpointing (§5.2) saves only the slots a peer sequence
  // is about to overwrite.
  virtual void read_slots(PageId page, int32_t first, int32_t count, std::byte* image) const = 0;
  virtual void write_slots(PageId page, int32_t first, int32_t count, const std::byte* image) = 0;

  // A simulating backend (backend/sim) does no arithmetic and keeps its own clock. The engine
  // then passes it only the chunks' shapes (no tokens, positions or block tables), appends
  // kNoToken instead of sampling (requests end by max_tokens), and reads time from it.
  virtual bool simulated() const { return false; }
  virtual std::optional<double> virtual_seconds() const { return std::nullopt; }
};

// KV bytes per token for a model whose cache holds elements of `kv_elem_bytes` bytes.
inline int64_t kv_bytes_per_token(const ModelConfig& c, int64_t kv_elem_bytes) {
  return 2 * c.num_layers * c.kv_dim() * kv_elem_bytes;
}

}  // namespace blend
