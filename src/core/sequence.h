// Sequence — one request's state inside the engine: its tokens, how many of them have KV in
// the cache, the pages that hold them, and where it stands in the scheduler's queues.
// Plain data: the scheduler, KV manager and engine each update their own fields.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/types.h"

namespace blend {

enum class SeqStatus { kWaiting, kRunning, kFinished };

// Who is waiting for the answer (BROS §3): a person (real-time, latency SLOs) or a batch job /
// "service_tier": "flex" request (best-effort, throughput). Schedulers may treat them apart.
enum class RequestClass { kRealtime, kBestEffort };

struct Sequence {
  SeqId id = 0;
  ModelId model = 0;  // the engine's model it runs on; its KV is never shared with another's
  std::vector<TokenId> tokens;  // prompt followed by the generated tokens
  int32_t prompt_len = 0;
  SamplingParams params;
  uint64_t rng_seed = 0;  // sampling randomness is a function of (rng_seed, output index)
  RequestClass request_class = RequestClass::kRealtime;
  // Latency targets of a real-time request (BROS §4.1) and the clock readings they count from,
  // in seconds on the engine's clock.
  double ttft_slo = 0.4, tpot_slo = 0.2;
  double arrival_time = 0, last_token_time = 0;

  SeqStatus status = SeqStatus::kWaiting;
  int32_t num_computed = 0;  // tokens whose K/V are in the cache
  std::vector<PageId> block_table;
  // Per block-table entry, whether the sequence fills that page from its last slot backwards
  // (it shares the page with a sequence filling it from slot 0: kv/bidirectional_pages).
  // Missing entries are 0; all 0 unless the bidirectional KV layout is on.
  std::vector<uint8_t> reversed_pages;
  int32_t num_preemptions = 0;
  int32_t num_cached_prompt = 0;  // prompt tokens served from the prefix cache at admission
  int64_t arrival = 0;            // admission order, for FCFS and preemption victims

  FinishReason finish = FinishReason::kNone;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_generated() const { return num_tokens() - prompt_len; }
  // Tokens still to feed through the model before the next token can be sampled.
  int32_t num_uncomputed() const { return num_tokens() - num_computed; }
  // Every token the request may generate is sampled or being sampled (with overlapped steps the
  // last one is still in flight, and the sequence finishes when it arrives): nothing to compute.
  bool generation_complete() const { return num_generated() >= params.max_tokens; }
  bool page_reversed(size_t j) const { return j < reversed_pages.size() && reversed_pages[j]; }
  // Tokens held in pages that fill from slot 0 before the first reversed one: what the prefix
  // cache may take (it stores pages in that direction only).
  int32_t cacheable_tokens(int32_t page_size) const {
    for (size_t j = 0; j < reversed_pages.size(); ++j)
      if (reversed_pages[j]) return std::min(num_computed, static_cast<int32_t>(j) * page_size);
    return num_computed;
  }
};

}  // namespace blend
