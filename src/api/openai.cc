#include "api/openai.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <variant>

#include "api/json_limits.h"
#include "api/logprobs.h"
#include "api/request_fields.h"
#include "api/tools.h"
#include "api/utf8.h"
#include "core/error.h"
#include "grammar/json_schema.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace blend {
namespace {

using nlohmann::json;

// Chat messages as the chat template should see them. Clients (the openai SDKs, LangChain,
// most frameworks) send `content` as a list of parts, [{"type": "text", "text": ...}]; the
// template would print that list as a Python repr. Text parts are joined with "\n", as vLLM
// does (vllm/entrypoints/chat_utils.py, `"\n".join(texts)`); parts this text-only engine
// cannot read (image_url, input_audio, file, ...) are refused naming the part (issue 25).
std::string flatten_parts(const json& parts, const std::string& where) {
  std::string text;
  bool first = true;
  for (size_t j = 0; j < parts.size(); ++j) {
    const json& part = parts[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw ApiError(400, "'" + at + "' must be a content part object with a 'type'", at);
    const std::string& type = part["type"].get_ref<const std::string&>();
    if (type != "text")
      throw ApiError(400,
                     "'" + at + "' is a '" + type +
                         "' content part; this model reads text only (type \"text\")",
                     at + ".type");
    auto t = part.find("text");
    if (t == part.end() || !t->is_string())
      throw ApiError(400, "'" + at + ".text' must be a string", at + ".text");
    if (!first) text += '\n';
    text += t->get_ref<const std::string&>();
    first = false;
  }
  return text;
}

// A copy of `messages` with every content a string: content-part lists flattened, null or
// absent content "". Throws ApiError (400, param "messages[i]...") for a message that is not an
// object, has no string role, has content that is neither a string, null nor a list of text
// parts, or holds invalid UTF-8.
json flatten_chat_messages(const json& messages) {
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw ApiError(400, "each message needs a 'role' (" + where + ")", "messages");
    json copy = m;
    json& content = copy["content"];
    if (content.is_null()) {
      // No content (null or no key: the assistant turn blend returns with tool_calls) reaches
      // the template as "", as vLLM passes it: templates concatenate it as a string.
      content = "";
    } else if (content.is_array()) {
      content = flatten_parts(content, where + ".content");
    } else if (!content.is_string()) {
      throw ApiError(400, "'" + where + ".content' must be a string or a list of content parts",
                     where + ".content");
    }
    check_utf8(content.get_ref<const std::string&>(), where + ".content");
    out.push_back(std::move(copy));
  }
  return out;
}

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

// OpenAI logit_bias: {"<token id>": bias in [-100, 100]}; ids must exist in the vocabulary.
std::vector<std::pair<TokenId, float>> parse_logit_bias(const json& body, int32_t vocab_size) {
  std::vector<std::pair<TokenId, float>> out;
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return out;
  if (!it->is_object())
    throw ApiError(400, "'logit_bias' must be an object of token id -> bias", "logit_bias");
  for (const auto& [key, value] : it->items()) {
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id >= vocab_size)
      throw ApiError(400,
                     "'logit_bias' key '" + key.substr(0, 40) +
                         "' is not a token id of this model (0 to " +
                         std::to_string(vocab_size - 1) + ")",
                     "logit_bias");
    if (!value.is_number() || value.get<double>() < -100.0 || value.get<double>() > 100.0)
      throw ApiError(400, "'logit_bias' values must be numbers between -100 and 100", "logit_bias");
    out.emplace_back(static_cast<TokenId>(id), value.get<float>());
  }
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first == out[i - 1].first)
      throw ApiError(400, "'logit_bias' names token " + std::to_string(out[i].first) + " twice",
                     "logit_bias");
  return out;
}

SamplingParams parse_sampling(Endpoint endpoint, const json& body, int32_t vocab_size,
                              const SamplingDefaults& model) {
  SamplingParams p;
  p.temperature =
      number_field<float>(body, "temperature", model.temperature.value_or(1.0f), 0.0f, 2.0f);
  p.top_p = number_field<float>(body, "top_p", model.top_p.value_or(1.0f), 0.0f, 1.0f);
  if (body.contains("top_p") && p.top_p <= 0.0f)
    throw ApiError(400, "'top_p' must be > 0", "top_p");
  p.top_k = number_field<int32_t>(body, "top_k", model.top_k.value_or(0), -1,
                                  std::numeric_limits<int32_t>::max());
  if (p.top_k < 0) p.top_k = 0;
  p.min_p = number_field<float>(body, "min_p", model.min_p.value_or(0.0f), 0.0f, 1.0f);
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) throw ApiError(400, "'seed' must be an integer", "seed");
    p.seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  const int32_t unlimited = std::numeric_limits<int32_t>::max();
  if (endpoint == Endpoint::kCompletions) {
    p.max_tokens =
        number_field<int32_t>(body, "max_tokens", model.max_tokens.value_or(16), 1, unlimited);
  } else {
    // Chat: max_completion_tokens supersedes max_tokens; the default is "until the context ends"
    // (or the model's max_new_tokens). Asking for no tokens is refused, as vLLM does.
    p.max_tokens = number_field<int32_t>(body, "max_tokens", model.max_tokens.value_or(unlimited),
                                         1, unlimited);
    p.max_tokens = number_field<int32_t>(body, "max_completion_tokens", p.max_tokens, 1, unlimited);
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
    for (const TokenId id : p.stop_token_ids)
      if (id >= vocab_size)
        throw ApiError(400,
                       "'stop_token_ids' holds " + std::to_string(id) +
                           ", not a token id of this model (0 to " +
                           std::to_string(vocab_size - 1) + ")",
                       "stop_token_ids");
  }
  p.ignore_eos = bool_field(body, "ignore_eos", false);
  p.include_stop_str_in_output = bool_field(body, "include_stop_str_in_output", false);
  p.skip_special_tokens = bool_field(body, "skip_special_tokens", true);
  p.min_tokens = number_field<int32_t>(body, "min_tokens", 0, 0, unlimited);
  if (p.min_tokens > p.max_tokens)  // vLLM: 400
    throw ApiError(400,
                   "'min_tokens' (" + std::to_string(p.min_tokens) +
                       ") must be at most 'max_tokens' (" + std::to_string(p.max_tokens) + ")",
                   "min_tokens");
  p.presence_penalty = number_field<float>(body, "presence_penalty", 0.0f, -2.0f, 2.0f);
  p.frequency_penalty = number_field<float>(body, "frequency_penalty", 0.0f, -2.0f, 2.0f);
  // vLLM's repetition_penalty: > 0 (1 = off). The bound above only keeps it finite.
  p.repetition_penalty = number_field<float>(body, "repetition_penalty",
                                             model.repetition_penalty.value_or(1.0f), 0.0f, 1e6f);
  if (p.repetition_penalty <= 0.0f)
    throw ApiError(400, "'repetition_penalty' must be > 0", "repetition_penalty");
  p.logit_bias = parse_logit_bias(body, vocab_size);
  if (auto it = body.find("prompt_logprobs"); it != body.end() && !it->is_null())
    p.prompt_logprobs = number_field<int32_t>(body, "prompt_logprobs", 0, 0, kMaxPromptLogprobs);
  if (endpoint == Endpoint::kCompletions) {
    if (auto it = body.find("logprobs"); it != body.end() && !it->is_null())
      p.logprobs = number_field<int32_t>(body, "logprobs", 0, 0, 20);
  } else {
    // Range-checked with logprobs off too; alternatives without logprobs would be dropped.
    const int32_t top = number_field<int32_t>(body, "top_logprobs", 0, 0, 20);
    if (bool_field(body, "logprobs", false))
      p.logprobs = top;
    else if (top > 0)
      throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs");
  }
  return p;
}

// Checked on the text, before tokenizing: a tokenizer pass over a 60 MB prompt takes 24 s
// and 2.4 GB only to find it cannot fit (issue 26). 0 = no bound.
void check_prompt_bytes(const std::string& text, int64_t max_prompt_bytes, const char* param) {
  if (max_prompt_bytes > 0 && static_cast<int64_t>(text.size()) > max_prompt_bytes)
    throw ApiError(400,
                   "the prompt is " + std::to_string(text.size()) + " bytes; no text over " +
                       std::to_string(max_prompt_bytes) + " bytes fits this model's context",
                   param);
}

// The completions prompt into r.prompt (and r.more_prompts, r.echo): a string, a list of token
// ids, or (where limits.prompt_lists) a list of either, one engine request per element; a list
// holding one prompt is that prompt. How many there are is checked against kMaxChoices before
// the first is tokenized.
void parse_completion_prompts(const json& body, const Tokenizer& tokenizer,
                              const RequestLimits& limits, bool echo, ApiRequest& r) {
  // vLLM's extra field; true by default there and in transformers (a text prompt gets the
  // tokenizer's BOS). Token-id prompts are taken as they are.
  const bool add_special = bool_field(body, "add_special_tokens", true);
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw ApiError(400, "'prompt' is required", "prompt");
  const auto is_one_prompt = [](const json& p) {
    return p.is_string() || (p.is_array() && (p.empty() || p[0].is_number()));
  };
  bool first = true;
  const auto add = [&](const json& p) {
    std::vector<TokenId> ids;
    if (p.is_string()) {
      const std::string& text = p.get_ref<const std::string&>();
      check_prompt_bytes(text, limits.max_prompt_bytes, "prompt");
      check_utf8(text, "prompt");
      ids = tokenizer.encode(text);
      if (add_special) ids = tokenizer.add_special_tokens(std::move(ids));
      if (echo) r.echo.push_back(text);
    } else if (is_one_prompt(p)) {
      ids = token_list(p, "prompt");
      if (echo) r.echo.push_back(tokenizer.decode(ids));
    } else {
      throw ApiError(400,
                     "'prompt' must be a string, a list of token ids, or a list of either "
                     "(one prompt each)",
                     "prompt");
    }
    (first ? r.prompt : r.more_prompts.emplace_back()) = std::move(ids);
    first = false;
  };
  if (is_one_prompt(*it) || !it->is_array()) return add(*it);
  if (it->empty()) throw ApiError(400, "'prompt' is an empty list", "prompt");
  if (it->size() > 1 && !limits.prompt_lists)
    throw ApiError(400, "several prompts in one request are not supported here; send one each",
                   "prompt");
  if (static_cast<int64_t>(it->size()) * r.n > kMaxChoices)
    throw ApiError(400,
                   "'prompt' holds " + std::to_string(it->size()) + " prompts of " +
                       std::to_string(r.n) + " choices each; one request asks for at most " +
                       std::to_string(kMaxChoices) + " choices",
                   "prompt");
  for (const json& p : *it) add(p);
}

// echo repeats each prompt's text in each of its n choices (and a stream holds one copy per
// choice): bounded, so that a request cannot turn a body under the limit into a reply of
// gigabytes.
constexpr int64_t kMaxEchoBytes = int64_t{64} << 20;

void check_echo_bytes(const ApiRequest& r) {
  int64_t bytes = 0;
  for (const std::string& text : r.echo) bytes += static_cast<int64_t>(text.size()) * r.n;
  if (bytes > kMaxEchoBytes)
    throw ApiError(400,
                   "'echo' would repeat " + std::to_string(bytes) +
                       " bytes of prompt text in the choices; at most " +
                       std::to_string(kMaxEchoBytes) + " a request",
                   "echo");
}

// OpenAI's response_format: {"type": "text"}, {"type": "json_object"}, or {"type":
// "json_schema", "json_schema": {"name", "description", "schema", "strict"}}. Null for text.
std::shared_ptr<const TokenConstraint> parse_response_format(
    const json& body, GrammarCompiler* grammars, const std::function<bool()>& cancelled) {
  constexpr const char* kParam = "response_format";
  auto it = body.find(kParam);
  if (it == body.end() || it->is_null()) return nullptr;
  if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
    throw ApiError(400, "'response_format' must be an object with a string 'type'", kParam);
  const std::string type = (*it)["type"].get<std::string>();
  for (const auto& [key, value] : it->items())
    if (key != "type" && !(key == "json_schema" && type == "json_schema"))
      throw ApiError(400, "'response_format." + key + "' is not supported", kParam);
  if (type == "text") return nullptr;
  if (type != "json_object" && type != "json_schema")
    throw ApiError(
        400, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", kParam);
  if (!grammars) throw ApiError(400, "structured output is not available on this endpoint", kParam);
  try {
    if (type == "json_object") return grammars->json_object();
    auto js = it->find("json_schema");
    if (js == it->end() || !js->is_object())
      throw ApiError(400, "'response_format.json_schema' must be an object", kParam);
    json schema = json::object();  // OpenAI: an absent schema allows any JSON value
    for (const auto& [key, value] : js->items()) {
      if (key == "name" || key == "description") {
        if (!value.is_string())
          throw ApiError(400, "'response_format.json_schema." + key + "' must be a string", kParam);
      } else if (key == "strict") {
        // Honoured: the output always matches the schema, strict or not (grammar/json_schema.h).
        if (!value.is_boolean() && !value.is_null())
          throw ApiError(400, "'response_format.json_schema.strict' must be a boolean", kParam);
      } else if (key == "schema") {
        schema = value;
      } else {
        throw ApiError(400, "'response_format.json_schema." + key + "' is not supported", kParam);
      }
    }
    return grammars->json_schema(schema, cancelled);
  } catch (const Error& e) {
    throw ApiError(400, std::string("response_format: ") + e.what(), kParam);
  }
}

// vLLM's own spellings of a JSON format, as the response_format they mean (compiled to the
// same grammar): guided_json (a schema or its JSON text), structured_outputs {"json": schema}
// or {"json_object": true}. Null when the body has neither; `param` gets the field's name.
// What else structured_outputs can ask (choice, regex, grammar, ...) is refused by name.
json vllm_response_format(const json& body, std::string& param) {
  const auto schema_format = [](const json& schema, const std::string& at) {
    json parsed = schema;
    if (schema.is_string()) {
      const std::string& text = schema.get_ref<const std::string&>();
      if (json_nesting_depth(text) > kMaxClientJsonDepth)
        throw ApiError(400, "'" + at + "' nests too deep", at);
      parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) throw ApiError(400, "'" + at + "' is not valid JSON", at);
    }
    return json{{"type", "json_schema"}, {"json_schema", {{"schema", std::move(parsed)}}}};
  };
  json format = nullptr;
  if (auto it = body.find("guided_json"); it != body.end() && !it->is_null()) {
    param = "guided_json";
    format = schema_format(*it, param);
  }
  auto it = body.find("structured_outputs");
  if (it == body.end() || it->is_null()) return format;
  if (!it->is_object())
    throw ApiError(400, "'structured_outputs' must be an object", "structured_outputs");
  for (const auto& [key, value] : it->items()) {
    if (value.is_null() || value == false) continue;  // vLLM's defaults
    const std::string at = "structured_outputs." + key;
    if (key != "json" && key != "json_object")
      throw ApiError(400,
                     "'" + at + "' is not supported (structured_outputs.json and .json_object are)",
                     "structured_outputs");
    if (!format.is_null())
      throw ApiError(400, "'" + at + "' is a second output format; send one", "structured_outputs");
    if (key == "json_object" && value != true)
      throw ApiError(400, "'" + at + "' must be a boolean", "structured_outputs");
    param = "structured_outputs";
    format = key == "json" ? schema_format(value, at) : json{{"type", "json_object"}};
  }
  return format;
}

// Fields that would make a grammar-constrained output end where the grammar did not: refused.
void check_constrained_fields(const SamplingParams& p) {
  // The value may be complete (only EOS allowed) before min_tokens tokens are out.
  if (p.min_tokens > 0)
    throw ApiError(400,
                   "'min_tokens' cannot be combined with a response_format or a required tool "
                   "call (the value may be complete before min_tokens tokens)",
                   "min_tokens");
  // The stop string or token would follow the value in the output.
  if (p.include_stop_str_in_output)
    throw ApiError(400,
                   "'include_stop_str_in_output' cannot be combined with a response_format or a "
                   "required tool call (the stop text would follow the value)",
                   "include_stop_str_in_output");
}

}  // namespace

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
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "stop";
}

json stop_reason_json(const StopReason& reason) {
  if (const auto* text = std::get_if<std::string>(&reason)) return *text;
  if (const auto* token = std::get_if<TokenId>(&reason)) return *token;
  return nullptr;
}

int64_t max_prompt_bytes(const Tokenizer& tokenizer, int64_t max_sequence_tokens) {
  size_t longest = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    longest = std::max(longest, tokenizer.token_bytes(id).size());
  return std::max<int64_t>(0, max_sequence_tokens - 1) * static_cast<int64_t>(longest);
}

void check_context(const ApiRequest& request, const json& body, int64_t max_sequence_tokens) {
  for (size_t k = 1; k < request.prompt_count(); ++k) {
    ApiRequest one;  // the k-th prompt alone, with the sampling it shares
    one.endpoint = request.endpoint;
    one.params.max_tokens = request.params.max_tokens;
    one.prompt = request.prompt_at(k);
    check_context(one, body, max_sequence_tokens);
  }
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  const char* prompt_param = request.endpoint == Endpoint::kCompletions ? "prompt" : "messages";
  if (prompt >= max_sequence_tokens)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(max_sequence_tokens) +
                       " tokens. However, your prompt has " + std::to_string(prompt) + " tokens.",
                   prompt_param);
  const auto asked = [&](const char* key) { return body.contains(key) && !body[key].is_null(); };
  if ((asked("max_tokens") || asked("max_completion_tokens")) &&
      prompt + request.params.max_tokens > max_sequence_tokens)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(max_sequence_tokens) +
                       " tokens. However, you requested " +
                       std::to_string(prompt + request.params.max_tokens) + " tokens (" +
                       std::to_string(prompt) + " in the prompt, " +
                       std::to_string(request.params.max_tokens) +
                       " for the completion). Please reduce the prompt or max_tokens.",
                   "max_tokens");
}

ChatPrompt render_chat_prompt(const json& body, const ChatTemplate* chat_template,
                              std::string_view raw_body) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    throw ApiError(400, "'messages' must be a non-empty list", "messages");
  // Ordered, for the tool calls' arguments (prepare_tool_messages keeps the model's order).
  nlohmann::ordered_json messages = flatten_chat_messages(*it);
  const std::string* source = chat_template ? &chat_template->source() : nullptr;
  ChatPrompt out;
  out.tools = parse_tool_request(body, source);
  prepare_tool_messages(messages, source);
  if (!chat_template) throw ApiError(400, "this model has no chat template", "messages");
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (!out.tools.tools.is_null()) extra["tools"] = tools_in_client_order(out.tools, raw_body);
  const bool add_generation_prompt = bool_field(body, "add_generation_prompt", true);
  try {
    out.text = chat_template->render(messages, add_generation_prompt, extra);
  } catch (const Error& e) {
    throw ApiError(400, std::string("chat template: ") + e.what(), "messages");
  }
  return out;
}

ApiRequest parse_api_request(Endpoint endpoint, const json& body, const Tokenizer& tokenizer,
                             const ChatTemplate* chat_template, const RequestLimits& limits,
                             std::string_view raw_body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_request_fields(endpoint, body);
  ApiRequest r;
  r.endpoint = endpoint;
  std::optional<ToolRequest> chat_tools;  // compiled last, with response_format
  if (auto it = body.find("model"); it != body.end() && it->is_string())
    r.model = it->get<std::string>();
  r.params =
      parse_sampling(endpoint, body, tokenizer.vocab_size(),
                     limits.sampling_defaults ? *limits.sampling_defaults : SamplingDefaults{});
  r.n = number_field<int32_t>(body, "n", 1, 1, kMaxChoices);
  // best_of picks the n most likely of best_of samples; equal to n it is plain n.
  if (endpoint == Endpoint::kCompletions) {
    const int32_t best_of = number_field<int32_t>(body, "best_of", r.n, 1, kMaxChoices);
    if (best_of < r.n) throw ApiError(400, "'best_of' must be at least 'n'", "best_of");
    if (best_of > r.n)
      throw ApiError(400, "'best_of' greater than 'n' is not supported (best_of = n is)",
                     "best_of");
  }
  r.stream = bool_field(body, "stream", false);
  if (r.params.prompt_logprobs && r.stream)  // vLLM sends them in the first chunk: not built
    throw ApiError(400, "'prompt_logprobs' with 'stream': true is not supported",
                   "prompt_logprobs");
  r.tokens_as_ids = bool_field(body, "return_tokens_as_token_ids", false);
  for (auto [key, slot] : {std::pair{"ttft_slo", &r.ttft_slo}, std::pair{"tpot_slo", &r.tpot_slo}})
    if (body.contains(key) && !body[key].is_null())
      *slot = number_field<double>(body, key, 0.0, 1e-6, 3600.0);
  if (body.contains("adaptive_blocks") && !body["adaptive_blocks"].is_null())
    r.adaptive_blocks = bool_field(body, "adaptive_blocks", false);
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      throw ApiError(400, "'stream_options' must be an object", "stream_options");
    if (!r.stream)
      throw ApiError(400, "'stream_options' is only allowed with 'stream': true", "stream_options");
    for (const auto& [key, value] : it->items()) {
      // include_obfuscation pads chunks against side channels: nothing a client reads.
      const bool known =
          key == "include_usage" || key == "include_obfuscation" || key == "continuous_usage_stats";
      if (!known)
        throw ApiError(400,
                       "'stream_options." + key +
                           "' is not supported (include_usage and continuous_usage_stats are)",
                       "stream_options");
    }
    r.include_usage = bool_field(*it, "include_usage", false);
    // As vLLM: usage in every chunk only where usage is asked for at all.
    r.continuous_usage = bool_field(*it, "continuous_usage_stats", false) && r.include_usage;
  }

  if (endpoint == Endpoint::kCompletions) {
    const bool echo = bool_field(body, "echo", false);
    // vLLM's echo with logprobs starts the logprobs with the prompt's own: the prompt is scored
    // with as many alternatives (or prompt_logprobs' if more).
    if (echo && r.params.logprobs) {
      if (r.stream)
        throw ApiError(400, "'echo' with 'logprobs' and 'stream': true is not supported", "echo");
      r.echo_logprobs = true;
      r.params.prompt_logprobs = std::max(r.params.prompt_logprobs.value_or(0), *r.params.logprobs);
    }
    parse_completion_prompts(body, tokenizer, limits, echo, r);
    check_echo_bytes(r);
  } else {
    // vLLM's chat echo (the last message repeated when its role is the reply's) is not built.
    if (bool_field(body, "echo", false))
      throw ApiError(400, "'echo' is supported on /v1/completions only", "echo");
    ChatPrompt chat = render_chat_prompt(body, chat_template, raw_body);
    chat_tools = std::move(chat.tools);
    r.tool_format = chat_tools->format;
    r.max_tool_calls = chat_tools->max_calls();
    const std::string& text = chat.text;
    check_prompt_bytes(text, limits.max_prompt_bytes, "messages");
    // The rendered prompt already carries the template's special tokens (BOS included): false
    // by default, as in vLLM; asked for, a BOS the template wrote is still not doubled.
    r.prompt = tokenizer.encode(text, /*parse_special=*/true);
    if (bool_field(body, "add_special_tokens", false))
      r.prompt = tokenizer.add_special_tokens(std::move(r.prompt));
  }
  for (size_t k = 0; k < r.prompt_count(); ++k)
    if (r.prompt_at(k).empty()) throw ApiError(400, "the prompt is empty", "prompt");
  // Grammars last: compiling a large schema costs far more than every check above.
  if (limits.max_sequence_tokens > 0) check_context(r, body, limits.max_sequence_tokens);
  r.params.constraint = parse_response_format(body, limits.grammars, limits.cancelled);
  std::string format_param;
  if (const json format = vllm_response_format(body, format_param); !format.is_null()) {
    if (body.contains("response_format") && !body["response_format"].is_null())
      throw ApiError(
          400, "'" + format_param + "' and 'response_format' both give an output format; send one",
          format_param);
    try {
      r.params.constraint = parse_response_format(json{{"response_format", format}},
                                                  limits.grammars, limits.cancelled);
    } catch (const ApiError& e) {
      throw ApiError(e.status(), format_param + " (as response_format): " + e.what(), format_param);
    }
  }
  if (chat_tools) {
    if (chat_tools->parses_output() && r.params.constraint)
      throw ApiError(400,
                     "'response_format' cannot be combined with 'tools' unless 'tool_choice' is "
                     "\"none\" (the output cannot be both a tool call and the format's JSON)",
                     "response_format");
    if (auto constraint = tool_call_constraint(*chat_tools, limits.grammars, limits.cancelled))
      r.params.constraint = std::move(constraint);
  }
  if (r.params.constraint) check_constrained_fields(r.params);
  return r;
}

json make_usage(std::span<const GenerationResult> results, int32_t n) {
  // Each prompt is one (its n samples share it, and its prefill), counted once, by its first
  // sample; the cached part is what that sample found in the prefix cache.
  int64_t prompt = 0, cached = 0, completion = 0;
  for (const GenerationResult& r : results) {
    if (r.index % std::max(n, 1) == 0) {
      prompt += r.prompt_tokens;
      cached += r.cached_tokens;
    }
    completion += static_cast<int64_t>(r.tokens.size());
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json make_response(const ApiRequest& request, std::span<const GenerationResult> results,
                   const std::string& response_id, const std::string& model, int64_t created,
                   const Tokenizer& tokenizer) {
  const bool chat = request.endpoint == Endpoint::kChatCompletions;
  // Choices in index order, however the samples finished.
  std::vector<const GenerationResult*> ordered;
  for (const GenerationResult& result : results) ordered.push_back(&result);
  std::stable_sort(
      ordered.begin(), ordered.end(),
      [](const GenerationResult* a, const GenerationResult* b) { return a->index < b->index; });
  json choices = json::array();
  for (const GenerationResult* sample : ordered) {
    const GenerationResult& result = *sample;
    const auto prompt = static_cast<size_t>(result.index / std::max(request.n, 1));
    const std::string* echo = prompt < request.echo.size() ? &request.echo[prompt] : nullptr;
    json logprobs = nullptr;
    if (request.params.logprobs && chat)
      logprobs = chat_logprobs(result.logprobs, tokenizer, request.tokens_as_ids);
    else if (request.echo_logprobs && echo)
      logprobs =
          echo_completion_logprobs(result.prompt_logprobs, *request.params.logprobs,
                                   result.logprobs, tokenizer, echo->size(), request.tokens_as_ids);
    else if (request.params.logprobs)
      logprobs = completion_logprobs(result.logprobs, tokenizer, 0, nullptr, request.tokens_as_ids);
    json choice = {{"index", result.index},
                   {"logprobs", logprobs},
                   {"finish_reason", finish_reason_name(result.finish)},
                   {"stop_reason", stop_reason_json(result.stop_reason)}};
    if (chat && request.tool_format) {
      const ToolCallOutput out =
          parse_tool_calls(*request.tool_format, result.text, request.max_tool_calls);
      // OpenAI: content is null in a reply that is only calls.
      json message = {{"role", "assistant"},
                      {"content", out.calls.empty() || !out.content.empty() ? json(out.content)
                                                                            : json(nullptr)}};
      if (!out.calls.empty()) {
        message["tool_calls"] = tool_calls_json(out.calls);
        if (result.finish == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
      }
      choice["message"] = std::move(message);
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", result.text}};
    } else {
      choice["text"] = echo ? *echo + result.text : result.text;
      if (request.params.prompt_logprobs)  // vLLM: in each completions choice
        choice["prompt_logprobs"] =
            prompt_logprobs_json(result.prompt_logprobs, tokenizer, request.tokens_as_ids);
    }
    choices.push_back(std::move(choice));
  }
  json response = {{"id", response_id},
                   {"object", chat ? "chat.completion" : "text_completion"},
                   {"created", created},
                   {"model", model},
                   {"choices", std::move(choices)},
                   {"usage", make_usage(results, request.n)}};
  // vLLM: chat's beside the choices, of its one prompt.
  if (chat && request.params.prompt_logprobs)
    response["prompt_logprobs"] =
        ordered.empty()
            ? json(nullptr)
            : prompt_logprobs_json(ordered[0]->prompt_logprobs, tokenizer, request.tokens_as_ids);
  return response;
}

std::optional<ModelId> find_served_model(std::span<const ServedModel> models,
                                         std::string_view name) {
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i].name == name || std::find(models[i].aliases.begin(), models[i].aliases.end(),
                                            name) != models[i].aliases.end())
      return static_cast<ModelId>(i);
  return std::nullopt;
}

std::vector<std::unique_ptr<GrammarCompiler>> attach_model_text(std::span<ServedModel> served,
                                                                std::span<const ModelText> text,
                                                                int64_t max_sequence_tokens) {
  if (served.size() != text.size()) throw Error("attach_model_text: one text per served model");
  std::vector<std::unique_ptr<GrammarCompiler>> compilers;
  for (size_t m = 0; m < served.size(); ++m) {
    const ModelText& t = text[m];
    const auto owner = static_cast<size_t>(t.owner);
    if (owner > m || !t.tokenizer) throw Error("attach_model_text: a model's text is incomplete");
    served[m].tokenizer = t.tokenizer;
    if (owner == m) {  // its own tokenizer: a compiler, and one walk of its vocabulary
      compilers.push_back(std::make_unique<GrammarCompiler>(
          *t.tokenizer, static_cast<int32_t>(t.vocab_size), t.eos_token_ids));
      served[m].grammars = compilers.back().get();
      served[m].max_prompt_bytes = max_prompt_bytes(*t.tokenizer, max_sequence_tokens);
    } else {  // its owner's
      served[m].grammars = served[owner].grammars;
      served[m].max_prompt_bytes = served[owner].max_prompt_bytes;
    }
  }
  return compilers;
}

ModelId resolve_model(const nlohmann::json& body, std::span<const ServedModel> models,
                      bool any_name) {
  if (!body.is_object()) return 0;
  const auto m = body.find("model");
  if (m == body.end() || !m->is_string()) return 0;
  if (any_name && models.size() == 1) return 0;
  const std::string& name = m->get_ref<const std::string&>();
  if (const auto model = find_served_model(models, name)) return *model;
  throw ApiError(404, "The model '" + name + "' does not exist.", "model", "invalid_request_error",
                 "model_not_found");
}

}  // namespace blend
