// The engine loop over the simulating backend: no weights, no arithmetic, a virtual clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "backend/sim/sim_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/presets.h"

namespace blend {
namespace {

// 1 ms per computed token plus 5 ms per step.
SimStepTime toy_cost(const ForwardBatch& b, bool /*device_draws*/) {
  int64_t tokens = 0;
  for (const SeqChunk& c : b.chunks) tokens += c.num_tokens;
  SimStepTime t;
  t.compute = 1e-3 * static_cast<double>(tokens);
  t.memory = 5e-3;
  t.total = t.compute + t.memory;
  return t;
}

std::unique_ptr<Engine> sim_engine(EngineOptions o, SimBackend** backend_out = nullptr) {
  const ModelConfig config = *find_model_preset("tiny");
  auto backend = std::make_unique<SimBackend>(
      config, SimBackendOptions{.num_pages = 4096, .kv_bytes_per_page = 4096, .record_steps = true},
      toy_cost);
  if (backend_out) *backend_out = backend.get();
  return std::make_unique<Engine>(std::move(backend), o);
}

// KV moved before a step (BROS checkpoints and restores over the host link, page copies) is
// charged to that step and overlaps it: the step lasts the longer of the two (BROS §4.1).
TEST(SimEngine, KvMovesOverlapTheStepTheyPrecede) {
  SimBackend sim(*find_model_preset("tiny"),
                 SimBackendOptions{.num_pages = 16,
                                   .kv_bytes_per_page = 4096,
                                   .record_steps = true,
                                   .swap_seconds_per_page = 2e-3,
                                   .copy_seconds_per_page = 1e-4},
                 toy_cost);
  ForwardBatch batch;
  batch.chunks.push_back(SeqChunk{});
  batch.chunks.back().num_tokens = 10;  // 15 ms a step
  std::vector<std::byte> image(4096);
  const PageId pages[] = {1, 2};
  sim.forward(batch, {});                                              // nothing moved
  for (int i = 0; i < 3; ++i) sim.write_slots(3, 0, 4, image.data());  // 3 pages
  sim.read_pages(pages, image.data());                                 // 2 pages
  sim.copy_page(4, 5);
  sim.forward(batch, {});  // 10.1 ms of moves: hidden behind the step
  for (int i = 0; i < 10; ++i) sim.read_slots(6, 0, 16, image.data());
  sim.forward(batch, {});  // 20 ms of moves: longer than the step
  sim.forward(batch, {});  // the moves were charged once
  ASSERT_EQ(sim.steps().size(), 4u);
  EXPECT_DOUBLE_EQ(sim.steps()[0].transfer, 0);
  EXPECT_NEAR(sim.steps()[1].transfer, 5 * 2e-3 + 1e-4, 1e-12);
  EXPECT_NEAR(sim.steps()[1].total, 15e-3, 1e-12);
  EXPECT_NEAR(sim.steps()[2].total, 20e-3, 1e-12);
  EXPECT_DOUBLE_EQ(sim.steps()[3].transfer, 0);
  EXPECT_NEAR(sim.clock_seconds(), 3 * 15e-3 + 20e-3, 1e-12);
  EXPECT_NEAR(sim.totals().transfer, 5 * 2e-3 + 1e-4 + 20e-3, 1e-12);
}

// The step cost learns whether every row the step samples is a device draw, greedy or at a
// temperature, with or without cuts, but without penalties (what a device-sampling backend
// draws without the host); forward(), which hands logits out, never is.
TEST(SimEngine, TheStepCostSeesWhetherTheRowsAreDeviceDraws) {
  std::vector<bool> seen;
  auto backend = std::make_unique<SimBackend>(
      *find_model_preset("tiny"), SimBackendOptions{.num_pages = 256, .kv_bytes_per_page = 4096},
      [&seen](const ForwardBatch& b, bool device_draws) {
        seen.push_back(device_draws);
        return toy_cost(b, device_draws);
      });
  SimBackend* sim = backend.get();
  Engine engine(std::move(backend), EngineOptions{});
  auto run = [&](float temperature, float top_p = 1.0f, float frequency_penalty = 0.0f) {
    seen.clear();
    GenerationRequest r;
    r.id = "t" + std::to_string(temperature);
    r.prompt.assign(12, 100);
    r.params.max_tokens = 3;
    r.params.temperature = temperature;
    r.params.top_p = top_p;
    r.params.frequency_penalty = frequency_penalty;
    r.params.ignore_eos = true;
    engine.submit(std::move(r), [](GenerationResult&&) {});
    engine.run_until_done();
    return seen;
  };
  EXPECT_EQ(run(0.0f), std::vector<bool>(3, true));
  EXPECT_EQ(run(0.8f), std::vector<bool>(3, true));
  EXPECT_EQ(run(0.8f, 0.9f), std::vector<bool>(3, true));         // a top-p cut too
  EXPECT_EQ(run(0.8f, 1.0f, 0.5f), std::vector<bool>(3, false));  // a penalty is the host's
  seen.clear();
  ForwardBatch batch;
  batch.chunks.push_back(SeqChunk{});
  batch.chunks.back().num_tokens = 4;
  sim->forward(batch, {});
  EXPECT_EQ(seen, std::vector<bool>{false});
}

// No oracle (issue 27): a simulated engine fits the hybrid policy's iteration model from the
// steps it simulates, on its virtual clock, as `blend serve` fits it from real ones.
TEST(SimEngine, TheHybridPolicyFitsItsModelFromTheSimulatedSteps) {
  EngineOptions o;
  o.scheduler.policy = SchedulerPolicy::kHybrid;
  o.scheduler.fit_iteration_cost = true;
  o.scheduler.max_batch_tokens = 64;
  auto engine = sim_engine(o);
  for (int i = 0; i < 48; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt.assign(static_cast<size_t>(20 + 7 * i), static_cast<TokenId>(100 + i));
    r.params.max_tokens = 40;
    r.request_class = i % 2 ? RequestClass::kBestEffort : RequestClass::kRealtime;
    engine->submit(std::move(r), [](GenerationResult&&) {});
  }
  engine->run_until_done();
  ASSERT_GT(engine->stats().steps, 100);
  // toy_cost: 1 ms a token and 5 ms a step. Decode-only and prefill-only steps are priced as
  // the steps that timed them were (mixed steps pay one base where the model has two, so the
  // fit is close, not exact).
  const IterationCostModel& m = engine->iteration_cost();
  EXPECT_NEAR(m.forward_seconds(0, 8, 800), 8e-3 + 5e-3, 0.25 * 13e-3);
  EXPECT_NEAR(m.forward_seconds(64, 0, 0), 64e-3 + 5e-3, 0.25 * 69e-3);
}

// Step-time noise: equal steps take different times, the same on every run with one seed,
// around the cost model's time.
TEST(SimEngine, StepNoiseIsSeededAndMeanPreserving) {
  auto run = [](uint64_t seed) {
    SimBackend sim(*find_model_preset("tiny"),
                   SimBackendOptions{.num_pages = 16,
                                     .kv_bytes_per_page = 4096,
                                     .record_steps = true,
                                     .step_noise = 0.1,
                                     .noise_seed = seed},
                   toy_cost);
    ForwardBatch batch;
    batch.chunks.push_back(SeqChunk{});
    batch.chunks.back().num_tokens = 10;  // 15 ms a step without noise
    for (int i = 0; i < 2000; ++i) sim.forward(batch, {});
    return sim.steps();
  };
  const auto a = run(1), b = run(1), c = run(2);
  double sum = 0, low = 1, high = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].total, b[i].total);
    sum += a[i].total;
    low = std::min(low, a[i].total);
    high = std::max(high, a[i].total);
  }
  EXPECT_NE(a[0].total, c[0].total);
  EXPECT_NEAR(sum / static_cast<double>(a.size()), 15e-3, 0.01 * 15e-3);
  EXPECT_LT(low, 0.9 * 15e-3);
  EXPECT_GT(high, 1.1 * 15e-3);
  EXPECT_THROW(SimBackend(*find_model_preset("tiny"),
                          SimBackendOptions{.num_pages = 16, .step_noise = -1}, toy_cost),
               Error);
}

TEST(SimEngine, RunsRequestsToTheirLengthOnAVirtualClock) {
  EngineOptions o;
  o.scheduler.max_batch_tokens = 64;
  SimBackend* sim = nullptr;
  auto engine = sim_engine(o, &sim);
  std::map<std::string, GenerationResult> results;
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (int i = 0; i < 40; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt.assign(static_cast<size_t>(10 + i), static_cast<TokenId>(100 + i));
    r.params.max_tokens = 1 + i % 7;
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
    output_tokens += r.params.max_tokens;
    engine->submit(std::move(r), [&](GenerationResult&& g) { results[g.id] = std::move(g); });
  }
  engine->run_until_done();
  ASSERT_EQ(results.size(), 40u);
  for (int i = 0; i < 40; ++i) {
    const GenerationResult& g = results["r" + std::to_string(i)];
    EXPECT_EQ(g.tokens.size(), static_cast<size_t>(1 + i % 7));
    for (TokenId t : g.tokens) EXPECT_EQ(t, SimTokenSource::kFiller);
    EXPECT_TRUE(g.text.empty());
  }
  const EngineStats st = engine->stats();
  // Every prompt token once (distinct prompts: no sharing) and every output token but the
  // last of each request went through the model; the clock is the sum of the step costs.
  EXPECT_EQ(st.batch_tokens, prompt_tokens + output_tokens - 40);
  EXPECT_EQ(static_cast<int64_t>(sim->steps().size()), st.steps);
  EXPECT_NEAR(sim->clock_seconds(), 1e-3 * st.batch_tokens + 5e-3 * st.steps, 1e-9);
  EXPECT_NEAR(sim->totals().total, sim->clock_seconds(), 1e-9);
  engine->check_invariants();
}

// A hidden output length (`blend simulate` without ignore_eos): the request ends at its true
// length as if the model sampled EOS there, although max_tokens (all the scheduler and planner
// see) allows far more.
TEST(SimEngine, AHiddenOutputLengthEndsTheRequestAsEosWould) {
  SimBackend* sim = nullptr;
  auto engine = sim_engine(EngineOptions{}, &sim);
  std::map<std::string, GenerationResult> results;
  for (int length : {3, 9}) {
    GenerationRequest r;
    r.id = "len" + std::to_string(length);
    r.prompt.assign(12, static_cast<TokenId>(100 + length));
    r.params.max_tokens = 1000;
    const SeqId id =
        engine->submit(std::move(r), [&](GenerationResult&& g) { results[g.id] = std::move(g); });
    sim->tokens().set_output_length(id, length);
  }
  engine->run_until_done();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results["len3"].tokens.size(), 3u);
  EXPECT_EQ(results["len9"].tokens.size(), 9u);
  EXPECT_EQ(results["len3"].finish, FinishReason::kStop);
  EXPECT_EQ(results["len9"].finish, FinishReason::kStop);
}

TEST(SimEngine, SharedPrefixesAreComputedOnceInSimulationToo) {
  EngineOptions o;
  auto engine = sim_engine(o);
  for (int i = 0; i < 10; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    r.prompt.assign(100, 7);
    r.prompt.push_back(200 + i);
    r.params.max_tokens = 2;
    engine->submit(std::move(r), nullptr);
  }
  engine->run_until_done();
  EXPECT_EQ(engine->stats().cached_prompt_tokens, 9 * 100);
}

// A preempted sequence's KV stays in the prefix cache; when the device cache evicts it, a host
// tier keeps it (the swap-out of a dropped request, vLLM's swap preemption), and on resuming it
// comes back over the host link instead of being recomputed, where the link is the cheaper of
// the two (BROS §4.1's swap line against a prompt token's time). The simulated tier holds no
// bytes; every page moved is charged to the step it precedes.
TEST(SimEngine, APreemptedSequenceComesBackFromTheHostWhereThatIsCheaperThanRecomputing) {
  constexpr int64_t kPageBytes = 1 << 20;
  struct Outcome {
    EngineStats stats;
    double transfer = 0;
    size_t finished = 0;
  };
  auto run = [&](double host_gb, double link_bytes_per_s) {
    EngineOptions o;
    o.scheduler.initial_output_estimate = 1;  // optimistic admission: forces preemption
    o.scheduler.exact_known_lengths = false;
    o.kv_host_memory_gb = host_gb;
    o.kv_host_link_bytes_per_s = link_bytes_per_s;
    o.kv_recompute_seconds_per_token = 1e-3;  // toy_cost's
    auto backend = std::make_unique<SimBackend>(
        *find_model_preset("tiny"),
        SimBackendOptions{
            .num_pages = 24,
            .kv_bytes_per_page = kPageBytes,
            .swap_seconds_per_page = static_cast<double>(kPageBytes) / link_bytes_per_s},
        toy_cost);
    SimBackend* sim = backend.get();
    Engine engine(std::move(backend), o);
    Outcome out;
    for (int i = 0; i < 8; ++i) {
      GenerationRequest r;
      r.id = "r" + std::to_string(i);
      r.prompt.assign(40, static_cast<TokenId>(100 + i));
      r.params.max_tokens = 30;
      r.params.ignore_eos = true;
      engine.submit(std::move(r),
                    [&](GenerationResult&& g) { out.finished += g.tokens.size() == 30 ? 1 : 0; });
    }
    engine.run_until_done();
    engine.check_invariants();
    out.stats = engine.stats();
    out.transfer = sim->totals().transfer;
    return out;
  };
  const Outcome recompute = run(0, 1e10);
  const Outcome swap = run(1, 1e10);      // 0.1 ms a page back against 16 ms to recompute it
  const Outcome slow_link = run(1, 1e7);  // 105 ms a page: recomputing is cheaper
  for (const Outcome* o : {&recompute, &swap, &slow_link}) {
    EXPECT_EQ(o->finished, 8u);
    EXPECT_GT(o->stats.preemptions, 0);
  }
  EXPECT_EQ(recompute.stats.kv_loaded_pages, 0);
  EXPECT_EQ(recompute.transfer, 0);
  // Swapped out and back: fewer tokens through the model, the moves charged.
  EXPECT_GT(swap.stats.kv_offloaded_pages, 0);
  EXPECT_GT(swap.stats.kv_loaded_pages, 0);
  EXPECT_LT(swap.stats.batch_tokens, recompute.stats.batch_tokens);
  EXPECT_GE(swap.transfer,
            1e-4 * static_cast<double>(swap.stats.kv_offloaded_pages + swap.stats.kv_loaded_pages) -
                1e-9);
  // Over a slow link the pages still leave (eviction cannot know) but are recomputed.
  EXPECT_GT(slow_link.stats.kv_offloaded_pages, 0);
  EXPECT_EQ(slow_link.stats.kv_loaded_pages, 0);
  EXPECT_EQ(slow_link.stats.batch_tokens, recompute.stats.batch_tokens);
}

}  // namespace
}  // namespace blend
