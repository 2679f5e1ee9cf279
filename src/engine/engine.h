// Engine — the one-way loop of DESIGN.md §2: scheduler -> step plan -> backend forward ->
// sampler -> outputs. It owns the model (config, tokenizer, backend with weights and KV
// storage), the KV page pool and the scheduler; callers submit tokenized requests and get one
// result per request through a callback, in the order requests finish.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/constraint.h"
#include "core/request.h"
#include "core/sequence.h"
#include "kv/page_pool.h"
#include "kv/radix_cache.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "model/zoo.h"
#include "sampling/sampler.h"
#include "sched/scheduler.h"
#include "text/tokenizer.h"

namespace blend {

struct EngineOptions {
  std::string backend = "cpu";  // backend/registry.h kind, for engines made from a model folder
  int threads = 0;              // 0 = all hardware threads
  bool deterministic = false;   // batch-invariant numerics (see backend/cpu)
  // Plan step i+1 while step i computes (NanoFlow §5.3), on backends whose launch() returns
  // early (BackendOptions::overlap): a request's EOS is seen one step late, and the token
  // computed in that extra step is dropped. Tokens are the same either way.
  bool overlap = false;
  int32_t page_size = 16;
  // Longest prompt + output of a sequence (vLLM's --max-model-len); 0 = the model's context.
  // More than the model's max_position_embeddings is refused.
  int64_t max_model_len = 0;
  double kv_memory_gb = 0;   // KV cache size; 0 = a share of the free memory
  bool prefix_cache = true;  // reuse cached prompt prefixes (kv/radix_cache)
  // KV tiers for cached pages evicted from the KV cache (kv/kv_tiers): host memory, then disk.
  double kv_host_memory_gb = 0;  // 0 = no host tier
  std::string kv_disk_dir;       // empty = no disk tier
  double kv_disk_gb = 10;        // cap of the disk tier
  // What "load it back or recompute it" weighs (kv/radix_cache): the host link's rate and a
  // token's recomputation. 0 = the cpu host's assumed figures (KvTierOptions; 2e11 FLOP/s);
  // simulate-serve sets them from its cost model, the same swap line its backend charges.
  double kv_host_link_bytes_per_s = 0;
  double kv_recompute_seconds_per_token = 0;
  SchedulerOptions scheduler;
  uint64_t seed = 0;  // mixed into the seed of requests that bring none
  // Latency targets of real-time requests that bring none (BROS's defaults).
  double ttft_slo = 0.4, tpot_slo = 0.2;
  // Adaptive serving (BlockLLM §5.3, add_adaptive_chain): whether a request that does not say
  // (GenerationRequest::adaptive_blocks unset) allows it. Off by default: it may change outputs.
  bool adaptive_by_default = false;
  // With several models: how they share weights (backend/backend.h Tenancy; cpu backend).
  Tenancy tenancy = Tenancy::kBlocks;
  // The cuda backend's --cuda-NAME knobs (BackendOptions::cuda_knobs).
  std::map<std::string, std::string> cuda_knobs;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t batch_tokens = 0;   // sum over steps of tokens computed
  int64_t prompt_tokens = 0;  // of the requests submitted
  // Tokens generated, counted in the step that accepts each (a request still running, or later
  // cancelled, is in it: /metrics and progress lines see them as they come).
  int64_t output_tokens = 0;
  // By request class (RequestClass as the index): prompt tokens once a sequence's prefill is
  // done (its first token), output tokens as output_tokens counts them.
  std::array<int64_t, 2> prompt_tokens_by_class{}, output_tokens_by_class{};
  int64_t finished = 0;
  int64_t preemptions = 0;
  int64_t kv_peak_bytes = 0;
  int64_t kv_capacity_bytes = 0;
  int64_t cached_prompt_tokens = 0;   // prompt tokens served from the prefix cache
  int64_t resumed_cached_tokens = 0;  // preempted sequences' tokens found in the cache
  int64_t cache_evicted_pages = 0;
  int64_t kv_offloaded_pages = 0;  // pages moved to the host/disk tiers
  int64_t kv_loaded_pages = 0;     // pages brought back from them instead of recomputed
  int64_t kv_host_bytes = 0;       // tier usage now
  int64_t kv_disk_bytes = 0;
  int64_t kv_used_bytes = 0;         // now, held by requests
  int64_t kv_cached_idle_bytes = 0;  // now, held only by the prefix cache (reclaimable)
  // Bidirectional KV pages (BROS §5): pages given a second holder, slots checkpointed to host
  // memory before an RT sequence overwrote them, pages restored from such checkpoints, and
  // pages a BE sequence moved off to leave the slots to its RT peer.
  int64_t kv_shared_pages = 0;
  int64_t kv_checkpointed_slots = 0;
  int64_t kv_restored_pages = 0;
  int64_t kv_moved_pages = 0;
  // Wall-clock seconds inside step(): in the scheduler's schedule() call (building the step
  // plan), and in whole steps (plan, forward, sampling, callbacks). Their ratio is BROS
  // Fig. 14's scheduling overhead per iteration.
  double schedule_seconds = 0;
  double step_seconds = 0;
  // Wall-clock seconds the engine's thread spent inside the backend's launch() and wait():
  // computing, or waiting for a step computed meanwhile. step_seconds - backend_seconds is the
  // engine's own work (planning, detokenizing, stop checks, callbacks), which
  // --overlap-schedule runs while the backend computes.
  double backend_seconds = 0;
  // Sampled rows whose logits held no finite value (NaN weights, a broken checkpoint): the
  // sampler survives them, and this says it happened.
  int64_t invalid_logit_rows = 0;
  // Requests run on an adaptive chain (add_adaptive_chain) instead of their model's own.
  int64_t adaptive_requests = 0;
};

// A finished request's life on the engine's clock (seconds), for vLLM's queue, prefill and
// inference times: submitted, first put into a step, its first token accepted, finished. A
// moment it never reached is negative: a request finished inside submit() (max_tokens 0) was
// never scheduled, one that failed in its first step has no first token. A preempted request
// keeps its first scheduling.
struct RequestTimes {
  RequestClass request_class = RequestClass::kRealtime;
  double arrival = 0, first_scheduled = -1, first_token = -1, finished = 0;
};

class Engine {
 public:
  using Callback = std::function<void(GenerationResult&&)>;
  // Called once per generated token, on the thread that runs step(), with the token (its
  // logprobs when the request asked) and the text it makes final: text that could still turn
  // out to start a stop string is held back (and never sent if it does), so the deltas of a
  // request concatenate to GenerationResult::text.
  using TokenCallback = std::function<void(const SampledToken& token, std::string_view delta)>;

  // Loads a Hugging Face model folder (or a LoRA adapter folder on its base: model_folders) onto
  // a backend of kind options.backend; the model is named by the folder's name
  // (model_folder_name).
  Engine(const std::filesystem::path& model_dir, const EngineOptions& options);
  // Several models in one engine (ModelId i = models[i]; 0 is the default): fine-tunes of one
  // architecture, sharing the KV cache and the batch, never each other's cached KV. Blocks
  // identical across models are loaded once where the backend can (cpu). Throws blend::Error
  // when a model's architecture differs from the first's, or names repeat.
  Engine(const std::vector<ModelFolder>& models, const EngineOptions& options);
  // An engine over a backend made by the caller (the simulator, a test's backend). Without a
  // tokenizer, requests come as token ids and results carry no text. A backend without KV pages
  // gets them sized as the model-folder constructor sizes them.
  Engine(std::unique_ptr<Backend> backend, const EngineOptions& options,
         std::unique_ptr<Tokenizer> tokenizer = nullptr);
  ~Engine();

  // The first model's config; every model shares its architecture.
  const ModelConfig& config() const { return models_[0].config; }
  // A model's tokenizer (model 0's by default); only when it has one.
  const Tokenizer& tokenizer(ModelId model = 0) const { return *models_.at(model).tokenizer; }
  bool has_tokenizer() const { return models_[0].tokenizer != nullptr; }
  // The models, by ModelId: name ("" for an engine made from a backend), folder, config.
  int32_t num_models() const { return static_cast<int32_t>(models_.size()); }
  const std::string& model_name(ModelId model) const { return models_.at(model).name; }
  // The model called `name`, if one is.
  std::optional<ModelId> find_model(std::string_view name) const {
    for (ModelId m = 0; m < num_models(); ++m)
      if (models_[static_cast<size_t>(m)].name == name) return m;
    return std::nullopt;
  }
  const std::filesystem::path& model_dir(ModelId model) const { return models_.at(model).dir; }
  // The folders it was made from (name, model folder, LoRA adapter folder or empty).
  ModelFolder model_folder(ModelId model) const {
    const Model& m = models_.at(model);
    return {m.name, m.dir, m.adapter ? m.adapter->dir() : std::filesystem::path()};
  }
  const ModelConfig& config(ModelId model) const { return models_.at(model).config; }
  // The first model that reads text as `model` does (byte-identical tokenizer.json) and ends at
  // the same EOS ids: `model` itself when none before it does. Models with one owner can share
  // what is built over a vocabulary (the grammar compiler's token tables).
  ModelId tokenizer_owner(ModelId model) const { return tokenizer_owner_.at(model); }
  // Whether every model reads text with model 0's tokenizer and ends at its EOS ids.
  bool models_share_tokenizer() const {
    return std::all_of(tokenizer_owner_.begin(), tokenizer_owner_.end(),
                       [](ModelId owner) { return owner == 0; });
  }
  // Adaptive serving (BlockLLM §5.3; blocks/adaptive.h chooses the chains): requests of `model`
  // that allow it (GenerationRequest::adaptive_blocks, else EngineOptions::adaptive_by_default)
  // run on `chain` (Backend::add_chain) for their whole life, with their own KV (the prefix cache
  // keeps it apart from the model's). In a step their rows sit right after `beside`'s, the model
  // whose blocks the chain borrows, so the backend runs each borrowed block once over both.
  // Returns the chain's id. Throws blend::Error for an unknown model or `beside`, a model that
  // has a chain already, a request already submitted, a chain that does not run every layer, or a
  // backend that cannot assemble chains.
  ModelId add_adaptive_chain(ModelId model, const ChainSpec& chain, ModelId beside);
  // The chain requests of `model` may run on, if it has one.
  std::optional<ModelId> adaptive_chain(ModelId model) const {
    const ModelId c = adaptive_chain_.empty() ? -1 : adaptive_chain_.at(model);
    return c < 0 ? std::nullopt : std::optional<ModelId>(c);
  }
  // The backend's weights: bytes in memory, and what models sharing no block would take.
  WeightStats weight_stats() const { return backend_->weight_stats(); }
  // The backend, for tools that drive it directly while the engine holds no request (`blend zoo
  // analyze` runs its own forward passes over the KV pages, which no request then owns).
  Backend& backend() { return *backend_; }
  // Whether the backend overlaps a step's compute and memory parts (Backend::
  // overlaps_compute_and_memory).
  bool overlaps_compute_and_memory() const { return backend_->overlaps_compute_and_memory(); }
  // The dtype the backend computes in (Backend::compute_dtype).
  DType compute_dtype() const { return backend_->compute_dtype(); }
  // Longest prompt + output one sequence may reach (context window and KV capacity).
  int64_t max_sequence_tokens() const;

  // Checks the request (empty prompt, token ids out of range, prompt too long) and queues it;
  // throws blend::Error for a bad request. max_tokens is capped at what the context allows.
  // Returns the sequence id, for cancel().
  // check_request() alone runs the same checks and caps max_tokens the same way.
  void check_request(GenerationRequest& request) const;
  SeqId submit(GenerationRequest request, Callback on_done, TokenCallback on_token = {});
  // Drops a request that has not finished: its KV pages are freed at once and none of its
  // callbacks run again. False when the id is unknown (finished already).
  bool cancel(SeqId id);

  // Requests not finished yet, or a step still computing.
  bool has_work() const { return scheduler_->has_work() || in_flight_.has_value(); }
  // One iteration: with overlap, collects the step in flight and launches the next one, whose
  // computing overlaps this step's bookkeeping and the caller's work until the next step().
  void step();
  // Checks the KV page pool and the prefix cache for leaks and double frees (aborts). Tests.
  void check_invariants() const;
  void run_until_done();

  // Called, in the order added, at the end of every step that ran a forward pass, with the
  // batch it ran, when the step began on the engine's clock, and whether every row it sampled
  // was sampled on the device (Backend::samples_on_device). Step timings (`blend batch
  // --step-timings`) fit the cost model on them; `--plot` draws the run's timeline.
  using StepObserver =
      std::function<void(const ForwardBatch& batch, double started, bool device_draws)>;
  void add_step_observer(StepObserver observer) { step_observers_.push_back(std::move(observer)); }
  // Called, in the order added, for every request that finishes (not for cancelled ones), just
  // before its result callback, on the thread that runs step() or submit().
  using FinishObserver = std::function<void(const RequestTimes& times)>;
  void add_finish_observer(FinishObserver observer) {
    finish_observers_.push_back(std::move(observer));
  }

  EngineStats stats() const;
  // The engine's clock (seconds): the backend's (wall time since start, or a simulator's).
  double clock_seconds() const { return now(); }
  size_t num_running() const { return scheduler_->num_running(); }
  int32_t max_batch_tokens() const { return scheduler_->max_batch_tokens(); }
  void set_max_batch_tokens(int32_t tokens) { scheduler_->set_max_batch_tokens(tokens); }
  size_t num_waiting() const { return scheduler_->num_waiting(); }
  // The hybrid policy's iteration model (SchedulerOptions: profiled, given, or fitted online).
  const IterationCostModel& iteration_cost() const { return scheduler_->iteration_cost(); }

 private:
  struct Active;
  // A launched step, until its tokens are applied: what its bookkeeping needs once the
  // sequences it ran may have finished (rows are matched to sequences by id).
  struct InFlight {
    std::vector<SeqId> row_seqs;  // the sequence of each sampled row
    int32_t num_tokens = 0;
    double started = 0;  // engine clock at launch
    bool measure_cost = false;
    IterationSample cost;
    ForwardBatch observed;  // for the step observer
    bool device_draws = false;
    // The sequence of each StepInput::scoring entry and the position its first row scores from
    // (its prompt_logprobs entries start there).
    std::vector<std::pair<SeqId, int32_t>> scoring_seqs;
    // Token masks of the constrained rows: the backend reads them until the step is collected.
    std::vector<std::shared_ptr<const TokenMask>> masks;
  };
  bool accept_token(Active& a, const SampledToken& sampled);  // true when finished
  void finish(Active& a);
  void retire(SeqId id);  // forgets a request, once no launched step reads its sequence
  void stream(Active& a, const SampledToken& token, bool final);
  // The tokens a request of `model` sampled with `p` may take while it has fewer than
  // p.min_tokens output tokens: every token but the model's EOS ids and p.stop_token_ids.
  std::vector<uint64_t> min_tokens_mask(ModelId model, const SamplingParams& p) const;
  void init_kv_and_scheduler();
  StepInput build_step(const StepPlan& plan) const;
  // prompt_logprobs: the prompt positions chunk `chunk` of `seq` computes whose next token is a
  // prompt token scored into `in` (and the chunk marked all_logits); nothing without them.
  static void add_prompt_scoring(const Sequence& seq, size_t chunk, StepInput& in);
  // Writes the collected step's prompt logprobs into their requests.
  void collect_prompt_logprobs(const InFlight& step);
  void move_kv(const StepPlan& plan);  // BROS checkpoints, page copies and restores
  void launch_step(const StepPlan& plan);
  // Waits for the step in flight and writes its tokens into their sequences.
  std::vector<SampledToken> collect_step();
  // Statistics, stop conditions, streaming and results of the step collected last.
  void apply_tokens(const InFlight& step, const std::vector<SampledToken>& sampled);

  struct Model {
    std::string name;
    std::filesystem::path dir;  // empty for an engine made from a backend
    ModelConfig config;
    std::shared_ptr<const TensorStore> weights;  // when loaded from a model folder (one per
                                                 // folder, shared by the adapters on it)
    std::unique_ptr<LoraAdapter> adapter;        // a LoRA model's adapter, applied to `weights`
    std::unique_ptr<Tokenizer> tokenizer;        // null: token ids in, token ids out
  };

  EngineOptions options_;
  std::vector<Model> models_;  // never empty; the backend holds &models_[0].config
  std::unique_ptr<Backend> backend_;
  std::vector<ModelId> tokenizer_owner_;  // per model (tokenizer_owner)
  // Adaptive serving: per model, its chain's id or -1 (empty: none); per chain (ids from
  // num_models() on), the model whose requests run it and the model its rows sit beside.
  std::vector<ModelId> adaptive_chain_;
  struct ChainModel {
    ModelId model = 0, beside = 0;
    int32_t own_blocks = 0;  // attention and FFN blocks not named as `beside`'s
  };
  std::vector<ChainModel> chains_;
  // The model whose tokenizer, EOS ids and config a sequence's model id (a chain's too) uses.
  ModelId text_model(ModelId id) const {
    return id < num_models() ? id : chains_.at(static_cast<size_t>(id - num_models())).model;
  }
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<KvTiers> tiers_;  // null without --kv-host-memory / --kv-disk
  std::unique_ptr<KvPageIo> page_io_;
  std::unique_ptr<RadixCache> cache_;  // null when prefix caching is off
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<SeqId, std::unique_ptr<Active>> active_;
  std::optional<InFlight> in_flight_;
  // Requests finished or cancelled while a launched step may still read their sequences (its
  // sampling rows point into them): dropped once that step is collected.
  std::vector<std::unique_ptr<Active>> retired_;
  SeqId next_id_ = 1;
  EngineStats stats_;
  std::vector<StepObserver> step_observers_;
  std::vector<FinishObserver> finish_observers_;
  double now() const { return backend_->clock_seconds(); }  // the clock of SLO deadlines
};

}  // namespace blend
