#include "engine/engine.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <tuple>

#include "backend/registry.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "engine/active.h"

namespace blend {
namespace {

// Holds the place of a token a launched step is still sampling (collect_step writes it).
constexpr TokenId kPendingToken = -1;

// A model folder's tokenizer.json, compared byte for byte (the tokenizer loader's own bound).
std::string read_file_bytes(const std::filesystem::path& path) {
  return read_regular_file(path, 1u << 30);
}

uint64_t hash_string(const std::string& s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The backend seen as the prefix cache's page mover.
class BackendPageIo : public KvPageIo {
 public:
  explicit BackendPageIo(Backend& backend) : backend_(backend) {}
  // A launched step may still be writing pages the cache just freed or is about to load into.
  void read_pages(std::span<const PageId> pages, std::byte* out) override {
    backend_.synchronize();
    backend_.read_pages(pages, out);
  }
  void write_pages(std::span<const PageId> pages, const std::byte* in) override {
    backend_.synchronize();
    backend_.write_pages(pages, in);
  }

 private:
  Backend& backend_;
};

}  // namespace

Engine::Engine(const std::filesystem::path& model_dir, const EngineOptions& options)
    : Engine(model_folders(model_dir, "", ""), options) {}  // a LoRA adapter folder, too

Engine::Engine(const std::vector<ModelFolder>& models, const EngineOptions& options)
    : options_(options) {
  if (models.empty()) throw Error("internal: an engine without a model");
  check_model_names(models);
  for (const ModelFolder& folder : models) {
    Model m;
    m.name = folder.name;
    m.dir = folder.dir;
    m.config = ModelConfig::from_dir(folder.dir);
    if (!models_.empty()) {
      const std::string differs = architecture_difference(models_[0].config, m.config);
      if (!differs.empty())
        throw Error("model '" + folder.name + "' (" + folder.dir.string() + ") differs from '" +
                    models_[0].name + "' in " + differs +
                    "; models served together must share one architecture");
    }
    for (const Model& earlier : models_)
      if (!m.weights && earlier.weights && std::filesystem::equivalent(earlier.dir, folder.dir))
        m.weights = earlier.weights;
    if (!m.weights)
      m.weights = std::make_shared<const TensorStore>(TensorStore::open_dir(folder.dir));
    if (!folder.adapter.empty()) {
      m.adapter = LoraAdapter::open(folder.adapter, m.config);
      // An adapter folder with its own tokenizer usually added tokens, and with them trained
      // embedding rows (modules_to_save), which are refused; a copy of the base's is fine.
      const auto own = folder.adapter / "tokenizer.json";
      if (path_exists(own) &&
          read_file_bytes(own) != read_file_bytes(folder.dir / "tokenizer.json"))
        throw Error("the adapter " + folder.adapter.string() +
                    " brings a tokenizer.json that differs from its base model's; adapters with "
                    "their own tokenizer are not supported");
    }
    m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(folder.dir));
    models_.push_back(std::move(m));
  }
  std::vector<std::string> tokenizer_json;  // read only when there are several models
  for (size_t i = 0; i < models.size() && models.size() > 1; ++i)
    tokenizer_json.push_back(read_file_bytes(models[i].dir / "tokenizer.json"));
  for (size_t i = 0; i < models.size(); ++i) {
    size_t owner = 0;
    while (owner < i && (tokenizer_json[owner] != tokenizer_json[i] ||
                         models_[owner].config.eos_token_ids != models_[i].config.eos_token_ids))
      ++owner;
    tokenizer_owner_.push_back(static_cast<ModelId>(owner));
  }
  if (options.max_model_len < 0 || options.max_model_len > config().max_position_embeddings)
    throw Error("max_model_len " + std::to_string(options.max_model_len) + " is outside [1, " +
                std::to_string(config().max_position_embeddings) +
                "], the model's context (max_position_embeddings)");
  BackendInputs in;
  in.config = &models_[0].config;
  in.weights = models_[0].weights.get();
  for (size_t i = 1; i < models_.size(); ++i) in.more_weights.push_back(models_[i].weights.get());
  for (const Model& m : models_)
    if (m.adapter) in.adapters.resize(models_.size());
  for (size_t i = 0; i < in.adapters.size(); ++i) in.adapters[i] = models_[i].adapter.get();
  in.options.threads = options.threads;
  in.options.deterministic = options.deterministic;
  in.options.page_size = options.page_size;
  in.options.overlap = options.overlap;
  in.options.tenancy = options.tenancy;
  in.options.max_model_len = options.max_model_len;
  in.options.cuda_knobs = options.cuda_knobs;
  backend_ = make_backend(options.backend, in);
  init_kv_and_scheduler();
}

Engine::Engine(std::unique_ptr<Backend> backend, const EngineOptions& options,
               std::unique_ptr<Tokenizer> tokenizer)
    : options_(options), backend_(std::move(backend)) {
  Model m;
  m.config = backend_->config();
  m.tokenizer = std::move(tokenizer);
  models_.push_back(std::move(m));
  tokenizer_owner_ = {0};
  init_kv_and_scheduler();
}

void Engine::init_kv_and_scheduler() {
  const EngineOptions& options = options_;
  if (backend_->num_pages() == 0) {
    // The KV cache: --kv-memory, or what the backend offers, but no more than max_running
    // full-length sequences could ever use.
    const int64_t page_bytes = backend_->kv_bytes_per_token() * options.page_size;
    int64_t kv_bytes = static_cast<int64_t>(options.kv_memory_gb * 1e9);
    if (kv_bytes <= 0) {
      kv_bytes = backend_->kv_memory_budget();
      if (kv_bytes <= 0)
        throw Error("the " + backend_->name() + " backend needs --kv-memory: it has no default");
      const int64_t useful =
          page_bytes * options.scheduler.max_running *
          ((config().max_position_embeddings + options.page_size - 1) / options.page_size);
      kv_bytes = std::min(kv_bytes, useful);
    }
    const int64_t num_pages = kv_bytes / page_bytes;
    if (num_pages < 1)
      throw Error("--kv-memory is too small: one KV page of " + std::to_string(options.page_size) +
                  " tokens takes " + std::to_string(page_bytes) + " bytes");
    backend_->allocate_kv(num_pages);
    if (backend_->kv_bytes_per_page() != page_bytes)
      throw Error("internal: backend KV page size disagrees with its bytes per token");
  }
  const int64_t page_bytes = backend_->kv_bytes_per_page();
  const int64_t num_pages = backend_->num_pages();
  pool_ = std::make_unique<PagePool>(num_pages, options.page_size);
  if (options.prefix_cache) {
    RadixCacheTiers t;
    if (options.kv_host_memory_gb > 0 || !options.kv_disk_dir.empty()) {
      KvTierOptions to;
      to.host_bytes = static_cast<int64_t>(options.kv_host_memory_gb * 1e9);
      to.disk_dir = options.kv_disk_dir;
      to.disk_bytes = static_cast<int64_t>(options.kv_disk_gb * 1e9);
      if (options.kv_host_link_bytes_per_s > 0)
        to.host_bytes_per_s = options.kv_host_link_bytes_per_s;
      to.host_memory = backend_->host_memory();
      tiers_ = std::make_unique<KvTiers>(to, page_bytes, backend_->kv_page_buffer_bytes());
      page_io_ = std::make_unique<BackendPageIo>(*backend_);
      t.tiers = tiers_.get();
      t.io = page_io_.get();
      // A miss costs a forward pass over the token: 2 FLOPs per matmul parameter at an assumed
      // 2e11 FLOP/s (below what the cpu backend measures: loading must clearly win to be chosen).
      t.recompute_seconds_per_token =
          options.kv_recompute_seconds_per_token > 0
              ? options.kv_recompute_seconds_per_token
              : 2.0 * static_cast<double>(config().num_matmul_parameters()) / 2e11;
    }
    cache_ = std::make_unique<RadixCache>(*pool_, t);
  }
  SchedulerOptions sched = options.scheduler;
  sched.kv_page_bytes = backend_->kv_bytes_per_page();
  sched.drops_swap_out = tiers_ != nullptr;
  scheduler_ = std::make_unique<Scheduler>(*pool_, sched, cache_.get());
  stats_.kv_capacity_bytes = num_pages * page_bytes;
}

ModelId Engine::add_adaptive_chain(ModelId model, const ChainSpec& chain, ModelId beside) {
  auto check = [&](ModelId m, const char* what) {
    if (m < 0 || m >= num_models())
      throw Error(std::string("adaptive chain: ") + what + " " + std::to_string(m) +
                  " is not a model of this engine");
  };
  check(model, "model");
  check(beside, "model");
  if (adaptive_chain(model))
    throw Error("adaptive chain: model '" + model_name(model) + "' has one already");
  if (next_id_ != 1) throw Error("adaptive chain: added after requests were submitted");
  // A shorter chain is a logit lens (Backend::add_chain), not a model to serve.
  const auto layers = static_cast<size_t>(config().num_layers);
  if (chain.attention.size() != layers || chain.ffn.size() != layers)
    throw Error("adaptive chain: a served chain runs every layer (" + std::to_string(layers) +
                " attention and FFN blocks)");
  const auto expected = static_cast<ModelId>(num_models() + static_cast<int32_t>(chains_.size()));
  const ModelId id = backend_->add_chain(chain);
  if (id != expected)
    throw Error("internal: the backend numbered an adaptive chain " + std::to_string(id) +
                ", the engine expected " + std::to_string(expected));
  adaptive_chain_.resize(static_cast<size_t>(num_models()), -1);
  adaptive_chain_[static_cast<size_t>(model)] = id;
  int32_t own = 0;
  for (const auto* blocks : {&chain.attention, &chain.ffn})
    for (ModelId m : *blocks) own += m != beside ? 1 : 0;
  chains_.push_back({model, beside, own});
  return id;
}

Engine::~Engine() {
  if (in_flight_) {
    try {
      backend_->wait();  // the backend's step may not outlive what it reads
    } catch (...) {
    }
  }
  scheduler_.reset();
  cache_.reset();  // returns the cached pages to the pool before it goes
  tiers_.reset();
}

void Engine::check_invariants() const {
  if (cache_) cache_->check_invariants();
  pool_->check_invariants();
  scheduler_->check_invariants();
}

int64_t Engine::max_sequence_tokens() const {
  const int64_t context =
      options_.max_model_len > 0 ? options_.max_model_len : config().max_position_embeddings;
  return std::min<int64_t>(context, pool_->num_pages() * pool_->page_size());
}

void Engine::check_request(GenerationRequest& request) const {
  if (request.model < 0 || request.model >= num_models())
    throw Error("model id " + std::to_string(request.model) + " is out of range [0, " +
                std::to_string(num_models()) + ")");
  if (request.prompt.empty()) throw Error("the prompt is empty");
  for (TokenId t : request.prompt)
    if (t < 0 || t >= config().vocab_size)
      throw Error("prompt token id " + std::to_string(t) + " is out of range [0, " +
                  std::to_string(config().vocab_size) + ")");
  const int64_t limit = max_sequence_tokens();
  const int64_t prompt_len = static_cast<int64_t>(request.prompt.size());
  if (prompt_len >= limit)
    throw Error("the prompt has " + std::to_string(prompt_len) +
                " tokens; this engine holds at most " + std::to_string(limit - 1) +
                " prompt tokens (context window and KV memory)");
  SamplingParams& p = request.params;
  if (p.max_tokens < 0) throw Error("max_tokens must be non-negative");
  p.max_tokens = static_cast<int32_t>(std::min<int64_t>(p.max_tokens, limit - prompt_len));
  if (p.min_tokens < 0) throw Error("min_tokens must be non-negative");
  if (p.temperature < 0) throw Error("temperature must be non-negative");
  if (p.top_p <= 0 || p.top_p > 1) throw Error("top_p must be in (0, 1]");
  if (p.min_p < 0 || p.min_p > 1) throw Error("min_p must be in [0, 1]");
  if (p.prompt_logprobs) {
    if (*p.prompt_logprobs < 0 || *p.prompt_logprobs > kMaxPromptLogprobs)
      throw Error("prompt_logprobs must be in [0, " + std::to_string(kMaxPromptLogprobs) + "]");
    if (p.max_tokens == 0)  // finished at submit, before any prefill could score the prompt
      throw Error("'prompt_logprobs' needs max_tokens of at least 1");
    if (!backend_->scores_every_row())
      throw Error("'prompt_logprobs' is not supported on the " + backend_->name() +
                  " backend (it keeps the logits of sampled rows only; the cpu backend "
                  "computes them)");
  }
}

SeqId Engine::submit(GenerationRequest request, Callback on_done, TokenCallback on_token) {
  check_request(request);
  const int64_t prompt_len = static_cast<int64_t>(request.prompt.size());
  const SamplingParams& p = request.params;

  auto a = std::make_unique<Active>();
  a->seq.id = next_id_++;
  a->seq.model = request.model;
  if (request.adaptive_blocks.value_or(options_.adaptive_by_default))
    if (const std::optional<ModelId> chain = adaptive_chain(request.model)) {
      a->seq.model = *chain;
      ++stats_.adaptive_requests;
    }
  a->seq.prompt_len = static_cast<int32_t>(prompt_len);
  a->seq.tokens = std::move(request.prompt);
  a->seq.params = p;
  a->seq.rng_seed = (p.seed ? *p.seed : hash_string(request.id, options_.seed)) +
                    static_cast<uint64_t>(request.index);
  a->index = request.index;
  a->seq.request_class = request.request_class;
  a->seq.ttft_slo = request.ttft_slo.value_or(options_.ttft_slo);
  a->seq.tpot_slo = request.tpot_slo.value_or(options_.tpot_slo);
  a->seq.arrival_time = a->seq.last_token_time = request.arrival_time.value_or(now());
  a->request_id = std::move(request.id);
  a->on_done = std::move(on_done);
  a->on_token = std::move(on_token);
  if (const Tokenizer* tokenizer = models_[request.model].tokenizer.get())
    a->detok = std::make_unique<IncrementalDetokenizer>(*tokenizer, p.skip_special_tokens);
  for (const auto& s : p.stop) a->max_stop_len = std::max(a->max_stop_len, s.size());
  if (p.min_tokens > 0) a->min_tokens_mask = min_tokens_mask(request.model, p);
  if (p.constraint) a->matcher = p.constraint->start();
  if (p.prompt_logprobs) {
    a->prompt_logprobs.resize(static_cast<size_t>(prompt_len));
    a->prompt_logprobs[0].token = a->seq.tokens[0];
  }
  stats_.prompt_tokens += prompt_len;

  Active& ref = *a;
  const SeqId id = ref.seq.id;
  active_.emplace(id, std::move(a));
  if (p.max_tokens == 0) {  // nothing to generate: an empty completion, at once
    ref.seq.finish = FinishReason::kLength;
    finish(ref);
    return id;
  }
  scheduler_->add(&ref.seq);
  return id;
}

bool Engine::cancel(SeqId id) {
  auto it = active_.find(id);
  if (it == active_.end()) return false;
  scheduler_->abort(&it->second->seq);
  retire(id);
  return true;
}

void Engine::retire(SeqId id) {
  auto it = active_.find(id);
  retired_.push_back(std::move(it->second));
  active_.erase(it);
  if (!in_flight_) retired_.clear();
}

StepInput Engine::build_step(const StepPlan& plan) const {
  StepInput in;
  ForwardBatch& batch = in.batch;
  batch.tokens.reserve(static_cast<size_t>(plan.num_tokens));
  batch.positions.reserve(static_cast<size_t>(plan.num_tokens));
  // With several models, each model's chunks side by side: a block then runs once over a
  // contiguous run of rows per model using it (the backend merges neighbours sharing it).
  std::vector<const ScheduledChunk*> order;
  for (const ScheduledChunk& c : plan.chunks) order.push_back(&c);
  // An adaptive chain's rows go right after the rows of the model it borrows blocks from, those
  // borrowing most first: at each layer the rows running `beside`'s block are then one run as
  // far as possible (all of them, where the chains borrow nested sets of blocks).
  auto row_order = [this](ModelId id) {
    if (id < num_models()) return std::tuple<ModelId, int32_t, ModelId>(id, -1, id);
    const ChainModel& c = chains_[static_cast<size_t>(id - num_models())];
    return std::tuple<ModelId, int32_t, ModelId>(c.beside, c.own_blocks, id);
  };
  if (num_models() > 1)
    std::stable_sort(order.begin(), order.end(),
                     [&](const ScheduledChunk* a, const ScheduledChunk* b) {
                       return row_order(a->seq->model) < row_order(b->seq->model);
                     });
  int32_t offset = 0;
  for (const ScheduledChunk* scheduled : order) {
    const ScheduledChunk& c = *scheduled;
    const Sequence& seq = *c.seq;
    SeqChunk chunk;
    chunk.seq = seq.id;
    chunk.model = seq.model;
    chunk.num_cached = seq.num_computed;
    chunk.num_tokens = c.num_tokens;
    chunk.token_offset = offset;
    chunk.wants_logits = c.samples;
    chunk.block_table = seq.block_table;
    chunk.reversed_pages = seq.reversed_pages;
    offset += c.num_tokens;
    const auto first = seq.tokens.begin() + seq.num_computed;
    batch.tokens.insert(batch.tokens.end(), first, first + c.num_tokens);
    for (int32_t i = 0; i < c.num_tokens; ++i) batch.positions.push_back(seq.num_computed + i);
    batch.chunks.push_back(std::move(chunk));
    if (seq.params.prompt_logprobs) add_prompt_scoring(seq, batch.chunks.size() - 1, in);
    if (c.samples) {
      // The tokens up to this chunk's end: a placeholder for the token sampled here follows.
      const std::span<const TokenId> all =
          std::span<const TokenId>(seq.tokens)
              .first(static_cast<size_t>(chunk.num_cached + c.num_tokens));
      in.rows.push_back({.seq = seq.id,
                         .params = &seq.params,
                         .rng_seed = seq.rng_seed,
                         .history = {.prompt = all.first(static_cast<size_t>(seq.prompt_len)),
                                     .output = all.subspan(static_cast<size_t>(seq.prompt_len))}});
    }
  }
  return in;
}

void Engine::move_kv(const StepPlan& plan) {
  // Before the forward pass: checkpoint slots about to be overwritten, copy pages (copy on
  // write, BE pages restored or moved off a shared page), write checkpointed slots back.
  for (const auto& c : plan.checkpoints)
    backend_->read_slots(c.page, c.first, c.count, c.image->image.data());
  for (const auto& [src, dst] : plan.copies) {
    if (dst >= 0) backend_->copy_page(src, dst);
    pool_->release(src);
  }
  for (const auto& [page, saved] : plan.restores) {
    const auto& mask = saved->saved;
    for (size_t a = 0; a < mask.size();) {
      if (!mask[a]) {
        ++a;
        continue;
      }
      size_t b = a + 1;
      while (b < mask.size() && mask[b]) ++b;
      backend_->write_slots(page, static_cast<int32_t>(a), static_cast<int32_t>(b - a),
                            saved->image.data());
      a = b;
    }
  }
}

void Engine::launch_step(const StepPlan& plan) {
  using WallClock = std::chrono::steady_clock;
  InFlight f;
  f.started = now();
  // What the step costs, for the hybrid policy's online iteration model (sched/iteration_fit).
  f.measure_cost = scheduler_->fits_iteration_cost();
  if (f.measure_cost) {
    for (const ScheduledChunk& c : plan.chunks) {
      if (c.num_tokens == 1 && c.seq->num_generated() > 0) {
        f.cost.decode_tokens += 1;
        f.cost.decode_context += c.seq->num_computed;
      } else {
        f.cost.prefill_tokens += c.num_tokens;
      }
    }
    f.cost.swap_pages = static_cast<int64_t>(plan.restores.size());
  }
  // Each sampled row's token takes its place now, so that the next plan sees it to compute.
  // (Before the rows take spans of the tokens: pushing may move them.)
  for (const ScheduledChunk& c : plan.chunks) {
    if (c.samples) c.seq->tokens.push_back(kPendingToken);
    if (auto it = active_.find(c.seq->id); it != active_.end() && it->second->first_scheduled < 0)
      it->second->first_scheduled = f.started;
  }
  StepInput in = build_step(plan);
  // Constrained rows get their sequence's token mask (a function of its own tokens only). The
  // rows' masks are computed in parallel: a state met for the first time builds token tables
  // (vocabulary walks, most of a short job's grammar time), and the grammar's caches are
  // thread-safe (grammar/token_mask.h), so the order cannot change a mask.
  // Rows short of their min_tokens get their mask of EOS and stop ids (vLLM's min_tokens
  // logits processor), a function of the row's own output count too. (The API refuses
  // min_tokens with a grammar: it could end the value before min_tokens.)
  std::vector<std::pair<size_t, TokenMatcher*>> constrained;  // (row, its matcher)
  for (size_t r = 0; r < in.rows.size(); ++r) {
    auto it = active_.find(in.rows[r].seq);
    if (it == active_.end()) continue;
    Active& a = *it->second;
    if (a.matcher) constrained.emplace_back(r, a.matcher.get());
    const auto out = static_cast<int64_t>(in.rows[r].history.output.size());
    if (!a.matcher && out < a.seq.params.min_tokens) in.rows[r].allowed = a.min_tokens_mask.data();
  }
  const auto n = static_cast<int64_t>(constrained.size());
  std::vector<std::shared_ptr<const TokenMask>> masks(constrained.size());
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
  for (int64_t k = 0; k < n; ++k)
    masks[static_cast<size_t>(k)] = constrained[static_cast<size_t>(k)].second->mask();
  for (size_t k = 0; k < masks.size(); ++k) {
    in.rows[constrained[k].first].allowed = masks[k]->words.data();
    f.masks.push_back(std::move(masks[k]));
  }
  // Timed on the engine's clock (the backend's: a simulator charges its moves to the step).
  const double swap0 = now();
  move_kv(plan);
  if (f.measure_cost) f.cost.swap_seconds = now() - swap0;
  f.num_tokens = in.batch.num_tokens();
  f.row_seqs.reserve(in.rows.size());
  for (const SampleRow& row : in.rows) f.row_seqs.push_back(row.seq);
  for (const PromptScoring& p : in.scoring) {
    const SeqChunk& c = in.batch.chunks[p.chunk];
    f.scoring_seqs.emplace_back(c.seq, c.num_cached);
  }
  // The observer sees the batch after the step; the backend takes its own copy of it.
  if (!step_observers_.empty()) {
    f.observed = in.batch;
    f.device_draws = backend_->samples_on_device(in.rows);
  }
  const WallClock::time_point launch0 = WallClock::now();
  backend_->launch(std::move(in));
  stats_.backend_seconds += std::chrono::duration<double>(WallClock::now() - launch0).count();
  in_flight_ = std::move(f);
  // The chunks' KV is (being) computed: the next plan starts after it.
  scheduler_->step_done(plan);
}

std::vector<SampledToken> Engine::collect_step() {
  const auto wait0 = std::chrono::steady_clock::now();
  std::vector<SampledToken> sampled = backend_->wait();
  stats_.backend_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait0).count();
  retired_.clear();  // nothing in flight reads them now
  const InFlight& f = *in_flight_;
  collect_prompt_logprobs(f);
  if (sampled.size() != f.row_seqs.size())
    throw Error("internal: the backend returned " + std::to_string(sampled.size()) +
                " tokens for " + std::to_string(f.row_seqs.size()) + " rows");
  for (size_t r = 0; r < sampled.size(); ++r) {
    auto it = active_.find(f.row_seqs[r]);
    if (it == active_.end()) continue;  // finished (seen a step late) or cancelled meanwhile
    std::vector<TokenId>& tokens = it->second->seq.tokens;
    // The newest placeholder is this step's: the next step is launched after this call.
    tokens.back() = sampled[r].token;
    // The matcher advances before the next step is launched: that step's mask depends on it.
    Active& a = *it->second;
    if (a.matcher && !a.constraint_broken) {
      a.complete_before = a.matcher->complete();
      if (!a.matcher->accept(sampled[r].token)) a.constraint_broken = true;
    }
  }
  return sampled;
}

void Engine::apply_tokens(const InFlight& step, const std::vector<SampledToken>& sampled) {
  ++stats_.steps;
  stats_.batch_tokens += step.num_tokens;
  stats_.kv_peak_bytes =
      std::max(stats_.kv_peak_bytes, pool_->peak_used() * backend_->kv_bytes_per_page());
  scheduler_->observe_iteration(now() - step.started);
  std::vector<Active*> done;
  for (size_t r = 0; r < sampled.size(); ++r) {
    if (sampled[r].invalid) ++stats_.invalid_logit_rows;
    auto it = active_.find(step.row_seqs[r]);
    if (it == active_.end()) continue;  // its EOS came a step late: this token is dropped
    Active& a = *it->second;
    if (accept_token(a, sampled[r]))
      done.push_back(&a);
    else
      stream(a, sampled[r], /*final=*/false);
  }
  for (Active* a : done) {
    // A placeholder of the step in flight, if any, is not part of the result.
    a->seq.tokens.resize(static_cast<size_t>(a->seq.prompt_len + a->accepted));
    scheduler_->finish(&a->seq);
    finish(*a);
  }
}

void Engine::step() {
  using WallClock = std::chrono::steady_clock;
  const WallClock::time_point wall0 = WallClock::now();
  // Charged on every way out of step(), exceptions included.
  struct StepTimer {
    double& total;
    WallClock::time_point start;
    ~StepTimer() { total += std::chrono::duration<double>(WallClock::now() - start).count(); }
  } step_timer{stats_.step_seconds, wall0};
  auto schedule = [&] {
    const WallClock::time_point s0 = WallClock::now();
    StepPlan plan = scheduler_->schedule(now());
    stats_.schedule_seconds += std::chrono::duration<double>(WallClock::now() - s0).count();
    return plan;
  };
  if (!in_flight_) {
    StepPlan plan = schedule();
    if (plan.empty()) {
      if (scheduler_->has_work())
        throw Error("internal: the scheduler has waiting requests but scheduled nothing");
      return;
    }
    launch_step(plan);
  }
  // With overlap, step i+1 is planned while step i computes (NanoFlow §5.3). Sequences whose
  // step-i token is an EOS are in that plan too: their extra token is dropped.
  StepPlan next;
  if (backend_->launch_overlaps() && options_.overlap) next = schedule();
  const std::vector<SampledToken> sampled = collect_step();
  InFlight done = std::move(*in_flight_);
  in_flight_.reset();
  // On the engine's clock, so a simulated engine fits its model from the steps it simulates
  // (wall time, on a real backend).
  if (done.measure_cost) done.cost.seconds = now() - done.started - done.cost.swap_seconds;
  if (!next.empty()) launch_step(next);
  apply_tokens(done, sampled);  // while `next` computes
  if (done.measure_cost) scheduler_->observe_step_cost(done.cost);
  for (const StepObserver& observe : step_observers_)
    observe(done.observed, done.started, done.device_draws);
#ifdef BLEND_CHECK_INVARIANTS
  if (!in_flight_)
    check_invariants();  // leaks, double frees, a stale tree: abort at the step that caused them
#endif
}

void Engine::run_until_done() {
  while (has_work()) step();
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.preemptions = scheduler_->num_preemptions();
  s.cached_prompt_tokens = scheduler_->cached_prompt_tokens();
  s.resumed_cached_tokens = scheduler_->resumed_cached_tokens();
  s.cache_evicted_pages = cache_ ? cache_->num_evicted() : 0;
  s.kv_offloaded_pages = cache_ ? cache_->num_offloaded_pages() : 0;
  s.kv_loaded_pages = cache_ ? cache_->num_loaded_pages() : 0;
  s.kv_host_bytes = tiers_ ? tiers_->host_used() : 0;
  s.kv_disk_bytes = tiers_ ? tiers_->disk_used() : 0;
  // Pages that only the prefix cache holds can be reclaimed at once: not "used".
  s.kv_used_bytes = (pool_->num_used() - pool_->num_cached_idle()) * backend_->kv_bytes_per_page();
  s.kv_cached_idle_bytes = pool_->num_cached_idle() * backend_->kv_bytes_per_page();
  if (const BidirectionalPages* b = scheduler_->bidirectional()) {
    s.kv_shared_pages = b->shared_pages();
    s.kv_checkpointed_slots = b->checkpointed_slots();
    s.kv_restored_pages = scheduler_->restored_pages();
    s.kv_moved_pages = scheduler_->moved_pages();
  }
  return s;
}

}  // namespace blend
