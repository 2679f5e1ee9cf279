// Online serving on the simulator (BROS §7 at the paper's scale): real-time (RT) requests
// arrive as a Poisson process with lengths drawn from a trace, best-effort (BE) work comes as
// batch jobs resubmitted whenever the previous job is done (BROS §7.1, after the Batch API),
// and an Engine over the sim backend (backend/sim, virtual clock) serves both with the
// scheduler policy it was built with. Arrivals are replayed on the engine's clock, so a
// 10-minute trace of a 70B model on 8 GPUs takes seconds here, and the same scheduler, KV and
// prefix-cache code runs as in `blend serve`.
//
// It reports what BROS Fig. 10-13 plot: RT normalized latency (mean over requests of e2e
// latency / output tokens), TTFT and TPOT SLO attainment (the share of RT requests whose TTFT,
// and whose mean time per output token after the first, meet their targets), their p50/p99,
// and BE throughput.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/sim/sim_backend.h"
#include "engine/engine.h"

namespace blend::online {

struct ServingWorkload {
  double duration_seconds = 600;  // RT arrivals over [0, duration); BE counted until then
  double rt_rate = 1;             // RT requests per second (Poisson)
  std::vector<std::pair<int32_t, int32_t>> rt_lengths;  // RT (prompt, output) pairs to draw
  // Requests per BE batch job. BROS §7.1 does not give the size; 1,024 reproduces its vLLM's
  // TTFT attainment (1.28% on average) with our vLLM-like baselines (0-2%), where 64 gave
  // 16-43% at 1-4 RT/s (docs/BENCHMARKS.md, "How large is a BE job").
  int32_t be_batch_requests = 1024;
  int32_t be_prompt_min = 512, be_prompt_max = 1024;  // uniform (BROS §7.1)
  int32_t be_output_min = 32, be_output_max = 128;
  double ttft_slo = 0.4, tpot_slo = 0.2;  // seconds (BROS §7.1)
  uint64_t seed = 1;
};

struct ServingReport {
  int64_t rt_requests = 0;             // arrived in the window (all are served to the end)
  double rt_normalized_latency_s = 0;  // mean of e2e / output tokens
  double ttft_attainment = 0, tpot_attainment = 0;
  double ttft_p50 = 0, ttft_p99 = 0, tpot_p50 = 0, tpot_p99 = 0;
  int64_t be_requests = 0;                // finished within the window
  int64_t be_tokens = 0;                  // their prompt + output tokens
  double be_throughput_tokens_per_s = 0;  // be_tokens / duration
  double be_requests_per_s = 0;
  double seconds = 0;  // engine-clock time until the last RT request finished
  // BE work at equal RT work: the BE tokens finished before the last RT request was (no BE job
  // starts after the window), over `seconds`. A policy that leaves RT requests queued past the
  // window does the RT work later, where the in-window figure does not charge it.
  int64_t be_tokens_until_drained = 0;
  double be_throughput_until_drained_tokens_per_s = 0;
  int64_t steps = 0;
};

// Drives `engine` (built over a SimBackend, whose clock this advances while the engine is
// idle) through the workload and measures it. Throws blend::Error on an empty length list.
ServingReport simulate_serving(Engine& engine, SimBackend& backend,
                               const ServingWorkload& workload);

// The (prompt, output) pairs of the ShareGPT trace in `traces_dir`, filtered as vLLM's
// benchmark does (prompt <= 1024 tokens, prompt + output <= `max_context`).
std::vector<std::pair<int32_t, int32_t>> sharegpt_lengths(const std::string& traces_dir,
                                                          int32_t max_context);

}  // namespace blend::online
