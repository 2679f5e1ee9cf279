// The engine's output half (issue 55: schedule -> run -> post-process, one concern per file):
// what happens to a sampled token once a step is collected — stop conditions (EOS, stop ids,
// stop strings, max_tokens, a complete structured value), the detokenized text and the part of
// it a stream may send yet, logprobs and prompt logprobs, and the final GenerationResult.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "engine/active.h"
#include "engine/engine.h"

namespace blend {

std::vector<uint64_t> Engine::min_tokens_mask(ModelId model, const SamplingParams& p) const {
  const auto vocab = static_cast<size_t>(config().vocab_size);
  std::vector<uint64_t> mask((vocab + 63) / 64, ~uint64_t{0});
  const auto forbid = [&](TokenId t) {
    if (t >= 0 && static_cast<size_t>(t) < vocab) mask[t / 64] &= ~(uint64_t{1} << (t % 64));
  };
  for (TokenId t : models_[text_model(model)].config.eos_token_ids) forbid(t);
  for (TokenId t : p.stop_token_ids) forbid(t);
  return mask;
}

void Engine::stream(Active& a, const SampledToken& token, bool final) {
  if (!a.on_token) return;
  size_t safe = a.text.size();
  // Until the request ends, the last max_stop_len - 1 bytes may be the start of a stop string
  // (cut from the text unless it is included: then the text before it is final).
  if (!final && a.max_stop_len > 1 && !a.seq.params.include_stop_str_in_output)
    safe = std::max(a.streamed, safe >= a.max_stop_len - 1 ? safe - (a.max_stop_len - 1) : 0);
  // Nor a character split: each delta goes out as JSON text of its own (a split one would reach
  // the client as two U+FFFD).
  while (safe > a.streamed && safe < a.text.size() &&
         (static_cast<unsigned char>(a.text[safe]) & 0xC0) == 0x80)
    --safe;
  const std::string_view delta = std::string_view(a.text).substr(a.streamed, safe - a.streamed);
  a.streamed = safe;
  a.on_token(token, delta);
}

bool Engine::accept_token(Active& a, const SampledToken& sampled) {
  Sequence& seq = a.seq;
  const SamplingParams& p = seq.params;
  // A row with nothing to draw from gave a made-up token; one the grammar refused would make
  // output it did not accept. Either fails this request alone (not part of its output), never
  // reported as a complete answer (issue 54: "!" with finish_reason "stop").
  if (sampled.invalid || a.constraint_broken) {
    seq.finish = FinishReason::kError;
    a.error = sampled.invalid
                  ? "the model produced NaN logits: no finite logit for any token it may sample "
                    "next (a broken checkpoint or numerical overflow)"
                  : "internal: the sampled token is not allowed by the request's grammar";
    return true;
  }
  ++a.accepted;  // collect_step wrote the token into seq.tokens already
  const auto cls = static_cast<size_t>(seq.request_class);
  if (a.accepted == 1) {
    stats_.prompt_tokens_by_class[cls] += seq.prompt_len;
    a.first_token = now();
  }
  ++stats_.output_tokens;
  ++stats_.output_tokens_by_class[cls];
  a.last = sampled;
  seq.last_token_time = now();
  if (p.logprobs) a.logprobs.push_back(sampled);
  // Under a constraint EOS is only allowed once the value is complete, and it ends the
  // sequence even with ignore_eos (nothing else could follow).
  const std::vector<int32_t>& eos = models_[text_model(seq.model)].config.eos_token_ids;
  const bool is_eos =
      (!p.ignore_eos || a.matcher) && std::find(eos.begin(), eos.end(), sampled.token) != eos.end();
  const bool is_stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(),
                                    sampled.token) != p.stop_token_ids.end();
  // A stop string or id that cuts a structured value short would report output the grammar
  // did not accept as complete: the request fails instead (issue 54). The output is complete
  // only when it ends right before this token's text (a stop id's, or a stop string's that
  // starts there) and the value was complete then.
  const size_t before = a.text.size();
  const auto stop_here = [&](bool at_this_token) {
    if (a.matcher && !is_eos && !(at_this_token && a.complete_before)) {
      // The request's own stop conditions cut its own structured value: its fault, a 400.
      seq.finish = FinishReason::kError;
      a.error_param = is_stop_id ? "stop_token_ids" : "stop";
      a.error = std::string(is_stop_id ? "a stop token (stop_token_ids)" : "a stop string (stop)") +
                " ended the output before its response_format or tool call value was complete: "
                "stop conditions cannot cut a structured value (leave them out, or make sure "
                "they cannot occur inside it)";
    } else {
      seq.finish = FinishReason::kStop;
    }
    return true;
  };
  if (is_eos || is_stop_id) {
    // As vLLM: the final token's text is output only with include_stop_str_in_output.
    if (p.include_stop_str_in_output && a.detok) a.text += a.detok->push(sampled.token);
    if (!is_eos) a.stop_reason = sampled.token;  // vLLM reports EOS as no reason
    return stop_here(/*at_this_token=*/true);
  }
  if (a.detok) a.text += a.detok->push(sampled.token);
  // min_tokens: the text of the first min_tokens tokens is never searched (vLLM), so a stop
  // string must end in a later token's text.
  if (!p.stop.empty() && a.text.size() > before && a.accepted > p.min_tokens) {
    // A stop string may straddle the previous text; search only the tail that could hold it
    // and end in the new text. The earliest match wins (the first listed at one position).
    size_t cut = std::string::npos;
    const std::string* matched = nullptr;
    for (const auto& s : p.stop) {
      if (s.empty()) continue;
      const size_t at = a.text.find(s, before >= s.size() ? before - s.size() + 1 : 0);
      if (at < cut) {
        cut = at;
        matched = &s;
      }
    }
    if (matched) {
      a.text.resize(p.include_stop_str_in_output ? cut + matched->size() : cut);
      a.stopped_by_string = true;
      a.stop_reason = *matched;
      return stop_here(/*at_this_token=*/cut == before);
    }
  }
  // The constrained value is complete and nothing may follow it but EOS: stop here rather
  // than spend a step sampling that EOS.
  if (a.matcher && a.matcher->finished()) {
    seq.finish = FinishReason::kStop;
    return true;
  }
  if (a.accepted >= p.max_tokens) {
    seq.finish = FinishReason::kLength;
    return true;
  }
  return false;
}

void Engine::finish(Active& a) {
  const bool failed = a.seq.finish == FinishReason::kError;
  if (!a.stopped_by_string && a.detok) a.text += a.detok->flush();
  if (a.accepted > 0 && !failed) stream(a, a.last, /*final=*/true);
  GenerationResult r;
  r.id = a.request_id;
  r.prompt_tokens = a.seq.prompt_len;
  r.tokens.assign(a.seq.tokens.begin() + a.seq.prompt_len, a.seq.tokens.end());
  r.text = std::move(a.text);
  r.finish = a.seq.finish;
  if (r.finish == FinishReason::kStop) r.stop_reason = std::move(a.stop_reason);
  r.logprobs = std::move(a.logprobs);
  r.prompt_logprobs = std::move(a.prompt_logprobs);
  r.num_preemptions = a.seq.num_preemptions;
  r.cached_tokens = a.seq.num_cached_prompt;
  r.index = a.index;
  r.error = std::move(a.error);
  r.error_param = std::move(a.error_param);
  ++stats_.finished;
  const RequestTimes times{a.seq.request_class, a.seq.arrival_time, a.first_scheduled,
                           a.first_token, now()};
  for (const FinishObserver& observe : finish_observers_) observe(times);
  Callback cb = std::move(a.on_done);
  retire(a.seq.id);  // `a` belongs to no one from here on
  if (cb) cb(std::move(r));
}

void Engine::add_prompt_scoring(const Sequence& seq, size_t chunk, StepInput& in) {
  SeqChunk& c = in.batch.chunks[chunk];
  // Position p's logits score prompt token p + 1: positions up to prompt_len - 2.
  const int32_t scored = std::clamp(seq.prompt_len - 1 - c.num_cached, 0, c.num_tokens);
  if (scored == 0) return;
  c.all_logits = true;
  const auto first = seq.tokens.begin() + c.num_cached + 1;
  in.scoring.push_back({.chunk = chunk,
                        .next = std::vector<TokenId>(first, first + scored),
                        .top = *seq.params.prompt_logprobs});
}

void Engine::collect_prompt_logprobs(const InFlight& step) {
  if (step.scoring_seqs.empty()) return;
  std::vector<std::vector<PromptLogprob>> scored = backend_->take_prompt_logprobs();
  if (scored.size() != step.scoring_seqs.size())
    throw Error("internal: the backend scored " + std::to_string(scored.size()) + " chunks of " +
                std::to_string(step.scoring_seqs.size()));
  for (size_t s = 0; s < scored.size(); ++s) {
    auto it = active_.find(step.scoring_seqs[s].first);
    if (it == active_.end()) continue;  // cancelled meanwhile
    std::vector<PromptLogprob>& out = it->second->prompt_logprobs;
    // Position p's row scores token p + 1.
    const auto first = static_cast<size_t>(step.scoring_seqs[s].second) + 1;
    for (size_t i = 0; i < scored[s].size() && first + i < out.size(); ++i)
      out[first + i] = std::move(scored[s][i]);
  }
}

}  // namespace blend
