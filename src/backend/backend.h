// Backend — one interface, several implementations (DESIGN.md §2): cpu (real arithmetic),
// cuda, sim (virtual clock), made by name through backend/registry.h. A backend owns the model
// weights in its preferred layout and the KV cache storage; which pages belong to whom is decided
// outside (kv/), the backend only reads and writes the pages a ForwardBatch names.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <memory_resource>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/forward_batch.h"
#include "model/config.h"
#include "sampling/device_draw.h"
#include "sampling/sampler.h"

namespace blend {

class TensorStore;
class StepWorker;

// How several models in one backend share weights (BlockLLM §6's three deployments, in one
// engine so that only the sharing differs): kBlocks, BlockLLM's block zoo (byte-identical
// blocks across all models loaded and run once); kParameterSharing, S-LoRA-style PS (a LoRA
// adapter shares its base's weights, nothing else is shared: a full fine-tune is a model of its
// own); kPerModel (every model its own copy of everything, an adapter's base too).
enum class Tenancy { kBlocks, kParameterSharing, kPerModel };

struct BackendOptions {
  int threads = 0;             // 0 = all hardware threads
  bool deterministic = false;  // results independent of batch composition (see cpu backend)
  int page_size = 16;          // tokens per KV page
  // KV pages to allocate at construction; 0 = none until allocate_kv() (the engine sizes the
  // cache from what the backend reports: kv_bytes_per_token() and kv_memory_budget()).
  int64_t num_pages = 0;
  // launch() hands the step to a worker thread and returns at once, so the engine plans the
  // next step while this one computes (NanoFlow §5.3's asynchronous scheduling). Backends that
  // compute on the host thread honour it; the simulator has no work to hide and ignores it.
  bool overlap = false;
  Tenancy tenancy = Tenancy::kBlocks;  // cpu, several models
  // The longest sequence the engine serves (--max-model-len); 0 = the model's context. Fixes
  // longrope's short/long choice for the engine's life (model/rope.h rope_inv_freq).
  int64_t max_model_len = 0;
  // The cuda backend's knobs, by name (its --cuda-NAME flags; backend/cuda/knobs.h). Any other
  // backend refuses a non-empty map (make_backend), naming the first flag.
  std::map<std::string, std::string> cuda_knobs;
};

// One logits row to turn into a token: which sequence, how to sample, and what the penalties
// look at. Rows come in the order of the batch's chunks that want logits.
struct SampleRow {
  SeqId seq = 0;
  const SamplingParams* params = nullptr;
  uint64_t rng_seed = 0;  // the draw is a function of (rng_seed, history.output.size())
  TokenHistory history;
  // Structured output: the tokens this row may take (a TokenMask's words, vocab bits), kept
  // alive by the caller until wait() returns; null = all. Applied wherever the row is sampled.
  const uint64_t* allowed = nullptr;
};

// Whether the host sampler would take the plain argmax of every row's raw logits (no
// temperature, penalties, bias, logprobs or mask): then a backend may take the argmax where the
// logits are (Backend::forward_argmax). False for no rows.
bool all_plain_greedy(std::span<const SampleRow> rows);

// A row a backend may sample where its logits are (Backend::forward_draw, a DeviceDraw): one
// whose sampling reads nothing but its raw logits (no penalties, bias or mask) and asks for at
// most kMaxDeviceLogprobs top logprobs; the backend gives what sample_token would give on
// those logits.
// Whether every row is a device draw (false for no rows).
bool all_device_draws(std::span<const SampleRow> rows);
// Every row's device draw, or nothing unless all_device_draws.
std::optional<std::vector<DeviceDraw>> device_draws(std::span<const SampleRow> rows);

// What one engine step hands a backend: the batch to compute and the rows to sample. The
// spans in `rows` point into the engine's sequences and stay valid until wait() returns.
// prompt_logprobs of one all_logits chunk of a step (SeqChunk::all_logits): its row i scores
// next[i], the prompt token after that row's, with the `top` most likely tokens there; rows
// past next.size() score nothing.
struct PromptScoring {
  size_t chunk = 0;  // index into ForwardBatch::chunks
  std::vector<TokenId> next;
  int32_t top = 0;
};

struct StepInput {
  ForwardBatch batch;
  std::vector<SampleRow> rows;
  std::vector<PromptScoring> scoring;  // empty unless a chunk has all_logits
};

// The weights a backend holds, and what they would take if no two models shared a block
// (BlockLLM §4: identical blocks of related models are loaded once).
struct WeightStats {
  int64_t bytes = 0;  // checkpoint bytes of the blocks held, shared blocks counted once (a tied
                      // embedding twice: the embedding rows and the packed lm_head)
  int64_t unshared_bytes = 0;  // the same with every model's blocks counted apart
  int32_t blocks = 0;          // blocks over all models' chains
  int32_t unique_blocks = 0;   // distinct blocks in memory
};

// What a backend's passes cost per operation of the layer sequence (embed, norm, qkv, rope_kv,
// attention, o_proj, gate_up, act, down, lm_head), summed over layers and steps since the
// backend's last reset: the cpu backend times every pass, the cuda backend when op timing is
// on (GPU event time); the simulator reports none. What `blend batch --stats` writes, so that no
// command needs to know which backend it runs.
struct OpStatistics {
  std::vector<std::pair<std::string, double>> seconds;  // per operation, in layer order
  int64_t steps = 0;
  int64_t tokens = 0;        // 0 where the backend does not count them
  int64_t thread_steps = 0;  // each step's host threads, summed (0: not counted)
};

// A chain assembled from the blocks of the models a backend holds (BlockLLM: a chain is data):
// the embedding and head of `base`, and layer i's attention from model attention[i] and FFN
// from model ffn[i]. The chain ends after its last block, where the head reads the residual
// stream: with fewer blocks than the model has, that is a logit lens at that depth. ffn holds
// as many entries as attention, or one fewer (the lens after an attention block).
struct ChainSpec {
  ModelId base = 0;
  std::vector<ModelId> attention, ffn;
};

class Backend {
 public:
  Backend();
  // The owner must wait() for a launched step before destroying the backend.
  virtual ~Backend();

  virtual const ModelConfig& config() const = 0;
  virtual std::string name() const = 0;
  // Models whose weights it holds (ModelId 0 .. num_models() - 1; SeqChunk::model picks one).
  // All share config()'s architecture, so one KV cache serves them all.
  virtual int32_t num_models() const { return 1; }
  virtual WeightStats weight_stats() const { return {}; }
  virtual OpStatistics op_statistics() const { return {}; }
  // Adds `spec` as a model of its own and returns its id (num_models() before the call, for
  // SeqChunk::model); it holds no weights of its own and no prefix cache knows it. Throws
  // blend::Error for an unknown model id or a malformed spec, and on a backend that runs each
  // model only as loaded (the default: every backend but cpu).
  virtual ModelId add_chain(const ChainSpec& spec);
  // The dtype it computes in: GEMM inputs, packed weights and KV cache elements (the cpu backend:
  // cpu_compute_dtype of the checkpoint's; the simulator: the simulated model's dtype, which its
  // step costs assume). What `serve --dtype` is checked against.
  virtual DType compute_dtype() const = 0;
  // Bytes of KV cache storage one page takes across all layers (K and V).
  virtual int64_t kv_bytes_per_page() const = 0;
  virtual int64_t num_pages() const = 0;
  // Bytes of KV storage one token takes (all layers, K and V) in the dtype this backend keeps
  // its cache in, and how many bytes of its own memory it could give the KV cache by default
  // (0 = no opinion: the caller must say). The engine sizes the cache from these.
  virtual int64_t kv_bytes_per_token() const { return kv_bytes_per_page(); }
  virtual int64_t kv_memory_budget() const { return 0; }
  // Allocates `num_pages` pages (of BackendOptions::page_size tokens) for the KV cache, once,
  // when the backend was built without them.
  virtual void allocate_kv(int64_t num_pages) = 0;

  // One engine step: launch() starts computing the batch and sampling its rows; wait() blocks
  // until it is done and returns one token per row (with logprobs where a row asked). A backend
  // may return from launch() before the work is done, so the caller can prepare the next step
  // meanwhile (NanoFlow §5.3); it must call wait() before the next launch(). The default runs
  // forward() and samples on the host (sampling/sampler), each row a pure function of its
  // logits, seed, output index and history: the result does not depend on the batch.
  virtual void launch(StepInput step);
  virtual std::vector<SampledToken> wait();
  // Whether forward() honours SeqChunk::all_logits and launch() scores StepInput::scoring
  // (prompt_logprobs): the cpu backend does; others keep only the sampled rows' logits.
  virtual bool scores_every_row() const { return false; }
  // After wait(): the waited step's prompt logprobs, one list per StepInput::scoring entry in
  // its order (next.size() entries each, entry i scoring next[i]).
  std::vector<std::vector<PromptLogprob>> take_prompt_logprobs() { return std::move(scored_); }
  // Whether launch() returns before the step is computed. The engine then plans step i+1 while
  // step i runs and sees step i's tokens (an EOS among them) one step late.
  virtual bool launch_overlaps() const { return worker_ != nullptr; }
  // Whether a step's compute-bound and memory-bound parts run at the same time (NanoFlow's
  // nano-batch pipeline), so that a step's time is nearer the longer part than their sum. The
  // offline planner paces steps by it (plan::PacingOptions::sequential_steps).
  virtual bool overlaps_compute_and_memory() const { return false; }
  // Blocks until the launched step's work is done, leaving its tokens for wait(). Page I/O from
  // the caller's thread (read_pages, write_pages, copy_page, the slot copies) must follow it
  // while a step is in flight: the step may still be writing those pages.
  virtual void synchronize();

  // Runs all layers over the batch, writes the batch's K/V into its pages, and fills `logits`
  // with one row of vocab_size floats per chunk that wants logits (in chunk order). Profiling,
  // reference checks and the default launch() use it; the engine steps through launch/wait.
  virtual void forward(const ForwardBatch& batch, std::span<float> logits) = 0;
  // forward() for a step whose rows all sample greedily with nothing that reads the rest of the
  // row (no logprobs, penalties, logit_bias or mask): writes each logits row's argmax (lowest id
  // on ties) to `tokens` instead. A backend whose logits live elsewhere (a GPU) overrides it to
  // skip moving whole vocabulary rows to the host; it returns false, having computed nothing
  // the caller can use, where the host sampler must decide (a NaN or +inf in a row). The
  // default computes nothing and returns false.
  virtual bool forward_argmax(const ForwardBatch& batch, std::span<TokenId> tokens);
  // forward() for a step whose rows are all device draws (device_draws): writes to `out` each
  // row's token and logprobs, those sample_token would give on the row's logits. Like
  // forward_argmax it returns false where the host must decide. The default takes forward_argmax
  // when every draw is an argmax without logprobs, and declines otherwise; a GPU backend draws
  // every kind (backend/cuda/draw.cu).
  virtual bool forward_draw(const ForwardBatch& batch, std::span<const DeviceDraw> draws,
                            std::span<SampledToken> out);
  // Whether a step sampling `rows` has them sampled where the logits are, with no vocabulary
  // rows for the host (what step timings record for the cost model): by default whether they are
  // all device draws; a backend that takes only some kinds of draw says which.
  virtual bool samples_on_device(std::span<const SampleRow> rows) const {
    return all_device_draws(rows);
  }

  // Copies one page's K/V (all layers) to another page (copy-on-write of a shared last page).
  virtual void copy_page(PageId src, PageId dst) = 0;

  // Gathers the K/V of `pages` (all layers) into one contiguous buffer of
  // pages.size() * kv_bytes_per_page() bytes, page after page, and scatters such a buffer back.
  // This is how KV leaves for and returns from the host and disk tiers: one run, one buffer.
  virtual void read_pages(std::span<const PageId> pages, std::byte* out) const = 0;
  virtual void write_pages(std::span<const PageId> pages, const std::byte* in) = 0;
  // The bytes a page takes in those buffers: kv_bytes_per_page(), or 0 for a backend whose
  // pages hold nothing (the simulator charges each move and moves no bytes).
  virtual int64_t kv_page_buffer_bytes() const { return kv_bytes_per_page(); }
  // The host memory those buffers should live in when they are kept (the KV host tier,
  // kv/kv_tiers.h): the default heap, or memory this backend's copies run fastest from (the
  // cuda backend's is page-locked). It outlives every buffer taken from it while the backend
  // lives.
  virtual std::pmr::memory_resource* host_memory() { return std::pmr::new_delete_resource(); }
  // Slots [first, first + count) of one page's K/V (all layers) into / out of `image`, a
  // kv_bytes_per_page() buffer laid out as read_pages writes one page; the other bytes of the
  // image are left alone. BROS lazy checkpointing (§5.2) saves only the slots a peer sequence
  // is about to overwrite.
  virtual void read_slots(PageId page, int32_t first, int32_t count, std::byte* image) const = 0;
  virtual void write_slots(PageId page, int32_t first, int32_t count, const std::byte* image) = 0;

  // The clock the engine's deadlines and statistics read, in seconds: wall time since the
  // backend was made, or a simulator's virtual time.
  virtual double clock_seconds() const;

 protected:
  // The default launch() runs forward() and sampling on a worker thread of its own from now on
  // (BackendOptions::overlap); call it from the constructor.
  void compute_steps_on_worker();

 private:
  void compute_step();  // forward() and sampling of pending_ into sampled_
  // compute_step for a step with prompt scoring: every row of its all_logits chunks on the
  // host, sampled rows picked out of them.
  void compute_scoring_step();
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  StepInput pending_;  // the default launch/wait: the step launched and not yet waited for
  bool launched_ = false;
  std::vector<float> logits_;
  std::vector<SampledToken> sampled_;
  std::vector<std::vector<PromptLogprob>> scored_;  // of pending_.scoring
  std::unique_ptr<StepWorker> worker_;  // null: launch() computes on the caller's thread
};

// Throws blend::Error naming `backend` and what is wrong when `batch` is not one a backend can
// compute: positions that are not num_cached + i, chunks that do not tile the tokens, block
// tables too short or naming pages outside [0, num_pages), token ids outside the vocabulary, a
// model outside [0, num_models), or a logits span shorter than num_logit_rows() * vocab_size
// floats.
void check_forward_batch(const ForwardBatch& batch, const ModelConfig& config, int64_t page_size,
                         int64_t num_pages, size_t logits_size, const std::string& backend,
                         int32_t num_models = 1);

// KV bytes per token for a model whose cache holds elements of `kv_elem_bytes` bytes.
inline int64_t kv_bytes_per_token(const ModelConfig& c, int64_t kv_elem_bytes) {
  return 2 * c.num_layers * c.kv_dim() * kv_elem_bytes;
}

}  // namespace blend
