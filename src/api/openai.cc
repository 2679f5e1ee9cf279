#include "api/openai.h"

#include <limits>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace blend {
namespace {

using nlohmann::json;

template <typename T>
T number_field(const json& body, const char* key, T fallback, T lo, T hi) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw ApiError(400, std::string("'") + key + "' must be a number", key);
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer())
      throw ApiError(400, std::string("'") + key + "' must be an integer", key);
  }
  const double v = it->get<double>();
  if (v < static_cast<double>(lo) || v > static_cast<double>(hi))
    throw ApiError(400,
                   std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                       std::to_string(hi),
                   key);
  return it->get<T>();
}

bool bool_field(const json& body, const char* key, bool fallback) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw ApiError(400, std::string("'") + key + "' must be a boolean", key);
  return it->get<bool>();
}

std::vector<TokenId> token_list(const json& list, const char* param) {
  std::vector<TokenId> ids;
  ids.reserve(list.size());
  for (const auto& v : list) {
    if (!v.is_number_integer())
      throw ApiError(400, std::string("'") + param + "' must hold integers", param);
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw ApiError(400, std::string("'") + param + "' holds an invalid token id", param);
    ids.push_back(static_cast<TokenId>(id));
  }
  return ids;
}

void check_utf8(const std::string& s, const char* param) {
  // Rejects invalid UTF-8 up front: a prompt we cannot represent is the client's error.
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size())
      throw ApiError(400, "invalid UTF-8 in '" + std::string(param) + "'", param);
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2)
        throw ApiError(400, "invalid UTF-8 in '" + std::string(param) + "'", param);
    i += n;
  }
}

SamplingParams parse_sampling(Endpoint endpoint, const json& body) {
  SamplingParams p;
  p.temperature = number_field<float>(body, "temperature", 1.0f, 0.0f, 2.0f);
  p.top_p = number_field<float>(body, "top_p", 1.0f, 0.0f, 1.0f);
  if (body.contains("top_p") && p.top_p <= 0.0f)
    throw ApiError(400, "'top_p' must be > 0", "top_p");
  p.top_k = number_field<int32_t>(body, "top_k", 0, -1, std::numeric_limits<int32_t>::max());
  if (p.top_k < 0) p.top_k = 0;
  p.min_p = number_field<float>(body, "min_p", 0.0f, 0.0f, 1.0f);
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) throw ApiError(400, "'seed' must be an integer", "seed");
    p.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  const int32_t unlimited = std::numeric_limits<int32_t>::max();
  if (endpoint == Endpoint::kCompletions) {
    p.max_tokens = number_field<int32_t>(body, "max_tokens", 16, 0, unlimited);
  } else {
    // Chat: max_completion_tokens supersedes max_tokens; the default is "until the context ends".
    p.max_tokens = number_field<int32_t>(body, "max_tokens", unlimited, 0, unlimited);
    p.max_tokens = number_field<int32_t>(body, "max_completion_tokens", p.max_tokens, 0, unlimited);
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string())
          throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
    }
    for (const auto& s : p.stop) check_utf8(s, "stop");
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) throw ApiError(400, "'stop_token_ids' must be a list", "stop_token_ids");
    p.stop_token_ids = token_list(*it, "stop_token_ids");
  }
  p.ignore_eos = bool_field(body, "ignore_eos", false);
  if (endpoint == Endpoint::kCompletions) {
    if (auto it = body.find("logprobs"); it != body.end() && !it->is_null())
      p.logprobs = number_field<int32_t>(body, "logprobs", 0, 0, 20);
  } else if (bool_field(body, "logprobs", false)) {
    p.logprobs = number_field<int32_t>(body, "top_logprobs", 0, 0, 20);
  }
  const int32_t n = number_field<int32_t>(body, "n", 1, 1, 128);
  if (n != 1) throw ApiError(400, "only n=1 is supported", "n");
  if (number_field<int32_t>(body, "best_of", 1, 1, 128) != 1)
    throw ApiError(400, "only best_of=1 is supported", "best_of");
  if (bool_field(body, "echo", false)) throw ApiError(400, "'echo' is not supported", "echo");
  return p;
}

json token_bytes(const std::string& s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(c);
  return bytes;
}

}  // namespace

json ApiError::body() const {
  return {{"error",
           {{"message", what()},
            {"type", type_},
            {"param", param_.empty() ? json(nullptr) : json(param_)},
            {"code", nullptr}}}};
}

Endpoint parse_endpoint(const std::string& url) {
  if (url == "/v1/completions" || url == "/completions") return Endpoint::kCompletions;
  if (url == "/v1/chat/completions" || url == "/chat/completions")
    return Endpoint::kChatCompletions;
  throw ApiError(400,
                 "unsupported url '" + url + "' (supported: /v1/completions, /v1/chat/completions)",
                 "url");
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kNone:
      break;
  }
  return "stop";
}

ApiRequest parse_api_request(Endpoint endpoint, const json& body, const Tokenizer& tokenizer,
                             const ChatTemplate* chat_template) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  ApiRequest r;
  r.endpoint = endpoint;
  if (auto it = body.find("model"); it != body.end() && it->is_string())
    r.model = it->get<std::string>();
  r.params = parse_sampling(endpoint, body);
  r.stream = bool_field(body, "stream", false);
  for (auto [key, slot] : {std::pair{"ttft_slo", &r.ttft_slo}, std::pair{"tpot_slo", &r.tpot_slo}})
    if (body.contains(key) && !body[key].is_null())
      *slot = number_field<double>(body, key, 0.0, 1e-6, 3600.0);
  if (auto it = body.find("stream_options"); it != body.end() && it->is_object())
    r.include_usage = bool_field(*it, "include_usage", false);

  if (endpoint == Endpoint::kCompletions) {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
    const json* prompt = &*it;
    // A list holding one prompt (string or token list) is the same as that prompt.
    if (prompt->is_array() && prompt->size() == 1 &&
        ((*prompt)[0].is_string() || (*prompt)[0].is_array()))
      prompt = &(*prompt)[0];
    if (prompt->is_string()) {
      const std::string& text = prompt->get_ref<const std::string&>();
      check_utf8(text, "prompt");
      r.prompt = tokenizer.encode(text);
    } else if (prompt->is_array() && (prompt->empty() || (*prompt)[0].is_number())) {
      r.prompt = token_list(*prompt, "prompt");
    } else if (prompt->is_array()) {
      throw ApiError(400, "several prompts in one request are not supported; send one per request",
                     "prompt");
    } else {
      throw ApiError(400, "'prompt' must be a string or a list of token ids", "prompt");
    }
  } else {
    auto it = body.find("messages");
    if (it == body.end() || !it->is_array() || it->empty())
      throw ApiError(400, "'messages' must be a non-empty list", "messages");
    for (const auto& m : *it) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw ApiError(400, "each message needs a 'role'", "messages");
      if (auto c = m.find("content"); c != m.end() && c->is_string())
        check_utf8(c->get_ref<const std::string&>(), "messages");
    }
    if (!chat_template) throw ApiError(400, "this model has no chat template", "messages");
    std::string text;
    try {
      text = chat_template->render(*it, /*add_generation_prompt=*/true);
    } catch (const Error& e) {
      throw ApiError(400, std::string("chat template: ") + e.what(), "messages");
    }
    // The rendered prompt already carries the template's special tokens (BOS included).
    r.prompt = tokenizer.encode(text, /*parse_special=*/true);
  }
  if (r.prompt.empty()) throw ApiError(400, "the prompt is empty", "prompt");
  return r;
}

json make_response(const ApiRequest& request, const GenerationResult& result,
                   const std::string& response_id, const std::string& model, int64_t created,
                   const Tokenizer& tokenizer) {
  const int32_t completion_tokens = static_cast<int32_t>(result.tokens.size());
  json usage = {{"prompt_tokens", result.prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", result.prompt_tokens + completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", result.cached_tokens}}}};
  json logprobs = nullptr;
  const bool chat = request.endpoint == Endpoint::kChatCompletions;
  if (request.params.logprobs) {
    if (chat) {
      json content = json::array();
      for (const auto& lp : result.logprobs) {
        const std::string tok = tokenizer.decode(std::vector<TokenId>{lp.token});
        json top = json::array();
        for (const auto& t : lp.top) {
          const std::string s = tokenizer.decode(std::vector<TokenId>{t.token});
          top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", token_bytes(s)}});
        }
        content.push_back({{"token", tok},
                           {"logprob", lp.logprob},
                           {"bytes", token_bytes(tok)},
                           {"top_logprobs", top}});
      }
      logprobs = {{"content", content}};
    } else {
      json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
           offsets = json::array();
      size_t offset = 0;
      for (const auto& lp : result.logprobs) {
        const std::string tok = tokenizer.decode(std::vector<TokenId>{lp.token});
        tokens.push_back(tok);
        token_logprobs.push_back(lp.logprob);
        json alts = json::object();
        for (const auto& t : lp.top)
          alts[tokenizer.decode(std::vector<TokenId>{t.token})] = t.logprob;
        top.push_back(alts);
        offsets.push_back(offset);
        offset += tok.size();
      }
      logprobs = {{"tokens", tokens},
                  {"token_logprobs", token_logprobs},
                  {"top_logprobs", top},
                  {"text_offset", offsets}};
    }
  }
  json choice = {
      {"index", 0}, {"logprobs", logprobs}, {"finish_reason", finish_reason_name(result.finish)}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", result.text}};
  } else {
    choice["text"] = result.text;
  }
  return {{"id", response_id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage}};
}

}  // namespace blend
