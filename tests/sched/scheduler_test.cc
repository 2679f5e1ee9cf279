#include "sched/scheduler.h"

#include <memory>
#include <random>

#include <gtest/gtest.h>

namespace blend {
namespace {

std::unique_ptr<Sequence> make_seq(SeqId id, int32_t prompt, int32_t max_tokens) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->tokens.assign(static_cast<size_t>(prompt), 1);
  s->prompt_len = prompt;
  s->params.max_tokens = max_tokens;
  return s;
}

// Plays the engine's part: runs the plan's page copies (releasing their sources in `pool`),
// marks chunks computed and appends a token to sampling chunks; finishes sequences that reach
// max_tokens. Returns the finished ones.
std::vector<Sequence*> apply(Scheduler& sched, const StepPlan& plan, PagePool* pool = nullptr) {
  if (!plan.copies.empty()) {
    EXPECT_NE(pool, nullptr);
    for (const auto& copy : plan.copies) pool->release(copy.first);
  }
  std::vector<Sequence*> finished;
  sched.step_done(plan);
  for (const auto& c : plan.chunks) {
    EXPECT_LE(c.seq->num_computed, c.seq->num_tokens());
    if (c.samples) {
      c.seq->tokens.push_back(2);
      if (c.seq->num_generated() >= c.seq->params.max_tokens) finished.push_back(c.seq);
    }
  }
  for (Sequence* s : finished) sched.finish(s);
  return finished;
}

TEST(Scheduler, ChunkedPrefillRespectsTheBudget) {
  PagePool pool(100, 16);
  SchedulerOptions o;
  o.max_batch_tokens = 64;
  Scheduler sched(pool, o);
  auto a = make_seq(1, 150, 4);
  sched.add(a.get());
  StepPlan p1 = sched.schedule();
  ASSERT_EQ(p1.chunks.size(), 1u);
  EXPECT_EQ(p1.chunks[0].num_tokens, 64);
  EXPECT_FALSE(p1.chunks[0].samples);
  apply(sched, p1);
  StepPlan p2 = sched.schedule();
  EXPECT_EQ(p2.chunks[0].num_tokens, 64);
  apply(sched, p2);
  StepPlan p3 = sched.schedule();
  EXPECT_EQ(p3.chunks[0].num_tokens, 22);
  EXPECT_TRUE(p3.chunks[0].samples);
  apply(sched, p3);
  // Decoding now: one token per step; a second request fills the rest of the budget.
  auto b = make_seq(2, 100, 2);
  sched.add(b.get());
  StepPlan p4 = sched.schedule();
  ASSERT_EQ(p4.chunks.size(), 2u);
  EXPECT_EQ(p4.chunks[0].seq, a.get());
  EXPECT_EQ(p4.chunks[0].num_tokens, 1);
  EXPECT_EQ(p4.chunks[1].seq, b.get());
  EXPECT_EQ(p4.chunks[1].num_tokens, 63);
  EXPECT_EQ(p4.num_tokens, 64);
}

TEST(Scheduler, PreemptsNewestWhenPagesRunOutAndEverythingFinishes) {
  // 6 pages of 4 tokens = 24 tokens for three sequences that each grow to 12 tokens: they
  // cannot all fit; the newest is preempted and recomputed, and all finish.
  PagePool pool(6, 4);
  SchedulerOptions o;
  o.max_batch_tokens = 32;
  o.initial_output_estimate = 1;  // deliberately optimistic admission, to force preemption
  Scheduler sched(pool, o);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(make_seq(i, 4, 8));
    sched.add(seqs.back().get());
  }
  int finished = 0;
  for (int step = 0; step < 500 && sched.has_work(); ++step) {
    StepPlan plan = sched.schedule();
    ASSERT_FALSE(plan.empty());
    for (const auto& c : plan.chunks)
      ASSERT_GE(static_cast<int64_t>(c.seq->block_table.size()) * 4,
                c.seq->num_computed + c.num_tokens);
    finished += static_cast<int>(apply(sched, plan).size());
    pool.check_invariants();
  }
  EXPECT_EQ(finished, 3);
  EXPECT_GT(sched.num_preemptions(), 0);
  EXPECT_EQ(pool.num_free(), 6);
  for (const auto& s : seqs) EXPECT_EQ(s->num_generated(), 8);
}

TEST(Scheduler, PeakMemoryAdmissionAvoidsPreemption) {
  // Same workload as above, but admission expects the full output: no preemption needed.
  PagePool pool(6, 4);
  SchedulerOptions o;
  o.max_batch_tokens = 32;
  o.initial_output_estimate = 1000;
  Scheduler sched(pool, o);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int i = 0; i < 3; ++i) {
    seqs.push_back(make_seq(i, 4, 8));
    sched.add(seqs.back().get());
  }
  int finished = 0;
  for (int step = 0; step < 500 && sched.has_work(); ++step)
    finished += static_cast<int>(apply(sched, sched.schedule()).size());
  EXPECT_EQ(finished, 3);
  EXPECT_EQ(sched.num_preemptions(), 0);
}

TEST(Scheduler, RandomWorkloadLeavesThePoolFull) {
  std::mt19937 rng(7);
  PagePool pool(40, 8);
  SchedulerOptions o;
  o.max_batch_tokens = 48;
  o.max_running = 8;
  o.initial_output_estimate = 4;
  Scheduler sched(pool, o);
  std::vector<std::unique_ptr<Sequence>> seqs;
  int finished = 0;
  for (int step = 0; step < 5000; ++step) {
    if (seqs.size() < 60 && rng() % 3 == 0) {
      seqs.push_back(make_seq(static_cast<SeqId>(seqs.size()), 1 + static_cast<int32_t>(rng() % 60),
                              1 + static_cast<int32_t>(rng() % 40)));
      sched.add(seqs.back().get());
    }
    if (!sched.has_work()) continue;
    finished += static_cast<int>(apply(sched, sched.schedule()).size());
    if (step % 100 == 0) pool.check_invariants();
  }
  while (sched.has_work()) finished += static_cast<int>(apply(sched, sched.schedule()).size());
  EXPECT_EQ(finished, static_cast<int>(seqs.size()));
  EXPECT_EQ(pool.num_free(), pool.num_pages());
  pool.check_invariants();
}

std::unique_ptr<Sequence> make_seq_with(SeqId id, std::vector<TokenId> prompt, int32_t max_tokens) {
  auto s = make_seq(id, 1, max_tokens);
  s->prompt_len = static_cast<int32_t>(prompt.size());
  s->tokens = std::move(prompt);
  return s;
}

std::vector<TokenId> shared_then_unique(int32_t shared, int32_t unique, TokenId tag) {
  std::vector<TokenId> t;
  for (int32_t i = 0; i < shared; ++i) t.push_back(1000 + i);
  for (int32_t i = 0; i < unique; ++i) t.push_back(tag + i);
  return t;
}

TEST(Scheduler, APrefixSharedWithinTheBatchIsComputedOnce) {
  PagePool pool(100, 4);
  RadixCache cache(pool);
  SchedulerOptions o;
  o.max_batch_tokens = 64;
  Scheduler sched(pool, o, &cache);
  auto a = make_seq_with(1, shared_then_unique(40, 3, 10), 4);
  auto b = make_seq_with(2, shared_then_unique(40, 3, 20), 4);
  sched.add(a.get());
  sched.add(b.get());
  // Step 1: A prefills everything; B would share A's 40 tokens, which are being computed now,
  // so B waits although the budget has room.
  StepPlan p1 = sched.schedule();
  ASSERT_EQ(p1.chunks.size(), 1u);
  EXPECT_EQ(p1.chunks[0].seq, a.get());
  EXPECT_EQ(p1.chunks[0].num_tokens, 43);
  apply(sched, p1, &pool);
  // Step 2: B starts from A's cached pages and computes only its own 3 tokens.
  StepPlan p2 = sched.schedule();
  ASSERT_EQ(p2.chunks.size(), 2u);
  EXPECT_EQ(p2.chunks[1].seq, b.get());
  EXPECT_EQ(p2.chunks[1].num_tokens, 3);
  EXPECT_EQ(b->num_cached_prompt, 40);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b->block_table[i], a->block_table[i]);
  EXPECT_EQ(sched.cached_prompt_tokens(), 40);
  apply(sched, p2, &pool);
  while (sched.has_work()) apply(sched, sched.schedule(), &pool);
  cache.check_invariants();
  cache.evict(pool.num_pages());
  EXPECT_EQ(pool.num_free(), pool.num_pages());
}

TEST(Scheduler, IdenticalPromptsCopyThePartlyFilledLastPage) {
  PagePool pool(100, 4);
  RadixCache cache(pool);
  Scheduler sched(pool, SchedulerOptions{}, &cache);
  auto a = make_seq_with(1, shared_then_unique(10, 0, 0), 1);
  sched.add(a.get());
  while (sched.has_work()) apply(sched, sched.schedule(), &pool);
  // A finished: its two full pages and its last page (2 of 4 slots computed) are in the tree.
  // The same prompt reuses 9 tokens: two pages, and one token of a copy of the third.
  auto b = make_seq_with(2, shared_then_unique(10, 0, 0), 1);
  sched.add(b.get());
  StepPlan p = sched.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].num_tokens, 1);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].second, b->block_table[2]);
  EXPECT_NE(p.copies[0].first, b->block_table[2]);
  EXPECT_EQ(b->num_cached_prompt, 9);
  apply(sched, p, &pool);
  cache.check_invariants();
  pool.check_invariants();
}

// Shared prefixes, a pool too small for all of them, preemption and eviction: every request
// finishes, the tree and pool stay consistent, and the pool is whole once the cache is emptied.
TEST(Scheduler, RandomSharedWorkloadWithCacheLeavesThePoolFull) {
  std::mt19937 rng(11);
  PagePool pool(24, 4);
  RadixCache cache(pool);
  SchedulerOptions o;
  o.max_batch_tokens = 32;
  o.max_running = 6;
  o.initial_output_estimate = 2;  // optimistic: forces preemption now and then
  Scheduler sched(pool, o, &cache);
  std::vector<std::unique_ptr<Sequence>> seqs;
  int finished = 0;
  for (int step = 0; step < 4000; ++step) {
    if (seqs.size() < 150 && rng() % 2 == 0) {
      const auto shared = static_cast<int32_t>(rng() % 3 * 6);
      const auto unique = static_cast<int32_t>(1 + rng() % 10);
      seqs.push_back(
          make_seq_with(static_cast<SeqId>(seqs.size() + 1),
                        shared_then_unique(shared, unique, static_cast<TokenId>(rng() % 4)),
                        1 + static_cast<int32_t>(rng() % 12)));
      sched.add(seqs.back().get());
    }
    if (!sched.has_work()) continue;
    finished += static_cast<int>(apply(sched, sched.schedule(), &pool).size());
    cache.check_invariants();
    pool.check_invariants();
  }
  while (sched.has_work())
    finished += static_cast<int>(apply(sched, sched.schedule(), &pool).size());
  EXPECT_EQ(finished, static_cast<int>(seqs.size()));
  EXPECT_GT(sched.cached_prompt_tokens(), 0);
  cache.evict(pool.num_pages());
  EXPECT_EQ(cache.num_nodes(), 0);
  EXPECT_EQ(pool.num_free(), pool.num_pages());
}

SchedulerOptions hybrid_options(int32_t batch) {
  SchedulerOptions o;
  o.policy = SchedulerPolicy::kHybrid;
  o.hybrid = {.initial_batch = batch, .batch_step = 0, .max_batch = batch};
  o.iteration_cost.decode_per_token = 0.010;
  o.iteration_cost.prefill_per_token = 0.001;
  return o;
}

// `count` best-effort sequences (ids 10 on, 8-token prompts, 50 output tokens) waiting in
// `sched`, in that order.
std::vector<std::unique_ptr<Sequence>> add_best_effort(Scheduler& sched, int count) {
  std::vector<std::unique_ptr<Sequence>> be;
  for (int i = 0; i < count; ++i) {
    be.push_back(make_seq(10 + i, 8, 50));
    be.back()->request_class = RequestClass::kBestEffort;
    sched.add(be.back().get());
  }
  return be;
}

// A real-time sequence (id 1, 8-token prompt) that arrived at 0 with a `ttft_slo` target, added
// to `sched` behind what waits there.
std::unique_ptr<Sequence> add_realtime(Scheduler& sched, double ttft_slo) {
  auto rt = make_seq(1, 8, 50);
  rt->arrival_time = 0;
  rt->ttft_slo = ttft_slo;
  sched.add(rt.get());
  return rt;
}

TEST(Scheduler, HybridRunsRealTimeWhenItsDeadlineNearsAndBestEffortOtherwise) {
  PagePool pool(100, 4);
  Scheduler sched(pool, hybrid_options(2));
  const auto be = add_best_effort(sched, 3);
  // Plenty of time: the BE requests take the batch of 2.
  const auto rt = add_realtime(sched, 1.0);
  StepPlan p1 = sched.schedule(0.0);
  ASSERT_EQ(p1.chunks.size(), 2u);
  for (const auto& c : p1.chunks) EXPECT_EQ(c.seq->request_class, RequestClass::kBestEffort);
  apply(sched, p1);
  // Close to its deadline, the RT request goes first and keeps one BE request beside it.
  StepPlan p2 = sched.schedule(0.98);
  ASSERT_EQ(p2.chunks.size(), 2u);
  EXPECT_EQ(p2.chunks[0].seq, rt.get());
  EXPECT_EQ(p2.chunks[0].num_tokens, 8);
  EXPECT_EQ(p2.chunks[1].seq->request_class, RequestClass::kBestEffort);
  apply(sched, p2);
}

// BROS keeps RT and BE waiting requests in queues of their own: an RT request that arrives
// behind a BE job larger than the scheduler's look-ahead still runs in the next step.
TEST(Scheduler, HybridSeesRealTimeArrivalsBehindALargeBestEffortJob) {
  PagePool pool(1000, 4);
  SchedulerOptions o = hybrid_options(4);
  o.max_running = 4;  // the look-ahead is a multiple of the running-set limit
  Scheduler sched(pool, o);
  const auto be = add_best_effort(sched, 40);
  // Under two iterations away: no BE request may take its place.
  const auto rt = add_realtime(sched, 0.05);
  StepPlan p = sched.schedule(0.0);
  ASSERT_FALSE(p.chunks.empty());
  EXPECT_EQ(p.chunks[0].seq, rt.get());
  apply(sched, p);
}

TEST(Scheduler, RoundRobinAlternatesClasses) {
  PagePool pool(100, 4);
  SchedulerOptions o;
  o.policy = SchedulerPolicy::kRoundRobin;
  Scheduler sched(pool, o);
  auto rt = make_seq(1, 4, 10), be = make_seq(2, 4, 10);
  be->request_class = RequestClass::kBestEffort;
  sched.add(rt.get());
  sched.add(be.get());
  std::vector<RequestClass> turns;
  for (int step = 0; step < 4; ++step) {
    StepPlan p = sched.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    turns.push_back(p.chunks[0].seq->request_class);
    apply(sched, p);
  }
  EXPECT_EQ(turns, (std::vector<RequestClass>{RequestClass::kRealtime, RequestClass::kBestEffort,
                                              RequestClass::kRealtime, RequestClass::kBestEffort}));
}

// vLLM before chunked prefill: an arriving prompt takes the step whole and the running decodes
// wait; a prompt that does not fit the rest of the budget waits for the next step; decodes
// resume when no prompt is waiting. FCFS on the same arrivals mixes them in one step.
TEST(Scheduler, PrefillFirstRunsWholePromptsInStepsOfTheirOwn) {
  for (const SchedulerPolicy policy : {SchedulerPolicy::kPrefillFirst, SchedulerPolicy::kFcfs}) {
    SCOPED_TRACE(policy == SchedulerPolicy::kFcfs ? "fcfs" : "prefill-first");
    PagePool pool(100, 16);
    SchedulerOptions o;
    o.policy = policy;
    o.max_batch_tokens = 64;
    Scheduler sched(pool, o);
    auto a = make_seq(1, 10, 20);
    sched.add(a.get());
    apply(sched, sched.schedule());  // a's prompt; a decodes from now on
    auto b = make_seq(2, 40, 20), c = make_seq(3, 30, 20);
    sched.add(b.get());
    sched.add(c.get());
    StepPlan p = sched.schedule();
    std::vector<std::pair<Sequence*, int32_t>> got;
    for (const auto& ch : p.chunks) got.emplace_back(ch.seq, ch.num_tokens);
    if (policy == SchedulerPolicy::kFcfs) {
      EXPECT_EQ(got, (std::vector<std::pair<Sequence*, int32_t>>{
                         {a.get(), 1}, {b.get(), 40}, {c.get(), 23}}));
      continue;
    }
    EXPECT_EQ(got, (std::vector<std::pair<Sequence*, int32_t>>{{b.get(), 40}}));
    apply(sched, p);
    p = sched.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    EXPECT_EQ(p.chunks[0].seq, c.get());
    EXPECT_EQ(p.chunks[0].num_tokens, 30);
    apply(sched, p);
    p = sched.schedule();  // nothing waits: every running sequence decodes
    ASSERT_EQ(p.chunks.size(), 3u);
    for (const auto& ch : p.chunks) EXPECT_EQ(ch.num_tokens, 1);
    // A prompt longer than the step budget runs alone, in chunks, before any decode.
    apply(sched, p);
    auto d = make_seq(4, 100, 5);
    sched.add(d.get());
    p = sched.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    EXPECT_EQ(p.chunks[0].num_tokens, 64);
    apply(sched, p);
    p = sched.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    EXPECT_EQ(p.chunks[0].seq, d.get());
    EXPECT_EQ(p.chunks[0].num_tokens, 36);
    EXPECT_TRUE(p.chunks[0].samples);
  }
}

// Admission looks only at the pages free now: prefill-first admits requests whose growth will
// not fit and recovers by preemption; every request still finishes and the pool is whole after.
TEST(Scheduler, PrefillFirstOverAdmitsAndRecoversByPreemption) {
  PagePool pool(12, 4);
  SchedulerOptions o;
  o.policy = SchedulerPolicy::kPrefillFirst;
  o.max_batch_tokens = 64;
  Scheduler sched(pool, o);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (SeqId id = 1; id <= 4; ++id) {
    seqs.push_back(make_seq(id, 4, 12));
    sched.add(seqs.back().get());
  }
  StepPlan first = sched.schedule();
  EXPECT_EQ(first.chunks.size(), 4u);  // 4 pages of 12 now; at the end they need 16
  apply(sched, first);
  size_t finished = 0;
  for (int step = 0; step < 200 && finished < seqs.size(); ++step)
    finished += apply(sched, sched.schedule()).size();
  EXPECT_EQ(finished, seqs.size());
  EXPECT_GT(sched.num_preemptions(), 0);
  EXPECT_EQ(pool.num_free(), pool.num_pages());
}

}  // namespace
}  // namespace blend

// NanoFlow §4.2's discrete batching: a step whose work fills a fast size is cut to the largest
// one under the budget; every decode stays in the step; a step whose work fills none runs as it
// would without the sizes.
namespace blend {
namespace {

std::vector<int32_t> prefill_steps(const std::vector<int32_t>& sizes, int32_t tile = 0) {
  PagePool pool(200, 16);
  SchedulerOptions o;
  o.max_batch_tokens = 300;
  o.dense_batch_sizes = sizes;
  o.dense_batch_tile = tile;
  Scheduler sched(pool, o);
  auto a = make_seq(1, 1000, 2);
  sched.add(a.get());
  std::vector<int32_t> steps;
  while (a->num_computed < a->prompt_len) {
    StepPlan p = sched.schedule();
    steps.push_back(p.num_tokens);
    apply(sched, p);
  }
  return steps;
}

TEST(Scheduler, DiscreteBatchingCutsStepsToTheFastSizes) {
  // 1,000 prompt tokens: 256 three times (not 300), then 232 left -> 128, 104 left -> 64, and
  // the last 40 fill no size: they run as they are.
  EXPECT_EQ(prefill_steps({256, 64, 128}), (std::vector<int32_t>{256, 256, 256, 128, 64, 40}));
  EXPECT_EQ(prefill_steps({}), (std::vector<int32_t>{300, 300, 300, 100}));
  // A profile's GEMM row tile: every multiple of it is a fast size. 1,000 tokens under 300 with
  // a tile of 96: 288 three times, then 136 left -> 96, and the last 40 fill no tile.
  EXPECT_EQ(prefill_steps({}, 96), (std::vector<int32_t>{288, 288, 288, 96, 40}));
  // Listed sizes and the tile's multiples together: the largest that fits.
  EXPECT_EQ(prefill_steps({299}, 96), (std::vector<int32_t>{299, 299, 299, 96, 7}));

  // Five sequences decoding and a long prompt waiting: 256 = the five decodes + 251 prompt
  // tokens; with a fast size no larger than the decodes, every decode still runs and the prompt
  // gets the rest of the whole budget. (Before the prompts finish, size 4 cuts steps only while
  // fewer than 4 sequences decode: a size the decodes alone fill would hold the last prompt back
  // until they end.)
  for (const std::vector<int32_t>& sizes :
       {std::vector<int32_t>{256}, std::vector<int32_t>{4}, std::vector<int32_t>{}}) {
    PagePool pool(200, 16);
    SchedulerOptions o;
    o.max_batch_tokens = 300;
    o.dense_batch_sizes = sizes;
    Scheduler sched(pool, o);
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int i = 0; i < 5; ++i) {
      seqs.push_back(make_seq(i + 1, 10, 50));
      sched.add(seqs.back().get());
    }
    auto prefilling = [&] {
      for (const auto& s : seqs)
        if (s->num_computed < s->prompt_len) return true;
      return false;
    };
    while (prefilling()) apply(sched, sched.schedule());  // the five prompts
    for (const auto& s : seqs)  // none ran to its end while another's prompt waited
      EXPECT_FALSE(s->generation_complete()) << "a prompt was held back";
    auto b = make_seq(9, 500, 2);
    sched.add(b.get());
    const StepPlan p = sched.schedule();
    const int32_t expect = sizes == std::vector<int32_t>{256} ? 256 : 300;
    EXPECT_EQ(p.num_tokens, expect) << sizes.size();
    int32_t decodes = 0, prompt = 0;
    for (const ScheduledChunk& c : p.chunks) (c.seq == b.get() ? prompt : decodes) += c.num_tokens;
    EXPECT_EQ(decodes, 5);
    EXPECT_EQ(prompt, expect - 5);
  }
}

}  // namespace
}  // namespace blend
