// Metrics — what /metrics reports, in the Prometheus text format (names follow vLLM's, with a
// `blend:` prefix, or `vllm:` or both: set_names): request counts by class and outcome, TTFT /
// TPOT / end-to-end / decode-time, queue / prefill / inference-time (the engine's clock:
// on_request_times) and prompt / generation length histograms per class, tokens per engine
// step, requests waiting (no token yet) and running per class, Batch API lines the planner
// still holds back, KV usage, prefix-cache queries and hits (prompt tokens), token throughput.
// The vllm: samples carry the `model_name` label vLLM's dashboards select on (the first served
// model: the counts are the engine's, over all its models). Every method is thread-safe.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/sequence.h"
#include "engine/engine.h"

namespace blend {

class Metrics {
 public:
  Metrics();
  // The label every sample carries and the prefixes its names are written with ("blend",
  // "vllm": each prefix writes every metric once). Before the first render.
  void set_names(std::string model_name, std::vector<std::string> prefixes);

  // A request's life: queued in the engine, its first token, its end (finished or not). The
  // token counters come from the engine (on_step, on_engine_tokens): a request counted at its
  // end left them flat while it ran and never counted a cancelled one's tokens.
  void on_queued(RequestClass c);
  void on_first_token(RequestClass c, double ttft_seconds);
  void on_finished(RequestClass c, bool had_first_token, const char* finish_reason,
                   int64_t prompt_tokens, int64_t output_tokens, double e2e_seconds,
                   double tpot_seconds);
  void on_cancelled(RequestClass c, bool had_first_token);
  // A finished request's engine timings (Engine::add_finish_observer), as vLLM times them:
  // queue = submitted to first scheduled (a Batch API line held back by its planner is
  // submitted when the planner lets it go), prefill = first scheduled to first token,
  // inference = first scheduled to finished. A moment never reached skips what needs it.
  void on_request_times(const RequestTimes& times);
  // A request rejected before it reached the engine, by a route or by the connection layer
  // itself (503 past a connection bound, 408 past a deadline).
  void on_error(int http_status);
  // Requests of class `c` queued or running in the engine now.
  int64_t in_engine(RequestClass c) const;

  // Called by the engine thread after each step: the engine's counters now.
  void on_step(const EngineStats& stats);
  // The engine's token counters alone, taken on the engine thread as a request finishes
  // (inside a step, before on_step reports it): /metrics read right after the answer already
  // counts its tokens, each once.
  void on_engine_tokens(const EngineStats& stats);
  // Batch API lines a planned job still holds back (not yet handed to the engine).
  void set_batch_lines_pending(int64_t lines);

  std::string render() const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<int64_t> counts;  // one per bound, plus +Inf
    double sum = 0;
    int64_t total = 0;
    void observe(double v);
  };
  struct PerClass {
    int64_t waiting = 0, running = 0;
    int64_t cancelled = 0;
    std::vector<std::pair<std::string, int64_t>> finished;  // by finish reason
    Histogram ttft, tpot, e2e, decode, queue, prefill, inference, prompt_tokens, generation_tokens;
  };
  PerClass& of(RequestClass c) { return classes_[c == RequestClass::kRealtime ? 0 : 1]; }

  mutable std::mutex mu_;
  std::array<PerClass, 2> classes_;
  std::vector<std::pair<int, int64_t>> errors_;  // by HTTP status
  EngineStats engine_;
  Histogram step_tokens_;  // tokens computed per engine step (vLLM's iteration_tokens_total)
  int64_t batch_lines_pending_ = 0;
  std::string model_name_;
  std::vector<std::string> prefixes_ = {"blend"};
  // (time, prompt + output tokens) samples over the last seconds, for tokens/s.
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> samples_;
};

}  // namespace blend
