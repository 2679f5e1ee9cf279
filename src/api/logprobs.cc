#include "api/logprobs.h"

#include <algorithm>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace blend {
namespace {

using nlohmann::json;

std::string token_string(const Tokenizer& tokenizer, TokenId id) {
  return tokenizer.decode(std::vector<TokenId>{id});
}

// What a token is called in the logprobs: its text, or "token_id:<id>" (vLLM's format).
std::string token_name(const Tokenizer& tokenizer, TokenId id, bool as_id) {
  return as_id ? "token_id:" + std::to_string(id) : token_string(tokenizer, id);
}

json byte_list(const std::string& s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(c);
  return bytes;
}

}  // namespace

json chat_logprobs(std::span<const SampledToken> tokens, const Tokenizer& tokenizer,
                   bool tokens_as_ids) {
  json content = json::array();
  for (const SampledToken& lp : tokens) {
    const std::string tok = token_name(tokenizer, lp.token, tokens_as_ids);
    json top = json::array();
    for (const TopLogprob& t : lp.top) {
      const std::string s = token_name(tokenizer, t.token, tokens_as_ids);
      top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", byte_list(s)}});
    }
    content.push_back({{"token", tok},
                       {"logprob", lp.logprob},
                       {"bytes", byte_list(tok)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json completion_logprobs(std::span<const SampledToken> tokens, const Tokenizer& tokenizer,
                         size_t first_offset, size_t* end_offset, bool tokens_as_ids) {
  json strings = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  size_t offset = first_offset;
  for (const SampledToken& lp : tokens) {
    const std::string tok = token_string(tokenizer, lp.token);
    strings.push_back(tokens_as_ids ? token_name(tokenizer, lp.token, true) : tok);
    token_logprobs.push_back(lp.logprob);
    json alts = json::object();
    for (const TopLogprob& t : lp.top)
      alts[token_name(tokenizer, t.token, tokens_as_ids)] = t.logprob;
    // vLLM (and OpenAI's legacy completions) list the sampled token among the alternatives even
    // when it is not one of the top k: up to k + 1 entries, and the token alone with logprobs 0.
    alts.emplace(strings.back().get<std::string>(), lp.logprob);
    top.push_back(alts);
    offsets.push_back(offset);
    offset += tok.size();
  }
  if (end_offset) *end_offset = offset;
  return {{"tokens", strings},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json prompt_logprobs_json(std::span<const PromptLogprob> scored, const Tokenizer& tokenizer,
                          bool tokens_as_ids) {
  auto entry = [&](TokenId id, float logprob, int32_t rank) {
    return json{{"logprob", logprob},
                {"rank", rank},
                {"decoded_token", token_name(tokenizer, id, tokens_as_ids)}};
  };
  json out = json::array();
  for (const PromptLogprob& p : scored) {
    if (p.rank == 0) {  // nothing before it to score it
      out.push_back(nullptr);
      continue;
    }
    json position = json::object();
    position[std::to_string(p.token)] = entry(p.token, p.logprob, p.rank);
    for (size_t i = 0; i < p.top.size(); ++i)
      position[std::to_string(p.top[i].token)] =
          entry(p.top[i].token, p.top[i].logprob, static_cast<int32_t>(i) + 1);
    out.push_back(std::move(position));
  }
  return out;
}

json echo_completion_logprobs(std::span<const PromptLogprob> scored, int32_t top,
                              std::span<const SampledToken> tokens, const Tokenizer& tokenizer,
                              size_t completion_offset, bool tokens_as_ids) {
  json strings = json::array(), token_logprobs = json::array(), alternatives = json::array(),
       offsets = json::array();
  size_t offset = 0;
  for (const PromptLogprob& p : scored) {
    strings.push_back(token_name(tokenizer, p.token, tokens_as_ids));
    offsets.push_back(offset);
    offset += token_string(tokenizer, p.token).size();
    if (p.rank == 0) {  // nothing before it to score it
      token_logprobs.push_back(nullptr);
      alternatives.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(p.logprob);
    json alts = json::object();
    const size_t n = std::min(p.top.size(), static_cast<size_t>(std::max(0, top)));
    for (size_t k = 0; k < n; ++k)
      alts[token_name(tokenizer, p.top[k].token, tokens_as_ids)] = p.top[k].logprob;
    alts.emplace(strings.back().get<std::string>(), p.logprob);  // itself, as the sampled ones
    alternatives.push_back(std::move(alts));
  }
  json completion =
      completion_logprobs(tokens, tokenizer, completion_offset, nullptr, tokens_as_ids);
  for (auto [key, list] :
       {std::pair{"tokens", &strings}, std::pair{"token_logprobs", &token_logprobs},
        std::pair{"top_logprobs", &alternatives}, std::pair{"text_offset", &offsets}})
    for (json& v : completion[key]) list->push_back(std::move(v));
  return {{"tokens", strings},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", alternatives},
          {"text_offset", offsets}};
}

}  // namespace blend
