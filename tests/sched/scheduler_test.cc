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

// Plays the engine's part: marks chunks computed and appends a token to sampling chunks;
// finishes sequences that reach max_tokens. Returns the finished ones.
std::vector<Sequence*> apply(Scheduler& sched, const StepPlan& plan) {
  std::vector<Sequence*> finished;
  for (const auto& c : plan.chunks) {
    c.seq->num_computed += c.num_tokens;
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

}  // namespace
}  // namespace blend
