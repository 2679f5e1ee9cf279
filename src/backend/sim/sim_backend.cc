#include "backend/sim/sim_backend.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace blend {

TokenId SimTokenSource::next(SeqId seq, int64_t step) {
  const auto it = hidden_.find(seq);
  if (it == hidden_.end() || step + 1 < it->second) return kFiller;
  hidden_.erase(it);
  return eos_;
}

namespace {

// The simulated model's EOS: its config's, or a reserved id past the vocabulary.
TokenId sim_eos(const ModelConfig& config) {
  if (config.eos_token_ids.empty())
    throw Error("sim backend: the simulated model needs an EOS token id");
  return config.eos_token_ids.front();
}

}  // namespace

SimBackend::SimBackend(const ModelConfig& config, SimBackendOptions options, SimStepCost cost)
    : config_(config),
      options_(options),
      cost_(std::move(cost)),
      noise_rng_(options.noise_seed),
      tokens_(sim_eos(config)) {
  if (options_.num_pages < 0) throw Error("sim backend: negative KV page count");
  if (!(options_.step_noise >= 0 && options_.step_noise <= 2))
    throw Error("sim backend: the step noise must lie in [0, 2]");
  if (!cost_) throw Error("sim backend: no step cost model");
}

void SimBackend::allocate_kv(int64_t num_pages) {
  if (options_.num_pages > 0) throw Error("sim backend: the KV cache is allocated already");
  options_.num_pages = num_pages;
}

void SimBackend::launch(StepInput step) {
  this->step(step.batch, all_device_draws(step.rows));
  sampled_.assign(step.rows.size(), SampledToken{});
  for (size_t r = 0; r < step.rows.size(); ++r)
    sampled_[r].token =
        tokens_.next(step.rows[r].seq, static_cast<int64_t>(step.rows[r].history.output.size()));
}

std::vector<SampledToken> SimBackend::wait() {
  return std::move(sampled_);
}

void SimBackend::forward(const ForwardBatch& batch, std::span<float>) {
  step(batch, /*device_draws=*/false);
}

void SimBackend::step(const ForwardBatch& batch, bool device_draws) {
  if (options_.num_pages <= 0) throw Error("sim backend: the KV cache must hold at least a page");
  SimStepTime t = cost_(batch, device_draws);
  if (!(t.total >= 0)) throw Error("sim backend: the cost model gave a negative step time");
  if (options_.step_noise > 0) {
    const double sigma = options_.step_noise;
    const double factor =
        std::exp(sigma * std::normal_distribution<double>()(noise_rng_) - sigma * sigma / 2);
    t.compute *= factor;
    t.memory *= factor;
    t.network *= factor;
    t.total *= factor;
  }
  t.transfer = static_cast<double>(pending_swaps_) * options_.swap_seconds_per_page +
               static_cast<double>(pending_copies_) * options_.copy_seconds_per_page;
  pending_swaps_ = pending_copies_ = 0;
  t.total = std::max(t.total, t.transfer);  // overlapped with the step (BROS §4.1)
  clock_ += t.total;
  totals_.compute += t.compute;
  totals_.memory += t.memory;
  totals_.network += t.network;
  totals_.total += t.total;
  totals_.transfer += t.transfer;
  if (options_.record_steps) steps_.push_back(t);
}

}  // namespace blend
