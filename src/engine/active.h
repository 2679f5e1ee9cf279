// Engine::Active — a submitted request's state while the engine runs it: its Sequence and
// everything that turns sampled tokens into its result (detokenizer, stop strings, logprobs,
// the structured-output matcher, callbacks). Private to engine/ (engine.cc schedules and runs
// steps over it; engine_output.cc turns each accepted token into text, stops and results).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/constraint.h"
#include "core/sequence.h"
#include "core/types.h"
#include "engine/engine.h"
#include "text/tokenizer.h"

namespace blend {

struct Engine::Active {
  Sequence seq;
  std::string request_id;
  Callback on_done;
  TokenCallback on_token;
  size_t streamed = 0;  // bytes of `text` passed to on_token
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::string text;
  size_t max_stop_len = 0;
  std::vector<SampledToken> logprobs;
  // SamplingParams::prompt_logprobs: entry p scores prompt token p (p >= 1), written as the
  // steps computing position p - 1 are collected (again, to the same values, after a
  // preemption); entry 0 holds the first token unscored.
  std::vector<PromptLogprob> prompt_logprobs;
  bool stopped_by_string = false;
  StopReason stop_reason;  // GenerationResult::stop_reason
  // min_tokens: the tokens a row may sample until that many are out (all but EOS and the
  // request's stop_token_ids); empty without min_tokens.
  std::vector<uint64_t> min_tokens_mask;
  // Structured output (response_format): follows the sampled tokens, masks the next ones.
  std::unique_ptr<TokenMatcher> matcher;
  bool constraint_broken = false;  // a token the matcher refused (only from an invalid row)
  std::string error;               // FinishReason::kError's message
  std::string error_param;         // its request field, when the request is at fault
  bool complete_before = false;    // the matcher's value was complete before the latest token
  int32_t accepted = 0;            // output tokens whose stop conditions were checked
  SampledToken last;               // the latest of them (the final streamed token)
  int32_t index = 0;               // GenerationRequest::index
  // On the engine's clock (RequestTimes): first put into a step, first token accepted.
  double first_scheduled = -1, first_token = -1;
};

}  // namespace blend
