#include "backend/backend.h"

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

void Backend::compute_steps_on_worker() {
  if (!worker_) worker_ = std::make_unique<StepWorker>();
}

void Backend::launch(StepInput step) {
  if (launched_) throw Error("internal: " + name() + " backend: launch() before wait()");
  if (static_cast<int32_t>(step.rows.size()) != step.batch.num_logit_rows())
    throw Error("internal: " + name() + " backend: " + std::to_string(step.rows.size()) +
                " sample rows for " + std::to_string(step.batch.num_logit_rows()) + " logit rows");
  pending_ = std::move(step);
  launched_ = true;
  if (worker_)
    worker_->post([this] { compute_step(); });
  else
    compute_step();
}

void Backend::compute_step() {
  const size_t vocab = static_cast<size_t>(config().vocab_size);
  logits_.resize(static_cast<size_t>(pending_.batch.num_logit_rows()) * vocab);
  forward(pending_.batch, logits_);
  const std::vector<SampleRow>& rows = pending_.rows;
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

}  // namespace blend
