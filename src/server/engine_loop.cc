#include "server/engine_loop.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace blend {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, StepHook after_step)
    : engine_(std::move(engine)), after_step_(std::move(after_step)) {
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
      // has_work() is only ever called on this thread, so reading it under our lock is safe.
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty() || engine_->has_work(); });
      if (stop_) return;
      tasks.swap(tasks_);
    }
    const bool ran_tasks = !tasks.empty();
    for (Task& t : tasks) t(*engine_);
    tasks.clear();
    if (!engine_->has_work()) {
      // A cancel frees pages without a step: observers should see that too.
      if (ran_tasks && after_step_) after_step_(*engine_);
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
