// The cpu backend: the real forward pass of a Llama-family model (LlamaForCausalLM,
// Qwen2ForCausalLM with QKV bias, MistralForCausalLM with sliding window) over a flat ragged
// batch of prefill chunks and decode tokens, with a paged KV cache it owns.
//
// Numerics: f32 weights run f32 GEMMs with an f32 KV cache; bf16 and f16 checkpoints run bf16
// GEMMs (f16 converted to bf16 at load) with f32 accumulation and a bf16 KV cache. The residual
// stream, norms, RoPE, softmax and activations are f32 throughout.
//
// Deterministic mode (BackendOptions::deterministic): a sequence's logits are bitwise identical
// whatever other sequences share the batch, in whatever order, and however its prompt was split
// into chunks (one, several, or token by token). GEMMs run on fixed-size row tiles, attention
// reduces keys in position-aligned blocks from the window start upward, norms reduce per row in
// a fixed order. The default mode differs only in the GEMMs (one call over the whole batch).
//
// The guarantee holds for one backend configuration (thread count, page size, machine); the
// default mode is close to it (same math, GEMM blocking may vary with the batch size).
//
// Threads: BackendOptions::threads OpenMP threads for GEMMs, attention and the element-wise ops;
// the constructor and forward() set the calling thread's OpenMP thread count to it. With 0 (the
// default: blend chooses), the model loads for all cores and each pass runs on the cores other
// processes leave free (cpu::CoreShare, threads.h). A pass's thread count does not change its
// results in deterministic mode. forward() may be called from any one thread at a time.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace blend {

class TensorStore;
class LoraAdapter;

// Wall time spent per operation since the last reset, summed over layers and steps.
struct CpuOpTimes {
  double embed = 0;      // embedding lookup, RoPE tables, batch checks
  double norm = 0;       // RMSNorms (and conversion to the GEMM input dtype)
  double qkv = 0;        // fused Q/K/V projection
  double rope_kv = 0;    // RoPE on q and k, writing K/V into the cache
  double attention = 0;  // paged attention
  double o_proj = 0;     // output projection + residual
  double gate_up = 0;    // fused gate/up projection
  double act = 0;        // SiLU(gate) * up
  double down = 0;       // down projection + residual
  double lm_head = 0;    // final norm of the logit rows and the lm_head GEMM
  int64_t steps = 0;
  int64_t tokens = 0;
  int64_t thread_steps = 0;  // each step's OpenMP threads, summed (CoreShare may lower them)

  double layer_gemms() const { return qkv + o_proj + gate_up + down; }
  double total() const {
    return embed + norm + qkv + rope_kv + attention + o_proj + gate_up + act + down + lm_head;
  }
};

// Which library runs the f32 GEMMs (bf16 GEMMs always use oneDNN).
enum class CpuGemmLib { kOneDnn, kOpenBlas };

// The blocks of a layer, as ChainSpec and shares_block name them.
enum class LayerBlock { kAttention, kFfn };

class CpuBackend : public Backend {
 public:
  virtual const CpuOpTimes& op_times() const = 0;
  virtual void reset_op_times() = 0;
  // What runs the GEMMs, e.g. "onednn bf16 brg:avx512_core_bf16, row tile 16".
  virtual std::string gemm_info() const = 0;
  // Runs the following passes on `threads` threads (clamped to [1, the count at construction])
  // and stops following the core share; what CoreShare does by itself under BackendOptions::threads
  // 0.
  virtual void set_threads(int threads) = 0;
  // The thread count of the last pass (or the next, before any).
  virtual int threads() const = 0;
  // Whether models a and b run the same block (byte-identical weights) at `layer`.
  virtual bool shares_block(ModelId a, ModelId b, int64_t layer, LayerBlock block) const = 0;
  // The model's inner states, for studies of its blocks (BlockLLM §4.4 stitching); forward() is
  // the serving path. Runs layers [first, last) of every chunk's model over every row of the
  // batch: the residual stream enters from `hidden_in` (num_tokens x hidden_size f32 rows), or
  // from the embedding when `hidden_in` is empty (then first must be 0), and leaves into
  // `hidden_out` (num_tokens x hidden_size, or empty). When `logits` is not empty (num_tokens x
  // vocab_size) the head (final norm, lm_head) is applied to every row of the result, whatever
  // the chunks' wants_logits. Writes K/V of layers [first, last) only. Throws blend::Error on a
  // bad range, span size or batch.
  virtual void forward_layers(const ForwardBatch& batch, int64_t first, int64_t last,
                              std::span<const float> hidden_in, std::span<float> hidden_out,
                              std::span<float> logits) = 0;
};

// The compute dtype (Backend::compute_dtype) the cpu backend picks for a checkpoint whose tensors
// are `checkpoint`, on this CPU: F32 for f32 checkpoints and where oneDNN has no bf16 matmul
// (AVX2-only CPUs), else BF16; what KV pages cost follows from it.
DType cpu_compute_dtype(DType checkpoint);

// Loads the weights of `config` from `weights` (checked against llama_tensor_specs), packs them
// for the GEMM kernels, and allocates options.num_pages KV pages of options.page_size tokens.
// Throws blend::Error on missing or mis-shaped tensors and bad options.
std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& config, const TensorStore& weights,
                                          const BackendOptions& options);
std::unique_ptr<CpuBackend> make_cpu_backend(const ModelConfig& config, const TensorStore& weights,
                                             const BackendOptions& options, CpuGemmLib f32_gemm);
// Several models of one architecture (`config`) in one backend, model i from weights[i]: each is a
// chain of blocks (embedding, per layer attention and FFN, head), and a block whose tensors are
// byte-identical to an earlier model's is loaded once and shared (BlockLLM §4). A batch's chunks
// pick their model (SeqChunk::model); each block runs once over the rows of every model using
// it. All checkpoints must be of one dtype. `adapters` is empty or holds one entry per model: a
// LoRA adapter applied to that model's checkpoint, or null. An adapted attention or FFN is its
// own block, holding only the adapter's factors: its base projections are the base block's
// packed weights, computed once over the rows of every model using them, and each adapter's
// low-rank delta is added on its own rows (BlockLLM §4.3; S-LoRA's split).
std::unique_ptr<CpuBackend> make_cpu_backend(const ModelConfig& config,
                                             std::span<const TensorStore* const> weights,
                                             const BackendOptions& options, CpuGemmLib f32_gemm,
                                             std::span<const LoraAdapter* const> adapters = {});

// `backend` as the cpu backend, for what only it offers (forward_layers, chains, the block
// analyses of blocks/); throws blend::Error "<needs> needs the cpu backend (this is NAME)"
// when it is another.
CpuBackend& cpu_backend_for(Backend& backend, const std::string& needs);

}  // namespace blend
