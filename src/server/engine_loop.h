// EngineLoop — the one thread that owns the Engine. The engine is single-threaded by design
// (DESIGN.md §2); HTTP handler threads never touch it but post closures that the loop runs
// between steps, in order. Engine callbacks therefore run on the loop thread too.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/engine.h"

namespace blend {

class EngineLoop {
 public:
  using Task = std::function<void(Engine&)>;
  using StepHook = std::function<void(const Engine&)>;
  // Work that enters the engine at its own pace (the Batch API's planned admission): called
  // before every step, after the posted closures, it submits what should run now and returns
  // whether it holds more. While it does the loop keeps going; it must then submit something
  // whenever the engine is idle, or the loop spins.
  using Feed = std::function<bool(Engine&)>;

  // Starts the thread. `after_step` (optional) runs on it after every step, and after posted
  // closures or a feed when no step follows them.
  EngineLoop(std::unique_ptr<Engine> engine, StepHook after_step = {}, Feed feed = {});
  ~EngineLoop();  // stop()s; requests still in the engine are dropped without callbacks
  // Ends the thread after the step or closure it is running (whose callbacks still run, so
  // what they use must outlive this call). Idempotent.
  void stop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // The immutable parts (config, tokenizer, limits) may be read from any thread.
  const Engine& engine() const { return *engine_; }

  void post(Task task);

 private:
  void run();

  std::unique_ptr<Engine> engine_;
  StepHook after_step_;
  Feed feed_;
  bool feeding_ = false;  // the feed holds more (loop thread only)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace blend
