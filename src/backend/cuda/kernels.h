// The cuda backend's kernels: every step of the Llama forward pass except the GEMMs (cuBLAS,
// cuda_backend.cc). The math is the cpu backend's (backend/cpu/ops.h, attention.h): f32
// residual stream, norms, RoPE, softmax and activations; GEMM inputs and the KV cache in the
// compute element type (f32 for f32 checkpoints, bf16 otherwise). All launches go on `stream`
// and return at once; errors surface at the next synchronisation (check_launch catches bad
// launch shapes at once).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "sampling/device_draw.h"

// Functions both the host and the kernels call.
#ifdef __CUDACC__
#define BLEND_HOST_DEVICE __host__ __device__
#else
#define BLEND_HOST_DEVICE
#endif

namespace blend::cuda {

enum class Elem { kF32, kBF16 };

inline size_t elem_size(Elem e) {
  return e == Elem::kF32 ? 4 : 2;
}

// Device pointers into a BatchLayout's data (batch_layout.h), copied to the GPU.
struct BatchView {
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* token_chunk = nullptr;
  const int32_t* chunk_table = nullptr;
  const int32_t* tables = nullptr;
  const int32_t* reversed = nullptr;
  const int32_t* logit_rows = nullptr;
  // How attention splits the tokens (batch_layout.h): null single_tokens = every token single.
  const int32_t* prefill_tiles = nullptr;
  const int32_t* single_tokens = nullptr;
  int32_t num_tokens = 0;
  int32_t num_logit_rows = 0;
  int32_t num_prefill_tiles = 0;
  int32_t num_single_tokens = 0;
  int32_t max_single_context = 0;  // the most keys a single token attends to (position + 1)
};

// How the decode kernel splits each token's keys beyond decode_splits() (which fills an
// otherwise idle GPU): kFill adds nothing; kWaves also splits where that shortens the last
// wave of blocks (wave_splits).
enum class DecodeSplits { kFill, kWaves };

// Device memory the decode kernel may use for split partials (flash-decoding), the GPU's
// multiprocessor count it sizes the splits by, and the split policy.
struct DecodeScratch {
  float* data = nullptr;
  size_t floats = 0;
  int32_t multiprocessors = 132;
  DecodeSplits splits = DecodeSplits::kFill;
  int32_t min_splits = 1;      // at least this many (benchmarks), where the scratch holds them
  bool heads_fastest = false;  // the decode grid's x is the KV head (else the token)
};

// How many ways the pipelined decode kernel splits each token's keys: 1 when the batch's
// (token, KV head) blocks already fill the GPU, else enough for two blocks per multiprocessor
// (at most 32, each split two or more 32-key tiles).
int32_t decode_splits(int32_t tokens, int32_t num_kv_heads, int32_t max_context,
                      int32_t multiprocessors);
// Splits (1 to 32, each at least two tiles) of `blocks` equal blocks of `tiles` key tiles each
// that finish soonest when `resident` blocks run at once: each split costs its tiles plus one
// tile of fixed cost, and the blocks run in whole waves, so a last wave that is mostly empty is
// worth filling with smaller blocks.
int32_t wave_splits(int64_t blocks, int32_t tiles, int64_t resident);
// Key tiles of a token attending to `context` keys (the unit splits share), and the most splits
// wave_splits chooses for that many tiles (what the scratch must hold).
int32_t decode_tiles(int32_t context);
int32_t wave_splits_most(int32_t tiles);
// Floats of DecodeScratch that many splits need (0 for one).
size_t decode_scratch_floats(int32_t tokens, int32_t num_heads, int32_t head_dim, int32_t splits);

// The paged KV cache. One page of one layer (K then V, [k=0 / v=1][kv_head][slot][d]) is a
// contiguous run of layer_elems(); where those runs lie is the layout's strides:
//   page-major  (page_stride = num_layers * layer_elems(), layer_stride = layer_elems()): a page,
//               all layers, is one run of bytes ([page][layer][...]);
//   layer-major (page_stride = layer_elems(), layer_stride = num_pages * layer_elems()): one
//               layer of every page is one run ([layer][page][...]), as vLLM's per-layer KV
//               tensors, so a layer's decode attention reads a 1/num_layers share of the cache.
struct KvView {
  void* base = nullptr;
  Elem elem = Elem::kBF16;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = 0;
  int64_t page_stride = 0;   // elements between page p and p + 1 of one layer
  int64_t layer_stride = 0;  // elements between layer l and l + 1 of one page

  BLEND_HOST_DEVICE int64_t layer_elems() const {
    return int64_t{2} * num_kv_heads * page_size * head_dim;
  }
  BLEND_HOST_DEVICE int64_t page_elems() const { return int64_t{num_layers} * layer_elems(); }
};

enum class KvLayout { kPageMajor, kLayerMajor };

// Sets kv's strides for `layout` over a cache of num_pages pages.
void set_kv_layout(KvView& kv, KvLayout layout, int64_t num_pages);

// x[t] = embedding row of token t, widened to f32. `table` holds vocab rows of `hidden`
// elements of `table_elem`.
void embed(const BatchView& batch, const void* table, Elem table_elem, int64_t hidden, float* x,
           cudaStream_t stream);

// out[r] = weight * x[row] / sqrt(mean(x[row]^2) + eps) for r < rows, row = rows_index[r] (or r
// when rows_index is null); x rows are `dim` floats, out rows `dim` elements of `out_elem`.
void rmsnorm(const float* x, const int32_t* rows_index, int64_t rows, int64_t dim,
             const float* weight, float eps, void* out, Elem out_elem, cudaStream_t stream);

// y[r][c] += bias[c].
void add_bias(float* y, int64_t rows, int64_t cols, const float* bias, cudaStream_t stream);

// Rotates each token's q heads in place and its k heads (Hugging Face rotate_half, angles
// position * inv_freq[i] in double), and writes k and v into the token's KV slot of `layer`.
// qkv rows are [q (num_heads * head_dim) | k | v], `nqkv` floats.
void rope_write_kv(const BatchView& batch, float* qkv, int64_t nqkv, int32_t num_heads,
                   const double* inv_freq, const KvView& kv, int32_t layer, cudaStream_t stream);

// Which kernel runs the single tokens: kDefault (bf16 caches: the pipelined decode kernel,
// asynchronous double-buffered tile copies, with flash-decoding splits; else as kTiled64),
// kTiled64 (64-key tiles, 16-byte loads; falls back to kTiled32 where head_dim is not a
// multiple of 16 bytes) or kTiled32 (32-key tiles, element loads). A tensor-core decode kernel
// was measured no faster (docs/BENCHMARKS.md) and removed.
// kPipelined3 is kDefault with three buffers in the decode kernel instead of two; kWarps and
// kWarps8 run the single tokens in the warp-parallel decode kernel (decode_warps.cu: no shared
// staging, 4 or 8 loads of K and of V in flight per lane) where the shape allows (head_dim 64 or
// 128, 1, 2, 4 or 8 query heads per KV head), else as kDefault.
enum class AttentionKernel { kDefault, kPipelined3, kWarps, kWarps8, kTiled64, kTiled32 };

// Which kernel runs the prefill tiles (bf16 caches): kMma (prefill_mma.cu: S, P and O in
// registers, mma.sync and ldmatrix, double-buffered cp.async tiles) or kWmma (the first
// tensor-core kernel: S, P and O in shared memory), kept to measure against.
enum class PrefillKernel { kMma, kWmma };

// Causal paged attention of every batch token over its sequence's cached keys (the single
// tokens one block per (token, KV head); the prefill tiles one block per (tile, KV head) on
// tensor cores: bf16 Q K^T and P V with f32 accumulation, the online softmax in f32) (positions
// [max(0, pos - window + 1), pos], window 0 = all), GQA: query head h reads KV head
// h / (num_heads / num_kv_heads). out rows are num_heads * head_dim elements of `out_elem`.
void attention(const BatchView& batch, const float* qkv, int64_t nqkv, const KvView& kv,
               int32_t layer, int32_t num_heads, int32_t sliding_window, void* out, Elem out_elem,
               AttentionKernel kernel, PrefillKernel prefill, const DecodeScratch& scratch,
               cudaStream_t stream);

// Query tokens per prefill tile for this shape (the tensor-core prefill kernel's 64 query rows
// are tokens x query heads per KV head), or 0 where that kernel does not apply (f32 caches,
// head_dim not a multiple of 16 or over 128, query heads per KV head not dividing 64): then
// every token runs in the per-token kernel.
int32_t prefill_tile_tokens(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim, Elem elem);

// Whether attention() can run this shape (head_dim and the query heads per KV head), and why
// not when it cannot; the backend checks it at construction.
bool attention_supports(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                        const char** why);

// out[r][i] = silu(gate_up[r][i]) * gate_up[r][f + i], gate_up elements of `in_elem` (bf16
// only where f % 4 == 0).
void swiglu(const void* gate_up, Elem in_elem, int64_t rows, int64_t f, void* out, Elem out_elem,
            cudaStream_t stream);

// Sampling where the logits are (draw.cu), bit for bit as the host sampler would on the same
// logits (sampling/plain_draw.h, sampling/cut_select.h), each row by its DeviceDraw. What a row
// gives back. The host finishes its logprobs (row_logprob of a logit, max, total).
struct DrawResult {
  int32_t token = 0;
  int32_t flag = 0;  // 1: the host must decide (a NaN or +inf in the row)
  float token_logit = 0;
  float max = 0;     // the row's largest logit
  double total = 0;  // its temperature-1 weights' total, block sums added in order
};
// Samples `rows` rows of `vocab` logits by params[r] (null: every row's argmax, any vocabulary;
// otherwise only for a vocabulary draw_fits). `full`: some row has a cut or logprobs; then row
// r's top tokens go to top_ids / top_logits[r * kMaxDeviceLogprobs ...], most likely first.
void draw_rows(const float* logits, int64_t rows, int64_t vocab, const DeviceDraw* params,
               bool full, DrawResult* results, int32_t* top_ids, float* top_logits,
               cudaStream_t stream);
// Whether draw_rows' block sums (and radix bins) for a row of `vocab` logits fit a block's
// shared memory on the current device.
bool draw_fits(int64_t vocab);

// Throws blend::Error naming `what` when the last launch failed.
void check_launch(const char* what);

}  // namespace blend::cuda
