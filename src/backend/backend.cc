#include "backend/backend.h"

#include <utility>

#include "core/error.h"

namespace blend {

void Backend::launch(StepInput step) {
  if (launched_) throw Error("internal: " + name() + " backend: launch() before wait()");
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  logits_.resize(static_cast<size_t>(step.batch.num_logit_rows()) * vocab);
  if (static_cast<int32_t>(step.rows.size()) != step.batch.num_logit_rows())
    throw Error("internal: " + name() + " backend: " + std::to_string(step.rows.size()) +
                " sample rows for " + std::to_string(step.batch.num_logit_rows()) + " logit rows");
  forward(step.batch, logits_);
  pending_ = std::move(step);
  launched_ = true;
}

std::vector<SampledToken> Backend::wait() {
  if (!launched_) throw Error("internal: " + name() + " backend: wait() without launch()");
  launched_ = false;
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  const std::vector<SampleRow>& rows = pending_.rows;
  std::vector<SampledToken> sampled(rows.size());
  // Each draw depends only on its own row, seed, output index and history, so the rows can be
  // sampled in any order, in parallel.
#pragma omp parallel for schedule(dynamic, 1) if (rows.size() > 1)
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRow& row = rows[r];
    const std::span<const float> logits(logits_.data() + r * vocab, vocab);
    sampled[r] = sample_token(logits, *row.params, row.rng_seed,
                              static_cast<int64_t>(row.history.output.size()), row.history);
  }
  return sampled;
}

double Backend::clock_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace blend
