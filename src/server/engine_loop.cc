#include "server/engine_loop.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace blend {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, StepHook after_step, Feed feed)
    : engine_(std::move(engine)), after_step_(std::move(after_step)), feed_(std::move(feed)) {
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  stop();
}

void EngineLoop::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::post(Task task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void EngineLoop::run() {
  std::deque<Task> tasks;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      // has_work() and feeding_ are only ever used on this thread, so reading them under our
      // lock is safe.
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty() || engine_->has_work() || feeding_; });
      if (stop_) return;
      tasks.swap(tasks_);
    }
    const bool ran_tasks = !tasks.empty();
    for (Task& t : tasks) t(*engine_);
    tasks.clear();
    const bool fed = feeding_;
    if (feed_) feeding_ = feed_(*engine_);
    if (!engine_->has_work()) {
      // A cancel frees pages without a step: observers should see that too.
      if ((ran_tasks || fed) && after_step_) after_step_(*engine_);
      continue;
    }
    try {
      engine_->step();
    } catch (const std::exception& e) {
      // A failed step leaves the engine's state unknown; serving wrong tokens is worse than
      // stopping.
      std::fprintf(stderr, "blend serve: engine step failed: %s\n", e.what());
      std::abort();
    }
    if (after_step_) after_step_(*engine_);
  }
}

}  // namespace blend
