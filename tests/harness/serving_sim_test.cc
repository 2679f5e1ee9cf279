// The online serving experiment on the simulator (BROS §7): every RT arrival is served to the
// end, BE jobs keep the engine busy, metrics are consistent, and on a loaded engine the hybrid
// policy meets more TTFT targets than FCFS at a small cost in BE throughput.
#include "harness/serving_sim.h"

#include <gtest/gtest.h>

#include "cost/cost_model.h"
#include "cost/hardware.h"
#include "offline/planned_run.h"
#include "sched/hybrid_policy.h"

namespace blend {
namespace {

online::ServingReport serve(SchedulerPolicy policy, double rate) {
  const CostModel cost(*find_model_shape_preset("opt-13b", 2), *find_hardware_preset("a100-40g"));
  const ModelConfig config = sim_model_config(cost.shape());
  const auto page_bytes = static_cast<int64_t>(cost.kv_bytes_per_token_per_device()) * 16;
  SimBackendOptions so;
  so.num_pages = static_cast<int64_t>(8e9) / page_bytes;
  so.kv_bytes_per_page = page_bytes;
  auto backend = make_sim_backend(config, so, cost, Overlap::kSequential);
  SimBackend& sim = *backend;
  EngineOptions eo;
  eo.scheduler.policy = policy;
  eo.scheduler.max_batch_tokens = 2048;
  eo.scheduler.iteration_cost = iteration_model_of(cost);
  eo.scheduler.bidirectional_kv = policy == SchedulerPolicy::kHybrid;
  Engine engine(std::move(backend), eo);
  online::ServingWorkload w;
  w.duration_seconds = 60;
  w.rt_rate = rate;
  w.be_batch_requests = 32;
  // ShareGPT-like lengths without reading the trace: short and long conversations.
  w.rt_lengths = {{40, 120}, {300, 250}, {900, 60}, {150, 400}, {600, 300}};
  const online::ServingReport r = online::simulate_serving(engine, sim, w);
  EXPECT_FALSE(engine.has_work());  // the leftover BE work was cancelled
  engine.check_invariants();
  return r;
}

TEST(ServingSim, ServesEveryArrivalAndMeasuresConsistently) {
  const online::ServingReport r = serve(SchedulerPolicy::kFcfs, 2);
  EXPECT_GT(r.rt_requests, 80);  // Poisson, 2/s over 60 s
  EXPECT_LT(r.rt_requests, 160);
  for (double a : {r.ttft_attainment, r.tpot_attainment}) {
    EXPECT_GE(a, 0);
    EXPECT_LE(a, 1);
  }
  EXPECT_LE(r.ttft_p50, r.ttft_p99);
  EXPECT_LE(r.tpot_p50, r.tpot_p99);
  EXPECT_GT(r.rt_normalized_latency_s, 0);
  EXPECT_GT(r.be_requests, 32);  // more than one BE job finished
  EXPECT_NEAR(r.be_requests_per_s * 60, static_cast<double>(r.be_requests), 1e-9);
  EXPECT_GE(r.seconds, 60 * 0.9);
  // Until drained counts every BE request the window counts, and those finished after it.
  if (r.seconds >= 60) {
    EXPECT_GE(r.be_tokens_until_drained, r.be_tokens);
  }
  EXPECT_NEAR(r.be_throughput_until_drained_tokens_per_s * r.seconds,
              static_cast<double>(r.be_tokens_until_drained), 1e-6);
}

TEST(ServingSim, HybridMeetsMoreTtftTargetsThanFcfsUnderLoad) {
  const online::ServingReport fcfs = serve(SchedulerPolicy::kFcfs, 4);
  const online::ServingReport hybrid = serve(SchedulerPolicy::kHybrid, 4);
  EXPECT_EQ(fcfs.rt_requests, hybrid.rt_requests);  // the same arrivals
  EXPECT_GT(hybrid.ttft_attainment, 1.5 * fcfs.ttft_attainment);
  EXPECT_LT(hybrid.rt_normalized_latency_s, fcfs.rt_normalized_latency_s);
  EXPECT_GT(hybrid.be_throughput_tokens_per_s, 0.7 * fcfs.be_throughput_tokens_per_s);
  std::printf(
      "fcfs: ttft %.3f norm %.4f be %.0f (drained %.0f in %.1f s) | hybrid: ttft %.3f norm %.4f "
      "be %.0f (drained %.0f in %.1f s)\n",
      fcfs.ttft_attainment, fcfs.rt_normalized_latency_s, fcfs.be_throughput_tokens_per_s,
      fcfs.be_throughput_until_drained_tokens_per_s, fcfs.seconds, hybrid.ttft_attainment,
      hybrid.rt_normalized_latency_s, hybrid.be_throughput_tokens_per_s,
      hybrid.be_throughput_until_drained_tokens_per_s, hybrid.seconds);
}

}  // namespace
}  // namespace blend
