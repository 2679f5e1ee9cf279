// Scheduler — once per iteration decides which sequences run and how many of their tokens
// (continuous batching with chunked prefill, Orca / Sarathi / NanoFlow §4.2): running
// sequences first (decodes take one token each; a partly prefilled prompt continues), then
// waiting sequences are admitted in the policy's order while the token budget and the KV pages
// allow. Admission uses NanoFlow's peak-memory estimation (§4.4) so that admitted sequences
// are unlikely to run out of pages later; when they do anyway, the newest running sequence is
// preempted (its pages freed, recomputed later) — never dropped.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "core/sequence.h"
#include "kv/page_pool.h"

namespace blend {

struct SchedulerOptions {
  int32_t max_batch_tokens = 1024;  // token budget of one step (prefill chunks + decodes)
  int32_t max_running = 256;        // sequences in the running set at once
  // Expected output length used by peak-memory admission before any request has finished
  // (capped by each request's max_tokens); afterwards the mean of finished requests is used.
  int32_t initial_output_estimate = 256;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;
  bool samples = false;  // the chunk reaches the end of the sequence's tokens: sample next
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> preempted;  // moved back to waiting in this step
  int32_t num_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(PagePool& pool, SchedulerOptions options);

  void add(Sequence* seq);  // joins the waiting queue (FCFS order of arrival)
  StepPlan schedule();
  // The engine appended a sampled token to seq->tokens (nothing to do) or finished it:
  void finish(Sequence* seq);
  // Drops a sequence wherever it is (waiting or running) and frees its pages at once; it does
  // not count as finished (a cancelled request says nothing about output lengths).
  void abort(Sequence* seq);

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  int64_t num_preemptions() const { return num_preemptions_; }

 private:
  bool grow(Sequence* seq, int32_t new_tokens);  // pages for num_computed + new_tokens
  void preempt(Sequence* seq);
  int64_t expected_output(const Sequence& seq) const;
  bool fits_peak_memory(const Sequence& candidate) const;

  PagePool& pool_;
  SchedulerOptions options_;
  std::vector<Sequence*> running_;  // in admission order
  std::deque<Sequence*> waiting_;
  int64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t finished_count_ = 0;
  int64_t finished_output_tokens_ = 0;
};

}  // namespace blend
