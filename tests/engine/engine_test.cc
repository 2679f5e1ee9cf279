// The engine end to end on the cpu backend with the tiny preset: determinism across batch
// composition and order, chunking, KV exhaustion, stop handling, bad requests.
#include "engine/engine.h"

#include <algorithm>
#include <map>
#include <random>
#include <span>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "run_requests.h"
#include "test_util.h"

namespace blend {
namespace {

// Every test runs twice: plain steps, and overlapped ones (the next step planned while this
// one computes, EOS seen a step late): the tokens must be the same.
class EngineTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    RandomInitOptions o;
    o.seed = 11;
    o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
    write_random_model(*find_model_preset("tiny"), dir_->path(), o);
  }
  static void TearDownTestSuite() { delete dir_; }

  // Bytes of one KV page of 16 tokens of the tiny model on this CPU: 2 layers x 32 KV dims x
  // 2 (K, V) per token, in the backend's compute dtype (bf16; f32 where oneDNN has no bf16).
  static int64_t page_bytes() {
    const ModelConfig c = ModelConfig::from_dir(dir_->path());
    return 16 *
           kv_bytes_per_token(
               c, static_cast<int64_t>(dtype_size(cpu_compute_dtype(RandomInitOptions{}.dtype))));
  }
  // --kv-memory for `pages` such pages.
  static double kv_gb(int pages) { return static_cast<double>(page_bytes() * pages) / 1e9; }

  static EngineOptions options() {
    EngineOptions o;
    o.threads = 2;
    o.deterministic = true;
    o.kv_memory_gb = 0.05;
    o.overlap = GetParam();
    return o;
  }

  static std::vector<TokenId> prompt(uint32_t seed, int len) {
    std::mt19937 rng(seed);
    std::vector<TokenId> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<TokenId>(rng() % 120000));
    return p;
  }

  // Runs the requests and returns each one's result by id.
  static std::map<std::string, GenerationResult> run(Engine& engine,
                                                     std::vector<GenerationRequest> requests) {
    return testing::run_requests(engine, std::move(requests));
  }

  static GenerationRequest request(const std::string& id, uint32_t seed, int len, int max_tokens,
                                   float temperature = 0.0f) {
    GenerationRequest r;
    r.id = id;
    r.prompt = prompt(seed, len);
    r.params.max_tokens = max_tokens;
    r.params.temperature = temperature;
    r.params.top_p = 0.9f;
    r.params.seed = seed;
    r.params.ignore_eos = true;
    return r;
  }

  static testing::TempDir* dir_;
};

testing::TempDir* EngineTest::dir_ = nullptr;

TEST_P(EngineTest, TokensDoNotDependOnTheBatchOrItsOrder) {
  std::vector<GenerationRequest> probes = {request("greedy", 1, 37, 12),
                                           request("sampled", 2, 21, 12, 0.8f)};
  std::map<std::string, GenerationResult> alone;
  for (const auto& p : probes) {
    EngineOptions plain = options();
    plain.overlap = false;  // the overlapped runs below must match plain steps too
    Engine engine(dir_->path(), plain);
    auto r = run(engine, {p});
    alone[p.id] = r[p.id];
    EXPECT_EQ(alone[p.id].tokens.size(), 12u);
  }
  // The same probes among 64 others of varied lengths, then in reverse order with a small
  // token budget (so prefills are chunked differently).
  std::vector<GenerationRequest> crowd = probes;
  for (int i = 0; i < 64; ++i)
    crowd.push_back(request("other" + std::to_string(i), 100 + i, 5 + (i * 7) % 60, 3 + i % 9,
                            i % 4 ? 0.0f : 0.7f));
  {
    Engine engine(dir_->path(), options());
    auto r = run(engine, crowd);
    for (const auto& p : probes) EXPECT_EQ(r[p.id].tokens, alone[p.id].tokens) << p.id;
  }
  {
    std::reverse(crowd.begin(), crowd.end());
    EngineOptions o = options();
    o.scheduler.max_batch_tokens = 29;
    Engine engine(dir_->path(), o);
    auto r = run(engine, crowd);
    for (const auto& p : probes) EXPECT_EQ(r[p.id].tokens, alone[p.id].tokens) << p.id;
  }
}

TEST_P(EngineTest, KvExhaustionPreemptsAndStillGivesTheSameTokens) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back(request("r" + std::to_string(i), 300 + i, 40, 30));
  Engine roomy(dir_->path(), options());
  auto expected = run(roomy, reqs);
  EXPECT_EQ(roomy.stats().preemptions, 0);

  EngineOptions o = options();
  o.kv_memory_gb = kv_gb(16);
  o.scheduler.initial_output_estimate = 1;  // optimistic admission: forces preemption
  o.scheduler.exact_known_lengths = false;
  Engine tight(dir_->path(), o);
  auto got = run(tight, reqs);
  EXPECT_GT(tight.stats().preemptions, 0);
  ASSERT_EQ(got.size(), reqs.size());
  for (const auto& [id, r] : expected) EXPECT_EQ(got[id].tokens, r.tokens) << id;
}

// Every scheduling policy, not only the default, meets a KV cache too small for its batch
// (optimistic admission over 16 pages, real-time and best-effort requests mixed): it must
// preempt or wait, never abort or drop a request, and give every request the tokens it gets
// with room to spare (issue 26).
TEST_P(EngineTest, KvExhaustionUnderEveryPolicyNeverAbortsAndKeepsTheTokens) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    reqs.push_back(request("p" + std::to_string(i), 500 + i, 40 + 7 * i, 24, i % 3 ? 0.0f : 0.8f));
    reqs.back().request_class = i % 2 ? RequestClass::kBestEffort : RequestClass::kRealtime;
  }
  Engine roomy(dir_->path(), options());
  const auto expected = run(roomy, reqs);
  ASSERT_EQ(expected.size(), reqs.size());
  for (const auto& [name, policy] : std::vector<std::pair<std::string, SchedulerPolicy>>{
           {"fcfs", SchedulerPolicy::kFcfs},
           {"prefill-first", SchedulerPolicy::kPrefillFirst},
           {"round-robin", SchedulerPolicy::kRoundRobin},
           {"hybrid", SchedulerPolicy::kHybrid}}) {
    EngineOptions o = options();
    o.kv_memory_gb = kv_gb(16);
    o.scheduler.policy = policy;
    o.scheduler.fit_iteration_cost = policy == SchedulerPolicy::kHybrid;
    o.scheduler.initial_output_estimate = 1;
    o.scheduler.exact_known_lengths = false;
    Engine tight(dir_->path(), o);
    std::map<std::string, GenerationResult> got;
    ASSERT_NO_THROW(got = run(tight, reqs)) << name;
    ASSERT_EQ(got.size(), reqs.size()) << name;
    for (const auto& [id, r] : expected) {
      EXPECT_EQ(got[id].finish, FinishReason::kLength) << name << " " << id;
      EXPECT_EQ(got[id].tokens, r.tokens) << name << " " << id;
    }
    EXPECT_EQ(tight.stats().kv_used_bytes, 0) << name << ": pages left behind";
    // The cache was the constraint: it filled (fcfs and prefill-first preempt here; the
    // others wait for pages instead).
    EXPECT_GE(tight.stats().kv_peak_bytes * 4, tight.stats().kv_capacity_bytes * 3) << name;
    RecordProperty(name + "_preemptions", std::to_string(tight.stats().preemptions));
  }
}

// Few-shot style prompts: groups of requests sharing a long "system prompt + examples" prefix
// (not a multiple of the page size) followed by a short question; some questions repeat.
std::vector<GenerationRequest> few_shot_requests(int groups, int per_group, int max_tokens) {
  std::vector<GenerationRequest> reqs;
  for (int g = 0; g < groups; ++g) {
    std::mt19937 rng(900 + g);
    std::vector<TokenId> shared;
    for (int i = 0; i < 150 + 13 * g; ++i) shared.push_back(static_cast<TokenId>(rng() % 120000));
    for (int q = 0; q < per_group; ++q) {
      GenerationRequest r;
      r.id = "g" + std::to_string(g) + "q" + std::to_string(q);
      r.prompt = shared;
      for (int i = 0; i < 5 + q % 7; ++i)
        r.prompt.push_back(static_cast<TokenId>((q % 5) * 1000 + i * 17 + 3));
      r.params.max_tokens = max_tokens;
      r.params.temperature = q % 3 ? 0.0f : 0.9f;
      r.params.seed = static_cast<uint64_t>(q);
      r.params.ignore_eos = true;
      reqs.push_back(std::move(r));
    }
  }
  return reqs;
}

TEST_P(EngineTest, PrefixCacheGivesTheSameTokensAndTheOptimalSharing) {
  const auto reqs = few_shot_requests(4, 12, 6);  // in DFS order: group by group
  EngineOptions off = options();
  off.prefix_cache = false;
  Engine plain(dir_->path(), off);
  auto expected = run(plain, reqs);
  EXPECT_EQ(plain.stats().cached_prompt_tokens, 0);

  Engine cached(dir_->path(), options());
  auto got = run(cached, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (const auto& [id, r] : expected) EXPECT_EQ(got[id].tokens, r.tokens) << id;
  cached.check_invariants();

  std::vector<std::span<const TokenId>> prompts;
  int64_t prompt_tokens = 0;
  for (const auto& r : reqs) {
    prompts.emplace_back(r.prompt);
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
  }
  const double optimal = static_cast<double>(optimal_shared_tokens(prompts)) / prompt_tokens;
  const double achieved = static_cast<double>(cached.stats().cached_prompt_tokens) / prompt_tokens;
  EXPECT_GT(optimal, 0.8);
  EXPECT_GE(achieved, optimal - 0.01) << "achieved " << achieved << " optimal " << optimal;
  int64_t per_request = 0;
  for (const auto& [id, r] : got) per_request += r.cached_tokens;
  EXPECT_EQ(per_request, cached.stats().cached_prompt_tokens);
}

TEST_P(EngineTest, PrefixCacheUnderHeavyEvictionAndPreemption) {
  auto reqs = few_shot_requests(5, 6, 20);
  std::mt19937 rng(5);
  std::shuffle(reqs.begin(), reqs.end(), rng);  // not DFS: the cache must evict and refill
  EngineOptions off = options();
  off.prefix_cache = false;
  Engine plain(dir_->path(), off);
  auto expected = run(plain, reqs);

  EngineOptions o = options();
  o.kv_memory_gb = kv_gb(40);  // about 3 prompts at once
  o.scheduler.initial_output_estimate = 1;
  Engine tight(dir_->path(), o);
  auto got = run(tight, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (const auto& [id, r] : expected) EXPECT_EQ(got[id].tokens, r.tokens) << id;
  const EngineStats st = tight.stats();
  EXPECT_GT(st.cache_evicted_pages, 0);
  EXPECT_GT(st.cached_prompt_tokens, 0);
  tight.check_invariants();
}

TEST_P(EngineTest, KvTiersBringBackEvictedPrefixesWithTheSameTokens) {
  auto reqs = few_shot_requests(5, 6, 20);
  std::mt19937 rng(5);
  std::shuffle(reqs.begin(), reqs.end(), rng);
  EngineOptions off = options();
  off.prefix_cache = false;
  Engine plain(dir_->path(), off);
  auto expected = run(plain, reqs);

  testing::TempDir disk;
  EngineOptions o = options();
  o.kv_memory_gb = kv_gb(40);       // 40 device pages
  o.kv_host_memory_gb = kv_gb(12);  // 12 pages on the host
  o.kv_disk_dir = disk.path().string();
  o.kv_disk_gb = kv_gb(30);  // 30 on disk
  o.scheduler.initial_output_estimate = 1;
  Engine tiered(dir_->path(), o);
  auto got = run(tiered, reqs);
  ASSERT_EQ(got.size(), reqs.size());
  for (const auto& [id, r] : expected) EXPECT_EQ(got[id].tokens, r.tokens) << id;
  const EngineStats st = tiered.stats();
  EXPECT_GT(st.kv_offloaded_pages, 0);
  EXPECT_GT(st.kv_loaded_pages, 0);
  EXPECT_LE(st.kv_host_bytes, page_bytes() * 12);
  EXPECT_LE(st.kv_disk_bytes, page_bytes() * 30);
  tiered.check_invariants();
}

TEST_P(EngineTest, SchedulingPoliciesDoNotChangeTokens) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 16; ++i) {
    GenerationRequest r =
        request("r" + std::to_string(i), 500 + i, 10 + i * 3, 8, i % 3 ? 0.0f : 0.8f);
    r.request_class = i % 2 ? RequestClass::kBestEffort : RequestClass::kRealtime;
    reqs.push_back(std::move(r));
  }
  Engine fcfs(dir_->path(), options());
  const auto expected = run(fcfs, reqs);
  for (SchedulerPolicy policy : {SchedulerPolicy::kHybrid, SchedulerPolicy::kRoundRobin}) {
    EngineOptions o = options();
    o.scheduler.policy = policy;
    o.scheduler.hybrid = {.initial_batch = 3, .batch_step = 1, .max_batch = 8};
    o.scheduler.iteration_cost.decode_per_token = 1e-3;
    o.scheduler.iteration_cost.prefill_per_token = 1e-4;
    Engine engine(dir_->path(), o);
    auto got = run(engine, reqs);
    ASSERT_EQ(got.size(), reqs.size());
    for (const auto& [id, r] : expected) EXPECT_EQ(got[id].tokens, r.tokens) << id;
    engine.check_invariants();
  }
}

// A server started without a `blend profile` file fits the hybrid policy's iteration model
// from its own steps (sched/iteration_fit); without the fit every step is estimated at 0 s.
TEST_P(EngineTest, HybridFitsItsIterationModelFromTheStepsItRuns) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    // 64 tokens out: most steps after the prompts are decode-only, and the refits at steps 64
    // (and later) see them; with few decode-only steps the decode terms are noise and a loaded
    // machine can fit them at 0.
    GenerationRequest r = request("r" + std::to_string(i), 900 + i, 40 + 30 * i, 64);
    r.request_class = i % 2 ? RequestClass::kBestEffort : RequestClass::kRealtime;
    reqs.push_back(std::move(r));
  }
  for (bool fit : {false, true}) {
    EngineOptions o = options();
    o.scheduler.policy = SchedulerPolicy::kHybrid;
    o.scheduler.fit_iteration_cost = fit;
    o.scheduler.max_batch_tokens = 128;  // prompts over several steps: prefill and decode mixed
    Engine engine(dir_->path(), o);
    const auto got = run(engine, reqs);
    ASSERT_EQ(got.size(), reqs.size());
    ASSERT_GT(engine.stats().steps, 72);  // refits (every 32 steps) after the prompts are done
    const IterationCostModel& m = engine.iteration_cost();
    if (!fit) {
      EXPECT_EQ(m.forward_seconds(128, 8, 800), 0.0);
      continue;
    }
    // The estimate the policy uses: a mixed step. Which phase the fit credits with the time is
    // not determined on a tiny model whose step times are mostly the neighbours' on a loaded
    // 2-core machine (a decode-only or prefill-only term fitted at 0 failed CI), so only the
    // sum is asserted here; recovering each term from known timings is
    // IterationFit.RecoversTheModelThatTimedTheSteps (tests/sched), on a recorded step log.
    const double mixed = m.forward_seconds(128, 8, 800);
    EXPECT_GT(mixed, 0.0);
    // The same order of magnitude as the steps measured (a tiny model: well under a second).
    const double mean_step =
        engine.stats().step_seconds / static_cast<double>(engine.stats().steps);
    EXPECT_LT(mixed, 20 * mean_step);
    std::printf(
        "fitted: prefill %.2e + %.2e/token, decode %.2e + %.2e/token + %.2e/context; mean "
        "step %.2e s over %lld steps\n",
        m.prefill_base, m.prefill_per_token, m.decode_base, m.decode_per_token,
        m.decode_per_context_token, mean_step, static_cast<long long>(engine.stats().steps));
  }
}

// BROS §5: with few KV pages, real-time and best-effort sequences share pages from opposite
// ends, RT sequences overwrite BE slots after checkpointing them, BE sequences restore them
// (or move off) before running again. None of it may change a token.
TEST_P(EngineTest, BidirectionalPagesShareCheckpointRestoreAndKeepTheTokens) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 16; ++i) {
    GenerationRequest r =
        request("r" + std::to_string(i), 700 + i, 9 + i * 5 % 23, 36, i % 3 ? 0.0f : 0.8f);
    r.request_class = i % 2 ? RequestClass::kBestEffort : RequestClass::kRealtime;
    reqs.push_back(std::move(r));
  }
  Engine roomy(dir_->path(), options());
  const auto expected = run(roomy, reqs);

  EngineStats total;
  for (int pages : {12, 16, 20})
    for (SchedulerPolicy policy : {SchedulerPolicy::kHybrid, SchedulerPolicy::kFcfs}) {
      EngineOptions o = options();
      o.kv_memory_gb = kv_gb(pages);
      o.scheduler.policy = policy;
      o.scheduler.bidirectional_kv = true;
      o.scheduler.initial_output_estimate = 1;  // optimistic admission: memory runs out
      o.scheduler.exact_known_lengths = false;
      o.scheduler.hybrid = {.initial_batch = 4, .batch_step = 2, .max_batch = 16};
      o.scheduler.iteration_cost.decode_per_token = 1e-3;
      Engine engine(dir_->path(), o);
      std::map<std::string, GenerationResult> got;
      for (const auto& r : reqs)
        engine.submit(GenerationRequest(r),
                      [&got](GenerationResult&& g) { got[g.id] = std::move(g); });
      while (engine.has_work()) {
        engine.step();
        engine.check_invariants();
      }
      ASSERT_EQ(got.size(), reqs.size());
      for (const auto& [id, r] : expected) EXPECT_EQ(got[id].tokens, r.tokens) << id;
      const EngineStats s = engine.stats();
      total.kv_shared_pages += s.kv_shared_pages;
      total.kv_checkpointed_slots += s.kv_checkpointed_slots;
      total.kv_restored_pages += s.kv_restored_pages;
      total.kv_moved_pages += s.kv_moved_pages;
      EXPECT_EQ(s.kv_used_bytes, 0);  // every page back (the prefix cache's are idle)
    }
  // The test is only worth something if the mechanisms ran.
  EXPECT_GT(total.kv_shared_pages, 0);
  EXPECT_GT(total.kv_checkpointed_slots, 0);
  EXPECT_GT(total.kv_restored_pages, 0);
  std::printf("shared %lld checkpointed slots %lld restored %lld moved %lld\n",
              static_cast<long long>(total.kv_shared_pages),
              static_cast<long long>(total.kv_checkpointed_slots),
              static_cast<long long>(total.kv_restored_pages),
              static_cast<long long>(total.kv_moved_pages));
}

TEST_P(EngineTest, StopStringsTokenIdsAndMaxTokens) {
  Engine engine(dir_->path(), options());
  auto free_run = run(engine, {request("a", 5, 10, 24)})["a"];
  ASSERT_EQ(free_run.tokens.size(), 24u);
  EXPECT_EQ(free_run.finish, FinishReason::kLength);
  ASSERT_GT(free_run.text.size(), 6u);

  // A stop string taken from the middle of the free-running text cuts the text before it.
  const std::string stop = free_run.text.substr(free_run.text.size() / 2, 3);
  GenerationRequest r = request("b", 5, 10, 24);
  r.params.stop = {stop};
  auto stopped = run(engine, {r})["b"];
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  EXPECT_EQ(stopped.text, free_run.text.substr(0, free_run.text.find(stop)));
  EXPECT_LT(stopped.tokens.size(), 24u);

  // A stop token id ends generation with that token.
  r = request("c", 5, 10, 24);
  r.params.stop_token_ids = {free_run.tokens[5]};
  auto by_id = run(engine, {r})["c"];
  EXPECT_EQ(by_id.finish, FinishReason::kStop);
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[5]);
  EXPECT_EQ(by_id.tokens.size(), static_cast<size_t>(first - free_run.tokens.begin() + 1));

  r = request("d", 5, 10, 0);
  auto none = run(engine, {r})["d"];
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.finish, FinishReason::kLength);
}

// vLLM's stop_reason: the stop string, the stop_token_ids token, or nothing (EOS, length).
TEST_P(EngineTest, StopReasonNamesTheStopStringOrTokenAndNothingForEosOrLength) {
  Engine engine(dir_->path(), options());
  const GenerationResult free_run = run(engine, {request("a", 5, 10, 24)})["a"];
  ASSERT_GT(free_run.text.size(), 6u);
  EXPECT_EQ(free_run.stop_reason, StopReason{});

  GenerationRequest r = request("s", 5, 10, 24);
  r.params.stop = {"\x01never", free_run.text.substr(free_run.text.size() / 2, 3)};
  EXPECT_EQ(run(engine, {r})["s"].stop_reason, StopReason{r.params.stop[1]});

  r = request("t", 5, 10, 24);
  r.params.stop_token_ids = {free_run.tokens[5]};
  EXPECT_EQ(run(engine, {r})["t"].stop_reason, StopReason{free_run.tokens[5]});

  // EOS forced first: a stop with no reason, even when EOS is also a stop token (vLLM checks
  // EOS first).
  r = request("e", 5, 10, 24);
  r.params.ignore_eos = false;
  r.params.logit_bias = {{128009, 100.0f}};
  r.params.stop_token_ids = {128009};
  const GenerationResult eos = run(engine, {r})["e"];
  EXPECT_EQ(eos.finish, FinishReason::kStop);
  EXPECT_EQ(eos.tokens, std::vector<TokenId>{128009});
  EXPECT_EQ(eos.stop_reason, StopReason{});
}

// include_stop_str_in_output: the stop string stays in the text and the streamed deltas (none
// held back), and so does a final stop token's text; the defaults are unchanged.
TEST_P(EngineTest, IncludeStopStrKeepsTheStopStringAndTheStopTokenText) {
  Engine engine(dir_->path(), options());
  const GenerationResult free_run = run(engine, {request("a", 7, 10, 32)})["a"];
  ASSERT_GT(free_run.text.size(), 8u);
  const std::string stop = free_run.text.substr(free_run.text.size() / 2, 4);
  GenerationRequest r = request("s", 7, 10, 32);
  r.params.stop = {stop};
  r.params.include_stop_str_in_output = true;
  std::string streamed;
  GenerationResult result;
  engine.submit(
      std::move(r), [&](GenerationResult&& g) { result = std::move(g); },
      [&](const SampledToken&, std::string_view delta) { streamed += delta; });
  engine.run_until_done();
  EXPECT_EQ(result.text, free_run.text.substr(0, free_run.text.find(stop) + stop.size()));
  EXPECT_EQ(streamed, result.text);
  EXPECT_EQ(result.finish, FinishReason::kStop);

  // A stop token's text ends the output: the text of the free run's first k tokens.
  const auto k = static_cast<int>(
      std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[6]) -
      free_run.tokens.begin() + 1);
  const std::string first_k = run(engine, {request("k", 7, 10, k)})["k"].text;
  for (const bool include : {false, true}) {
    r = request("t", 7, 10, 32);
    r.params.stop_token_ids = {free_run.tokens[6]};
    r.params.include_stop_str_in_output = include;
    const GenerationResult by_id = run(engine, {r})["t"];
    ASSERT_EQ(by_id.tokens.size(), static_cast<size_t>(k));
    if (include)
      EXPECT_EQ(by_id.text, first_k);
    else
      EXPECT_EQ(by_id.text, run(engine, {request("k1", 7, 10, k - 1)})["k1"].text);
  }
}

// min_tokens: EOS and stop tokens cannot come before min_tokens tokens are out (masked, so the
// tokens are the model's next most likely ones), and stop strings are looked for only after.
TEST_P(EngineTest, MinTokensHoldsOffEosStopTokensAndStopStrings) {
  Engine engine(dir_->path(), options());
  for (const bool by_stop_id : {false, true}) {
    GenerationRequest r = request("e", 5, 10, 24);
    r.params.ignore_eos = false;
    const TokenId end = by_stop_id ? 1234 : 128001;  // an EOS id or a plain stop token
    if (by_stop_id) r.params.stop_token_ids = {end};
    r.params.logit_bias = {{end, 100.0f}};  // the most likely token at every step
    EXPECT_EQ(run(engine, {r})["e"].tokens, std::vector<TokenId>{end});
    r.params.min_tokens = 5;
    const GenerationResult held = run(engine, {r})["e"];
    ASSERT_EQ(held.tokens.size(), 6u) << "by_stop_id=" << by_stop_id;
    EXPECT_EQ(held.tokens.back(), end);
    EXPECT_EQ(std::count(held.tokens.begin(), held.tokens.end(), end), 1);
    EXPECT_EQ(held.finish, FinishReason::kStop);
    // The same tokens in a batch with others and in another order (the mask is the row's own).
    GenerationRequest again = r;
    again.id = "e2";
    auto batch = run(engine, {request("x", 3, 30, 8), again, request("y", 4, 7, 3)});
    EXPECT_EQ(batch["e2"].tokens, held.tokens);
  }

  // A stop string in the text of the first min_tokens tokens does not stop the request; one
  // that ends later does.
  const GenerationResult free_run = run(engine, {request("a", 5, 10, 24)})["a"];
  const int min_tokens = 6;
  const std::string early = run(engine, {request("m", 5, 10, min_tokens)})["m"].text;
  ASSERT_GE(early.size(), 2u);
  const std::string stop = early.substr(early.size() - 2);
  size_t at = free_run.text.find(stop);
  while (at != std::string::npos && at + stop.size() <= early.size())
    at = free_run.text.find(stop, at + 1);
  GenerationRequest r = request("s", 5, 10, 24);
  r.params.stop = {stop};
  EXPECT_EQ(run(engine, {r})["s"].text, free_run.text.substr(0, free_run.text.find(stop)));
  r.params.min_tokens = min_tokens;
  const GenerationResult held = run(engine, {r})["s"];
  EXPECT_EQ(held.text, free_run.text.substr(0, at));
  EXPECT_EQ(held.finish, at == std::string::npos ? FinishReason::kLength : FinishReason::kStop);
  EXPECT_GE(held.tokens.size(), static_cast<size_t>(min_tokens));
}

// skip_special_tokens false: special tokens are written into the text; a final EOS only with
// include_stop_str_in_output (vLLM leaves the stopping token out otherwise).
TEST_P(EngineTest, SpecialTokensAreTextUnlessSkipped) {
  Engine engine(dir_->path(), options());
  const std::string bos = engine.tokenizer().decode(std::vector<TokenId>{128000});
  ASSERT_EQ(bos, "<|begin_of_text|>");
  for (const bool skip : {true, false}) {
    GenerationRequest r = request("b", 5, 10, 3);
    r.params.logit_bias = {{128000, 100.0f}};
    r.params.skip_special_tokens = skip;
    const GenerationResult out = run(engine, {r})["b"];
    EXPECT_EQ(out.tokens, std::vector<TokenId>(3, 128000));
    EXPECT_EQ(out.text, skip ? "" : bos + bos + bos);
    for (const bool include : {false, true}) {
      r = request("e", 5, 10, 3);
      r.params.ignore_eos = false;
      r.params.logit_bias = {{128009, 100.0f}};
      r.params.skip_special_tokens = skip;
      r.params.include_stop_str_in_output = include;
      EXPECT_EQ(run(engine, {r})["e"].text, !skip && include ? "<|eot_id|>" : "")
          << "skip=" << skip << " include=" << include;
    }
  }
}

TEST_P(EngineTest, BadRequestsAreErrorsAndTheEngineCarriesOn) {
  Engine engine(dir_->path(), options());
  EXPECT_THROW(engine.submit(request("empty", 1, 0, 4), nullptr), Error);
  GenerationRequest bad = request("range", 1, 4, 4);
  bad.prompt[2] = 999999;
  EXPECT_THROW(engine.submit(bad, nullptr), Error);
  EXPECT_THROW(engine.submit(request("long", 1, 9000, 4), nullptr), Error);
  auto ok = run(engine, {request("fine", 1, 4, 4)});
  EXPECT_EQ(ok["fine"].tokens.size(), 4u);
}

TEST_P(EngineTest, StreamedDeltasAreTheTextAndNeverIncludeACutStopString) {
  Engine engine(dir_->path(), options());
  const GenerationResult free_run = run(engine, {request("a", 7, 10, 32)})["a"];
  ASSERT_GT(free_run.text.size(), 8u);
  for (const bool with_stop : {false, true}) {
    GenerationRequest r = request("s", 7, 10, 32);
    // A 4-byte stop string from the middle: its first bytes arrive tokens before it completes.
    const std::string stop = free_run.text.substr(free_run.text.size() / 2, 4);
    if (with_stop) r.params.stop = {stop};
    std::string streamed;
    std::vector<TokenId> tokens;
    GenerationResult result;
    engine.submit(
        std::move(r), [&](GenerationResult&& g) { result = std::move(g); },
        [&](const SampledToken& t, std::string_view delta) {
          tokens.push_back(t.token);
          streamed += delta;
          // Each delta is sent as JSON text of its own: no character split across two.
          EXPECT_EQ(sanitize_utf8(delta), delta);
          if (with_stop) {
            EXPECT_EQ(streamed.find(stop), std::string::npos);
          }
        });
    engine.run_until_done();
    EXPECT_EQ(streamed, result.text) << "with_stop=" << with_stop;
    EXPECT_EQ(tokens, result.tokens);
    if (with_stop) {
      EXPECT_EQ(result.text, free_run.text.substr(0, free_run.text.find(stop)));
    }
  }
}

TEST_P(EngineTest, CancelFreesTheKvAtOnceAndTheOthersFinishUnchanged) {
  Engine engine(dir_->path(), options());
  const GenerationResult alone = run(engine, {request("keep", 3, 40, 16)})["keep"];
  std::map<std::string, GenerationResult> out;
  auto collect = [&out](GenerationResult&& g) { out[g.id] = std::move(g); };
  int cancelled_tokens = 0;
  const SeqId running =
      engine.submit(request("running", 4, 60, 64), collect,
                    [&](const SampledToken&, std::string_view) { ++cancelled_tokens; });
  engine.submit(request("keep", 3, 40, 16), collect);
  engine.step();
  engine.step();
  ASSERT_GT(engine.stats().kv_used_bytes, 0);
  // A waiting request is dropped from the queue just as well.
  GenerationRequest waiting = request("waiting", 5, 30, 8);
  waiting.request_class = RequestClass::kBestEffort;
  const SeqId queued = engine.submit(std::move(waiting), collect);
  EXPECT_EQ(engine.num_waiting(), 1u);
  EXPECT_TRUE(engine.cancel(queued));
  EXPECT_EQ(engine.num_waiting(), 0u);
  const int64_t before = engine.stats().kv_used_bytes;
  EXPECT_TRUE(engine.cancel(running));
  EXPECT_LT(engine.stats().kv_used_bytes, before);
  EXPECT_FALSE(engine.cancel(running));
  const int tokens_at_cancel = cancelled_tokens;
  engine.run_until_done();
  EXPECT_EQ(cancelled_tokens, tokens_at_cancel);
  EXPECT_EQ(out.count("running"), 0u);
  EXPECT_EQ(out.count("waiting"), 0u);
  EXPECT_EQ(out["keep"].tokens, alone.tokens);
  EXPECT_EQ(engine.stats().kv_used_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(Steps, EngineTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "Overlapped" : "Plain";
                         });

}  // namespace
}  // namespace blend
