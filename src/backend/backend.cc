#include "backend/backend.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "core/error.h"

namespace blend {

// One thread that runs one job at a time for its owner: the default launch() posts a step, and
// wait() / synchronize() block until it is done. The thread lives as long as the backend, so
// the OpenMP team it starts in forward() is made once, not every step.
class StepWorker {
 public:
  StepWorker() : thread_([this] { run(); }) {}
  ~StepWorker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mu_);
      job_ = std::move(job);
      busy_ = true;
      error_ = nullptr;
    }
    cv_.notify_all();
  }

  // Blocks until the posted job is done; with `take_error`, rethrows what it threw (else the
  // error waits for the next finish(true)).
  void finish(bool take_error) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    if (take_error && error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || job_ != nullptr; });
      if (stop_) return;
      std::function<void()> job = std::exchange(job_, nullptr);
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after the members it reads
};

Backend::Backend() = default;
Backend::~Backend() = default;

ModelId Backend::add_chain(const ChainSpec&) {
  throw Error("the " + name() +
              " backend runs each model as loaded; chains of other models' "
              "blocks (BlockLLM) need the cpu backend");
}

void Backend::compute_steps_on_worker() {
  if (!worker_) worker_ = std::make_unique<StepWorker>();
}

void Backend::launch(StepInput step) {
  if (launched_) throw Error("internal: " + name() + " backend: launch() before wait()");
  if (static_cast<int32_t>(step.rows.size()) != step.batch.num_sample_rows())
    throw Error("internal: " + name() + " backend: " + std::to_string(step.rows.size()) +
                " sample rows for " + std::to_string(step.batch.num_sample_rows()) +
                " chunks that sample");
  if (!scores_every_row() &&
      (!step.scoring.empty() || step.batch.num_logit_rows() != step.batch.num_sample_rows()))
    throw Error("internal: the " + name() + " backend does not compute prompt logprobs");
  for (const PromptScoring& p : step.scoring)
    if (p.chunk >= step.batch.chunks.size() || !step.batch.chunks[p.chunk].all_logits ||
        p.next.size() > static_cast<size_t>(step.batch.chunks[p.chunk].num_tokens))
      throw Error("internal: " + name() + " backend: prompt scoring of a chunk without its rows");
  scored_.clear();
  pending_ = std::move(step);
  launched_ = true;
  if (worker_)
    worker_->post([this] { compute_step(); });
  else
    compute_step();
}

bool Backend::forward_argmax(const ForwardBatch&, std::span<TokenId>) {
  return false;
}

namespace {

// Whether sampling this row reads nothing but its raw logits and its sampling parameters: no
// penalties, bias or mask.
bool reads_raw_logits(const SampleRow& row) {
  const SamplingParams& p = *row.params;
  return p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         p.repetition_penalty == 1.0f && p.logit_bias.empty() && row.allowed == nullptr;
}

// Whether the host sampler would take the plain argmax of this row's raw logits.
bool plain_greedy(const SampleRow& row) {
  const SamplingParams& p = *row.params;
  return (p.temperature < kGreedyTemperature || p.top_k == 1) && !p.logprobs &&
         reads_raw_logits(row);
}

// Whether a backend may sample this row where its logits are: greedy or at a finite
// temperature (1 / T = 0 would read as the argmax), at most kMaxDeviceLogprobs logprobs.
bool device_draw(const SampleRow& row) {
  const SamplingParams& p = *row.params;
  const bool greedy = p.temperature < kGreedyTemperature || p.top_k == 1;
  return reads_raw_logits(row) && (greedy || 1.0f / p.temperature > 0.0f) &&
         (!p.logprobs || *p.logprobs <= kMaxDeviceLogprobs);
}

}  // namespace

bool all_plain_greedy(std::span<const SampleRow> rows) {
  return !rows.empty() && std::all_of(rows.begin(), rows.end(), plain_greedy);
}

bool all_device_draws(std::span<const SampleRow> rows) {
  return !rows.empty() && std::all_of(rows.begin(), rows.end(), device_draw);
}

std::optional<std::vector<DeviceDraw>> device_draws(std::span<const SampleRow> rows) {
  if (!all_device_draws(rows)) return std::nullopt;
  std::vector<DeviceDraw> draws;
  draws.reserve(rows.size());
  for (const SampleRow& row : rows)
    draws.push_back(
        device_draw_of(*row.params, row.rng_seed, static_cast<int64_t>(row.history.output.size())));
  return draws;
}

bool Backend::forward_draw(const ForwardBatch& batch, std::span<const DeviceDraw> draws,
                           std::span<SampledToken> out) {
  if (!std::all_of(draws.begin(), draws.end(), [](const DeviceDraw& d) { return d.argmax_only(); }))
    return false;
  std::vector<TokenId> tokens(out.size());
  if (!forward_argmax(batch, tokens)) return false;
  for (size_t r = 0; r < out.size(); ++r) out[r] = SampledToken{.token = tokens[r]};
  return true;
}

void Backend::compute_step() {
  if (!pending_.scoring.empty()) return compute_scoring_step();
  const std::vector<SampleRow>& rows = pending_.rows;
  if (const std::optional<std::vector<DeviceDraw>> draws = device_draws(rows)) {
    sampled_.assign(rows.size(), SampledToken{});
    if (forward_draw(pending_.batch, *draws, sampled_)) return;
  }
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  logits_.resize(static_cast<size_t>(pending_.batch.num_logit_rows()) * vocab);
  forward(pending_.batch, logits_);
  sampled_.assign(rows.size(), SampledToken{});
  // Each draw depends only on its own row, seed, output index and history, so the rows can be
  // sampled in any order, in parallel.
#pragma omp parallel for schedule(dynamic, 1) if (rows.size() > 1)
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRow& row = rows[r];
    const std::span<const float> logits(logits_.data() + r * vocab, vocab);
    sampled_[r] =
        sample_token(logits, *row.params, row.rng_seed,
                     static_cast<int64_t>(row.history.output.size()), row.history, row.allowed);
  }
}

void Backend::compute_scoring_step() {
  const ForwardBatch& batch = pending_.batch;
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  logits_.resize(static_cast<size_t>(batch.num_logit_rows()) * vocab);
  forward(batch, logits_);
  // Each chunk's first logits row; a sampled row is its chunk's last.
  std::vector<size_t> first_row(batch.chunks.size());
  std::vector<size_t> sample_row;
  size_t row = 0;
  for (size_t c = 0; c < batch.chunks.size(); ++c) {
    const SeqChunk& chunk = batch.chunks[c];
    first_row[c] = row;
    row += chunk.all_logits ? static_cast<size_t>(chunk.num_tokens) : chunk.wants_logits ? 1 : 0;
    if (chunk.wants_logits) sample_row.push_back(row - 1);
  }
  auto logits_row = [&](size_t r) {
    return std::span<const float>(logits_.data() + r * vocab, vocab);
  };
  const std::vector<SampleRow>& rows = pending_.rows;
  sampled_.assign(rows.size(), SampledToken{});
  scored_.assign(pending_.scoring.size(), {});
  // (scoring entry, row within its chunk) pairs: every prompt row is scored on its own, in any
  // order, as the sampled rows are.
  std::vector<std::pair<size_t, size_t>> work;
  for (size_t s = 0; s < pending_.scoring.size(); ++s) {
    scored_[s].resize(pending_.scoring[s].next.size());
    for (size_t i = 0; i < pending_.scoring[s].next.size(); ++i) work.emplace_back(s, i);
  }
  const auto n_sample = static_cast<int64_t>(rows.size());
  const auto n_jobs = n_sample + static_cast<int64_t>(work.size());
#pragma omp parallel for schedule(dynamic, 1) if (n_jobs > 1)
  for (int64_t j = 0; j < n_jobs; ++j) {
    if (j < n_sample) {
      const SampleRow& r = rows[static_cast<size_t>(j)];
      sampled_[static_cast<size_t>(j)] =
          sample_token(logits_row(sample_row[static_cast<size_t>(j)]), *r.params, r.rng_seed,
                       static_cast<int64_t>(r.history.output.size()), r.history, r.allowed);
    } else {
      const auto [s, i] = work[static_cast<size_t>(j - n_sample)];
      const PromptScoring& p = pending_.scoring[s];
      scored_[s][i] = score_token(logits_row(first_row[p.chunk] + i), p.next[i], p.top);
    }
  }
  // A scoring step's logits are every prompt row's (up to the step's token budget times the
  // vocabulary: 512 MB for 1,024 rows of a 128K vocabulary); a sampling step needs one row a
  // sequence. Give the buffer back rather than keep it for the server's life.
  if (logits_.size() > (rows.size() + 1) * vocab * 4) std::vector<float>().swap(logits_);
}

void Backend::synchronize() {
  if (worker_ && launched_) worker_->finish(/*take_error=*/false);
}

std::vector<SampledToken> Backend::wait() {
  if (!launched_) throw Error("internal: " + name() + " backend: wait() without launch()");
  launched_ = false;
  if (worker_) worker_->finish(/*take_error=*/true);
  pending_ = {};
  return std::move(sampled_);
}

double Backend::clock_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void check_forward_batch(const ForwardBatch& batch, const ModelConfig& config, int64_t page_size,
                         int64_t num_pages, size_t logits_size, const std::string& backend,
                         int32_t num_models) {
  auto fail = [&](const std::string& what) {
    throw Error(backend + " backend: bad batch: " + what);
  };
  if (batch.positions.size() != batch.tokens.size()) fail("positions and tokens differ in length");
  const int64_t ps = page_size;
  int64_t offset = 0;
  for (size_t ci = 0; ci < batch.chunks.size(); ++ci) {
    const SeqChunk& c = batch.chunks[ci];
    const std::string which = "chunk " + std::to_string(ci);
    if (c.num_tokens < 1) fail(which + " has no tokens");
    if (c.num_cached < 0) fail(which + " has negative num_cached");
    if (c.model < 0 || c.model >= num_models)
      fail(which + " runs on model " + std::to_string(c.model) + "; this backend holds " +
           std::to_string(num_models));
    if (c.token_offset != offset) fail(which + " does not start where the previous chunk ended");
    if (offset + c.num_tokens > batch.num_tokens()) fail(which + " runs past the tokens");
    for (int32_t i = 0; i < c.num_tokens; ++i)
      if (batch.positions[offset + i] != c.num_cached + i)
        fail(which + ": token " + std::to_string(i) + " is at position " +
             std::to_string(batch.positions[offset + i]) +
             ", expected num_cached + i = " + std::to_string(c.num_cached + i));
    const int64_t pages = (int64_t{c.num_cached} + c.num_tokens + ps - 1) / ps;
    if (static_cast<int64_t>(c.block_table.size()) < pages)
      fail(which + " needs " + std::to_string(pages) + " pages, its block table has " +
           std::to_string(c.block_table.size()));
    for (int64_t p = 0; p < pages; ++p)
      if (c.block_table[p] < 0 || c.block_table[p] >= num_pages)
        fail(which + ": page id " + std::to_string(c.block_table[p]) + " outside the " +
             std::to_string(num_pages) + " KV pages");
    offset += c.num_tokens;
  }
  if (offset != batch.num_tokens()) fail("tokens not covered by any chunk");
  for (TokenId t : batch.tokens)
    if (t < 0 || t >= config.vocab_size)
      fail("token id " + std::to_string(t) + " outside the vocabulary");
  if (logits_size < static_cast<size_t>(batch.num_logit_rows()) * config.vocab_size)
    fail("logits span holds " + std::to_string(logits_size) + " floats, " +
         std::to_string(batch.num_logit_rows()) + " rows of " + std::to_string(config.vocab_size) +
         " needed");
}

}  // namespace blend
