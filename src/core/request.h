// What a caller asks of the engine and what it gets back: one generation request (a tokenized
// prompt, its sampling parameters, its class and latency targets) and its result. Plain data,
// so the API layer (api/) can build and read them without the engine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/sequence.h"
#include "core/types.h"

namespace blend {

struct GenerationRequest {
  std::string id;  // the caller's id (custom_id); also seeds requests without a seed
  std::vector<TokenId> prompt;
  SamplingParams params;
  RequestClass request_class = RequestClass::kRealtime;
  std::optional<double> ttft_slo, tpot_slo;  // seconds; the engine's defaults when unset
  // When the request arrived, on the engine's clock (a load generator replaying arrivals on a
  // simulated clock); unset = at submit. TTFT deadlines count from it.
  std::optional<double> arrival_time;
  // Which of a request's n samples (OpenAI's `n`) this is: its randomness is seeded with
  // seed + index (or the id's hash + index), so each sample has its own stream and the same
  // request gives the same n samples again.
  int32_t index = 0;
  ModelId model = 0;  // which of the engine's models runs it (Engine::find_model names them)
  // Adaptive serving (BlockLLM §5.3; Engine::add_adaptive_chain): whether the request may run
  // through equivalent blocks of another model; unset = the engine's default (off unless set).
  std::optional<bool> adaptive_blocks;
};

// What ended a request that finished with FinishReason::kStop, as vLLM's stop_reason reports
// it: the stop string that matched, the stop_token_ids token sampled, or nothing (EOS, a
// complete structured value; and every other finish reason).
using StopReason = std::variant<std::monostate, std::string, TokenId>;

struct GenerationResult {
  std::string id;
  int32_t prompt_tokens = 0;
  std::vector<TokenId> tokens;  // generated tokens (a final eos/stop token included)
  std::string text;             // their text, cut before a stop string or stop token
  FinishReason finish = FinishReason::kNone;
  StopReason stop_reason;
  std::vector<SampledToken> logprobs;  // one per generated token, when asked
  // SamplingParams::prompt_logprobs: one entry per prompt token in order, when asked; the first
  // token has no context to score it (its entry holds the token alone, rank 0).
  std::vector<PromptLogprob> prompt_logprobs;
  int32_t num_preemptions = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  int32_t index = 0;          // GenerationRequest::index
  std::string error;          // finish kError: what failed, for the client's error message
  // finish kError caused by the request itself, not the server: the field at fault ("stop",
  // "stop_token_ids"), for a 400 naming it. Empty: the server failed (a 500).
  std::string error_param;
};

}  // namespace blend
