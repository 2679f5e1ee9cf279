#include "api/responses.h"

#include <string>
#include <utility>

#include "api/batch_file.h"
#include "api/json_limits.h"

namespace blend {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// --- the request's fields ---------------------------------------------------------------------

enum class Kind {
  kTranslated,  // becomes a chat field (parse_responses_request), checked by the chat parser
  kHarmless,    // cannot change the output: checked and echoed, or ignored
  kRefused,     // would change the result and is not implemented: 400 unless `accepts`
};

bool any_value(const json&) {
  return true;
}
bool null_only(const json& v) {
  return v.is_null();
}
bool null_or_false(const json& v) {
  return v.is_null() || v == false;
}
bool null_or_zero(const json& v) {
  return v.is_null() || (v.is_number() && v == 0);
}
bool null_or_empty(const json& v) {
  return v.is_null() || ((v.is_array() || v.is_object()) && v.empty());
}
bool null_or_string(const json& v) {
  return v.is_null() || v.is_string();
}
// {"effort": null, "summary": null} asks for nothing (clients send the shape with its defaults).
bool no_reasoning(const json& v) {
  if (v.is_null()) return true;
  if (!v.is_object()) return false;
  for (const auto& [key, value] : v.items())
    if (!value.is_null()) return false;
  return true;
}
bool no_truncation(const json& v) {
  return v.is_null() || v == "disabled";
}
// OpenAI's bound, 16 pairs of 64 / 512 characters: the object is echoed in every answer.
bool metadata_value(const json& v) {
  if (v.is_null()) return true;
  if (!v.is_object() || v.size() > 16) return false;
  for (const auto& [key, value] : v.items())
    if (key.size() > 64 || !value.is_string() || value.get_ref<const std::string&>().size() > 512)
      return false;
  return true;
}

struct Field {
  const char* name;
  Kind kind;
  bool (*accepts)(const json&);  // kRefused: the values that change nothing; else the valid ones
  const char* refusal;
};

// clang-format off
constexpr Field kFields[] = {
    {"model", Kind::kTranslated, null_or_string, nullptr},
    {"input", Kind::kTranslated, any_value, nullptr},
    {"instructions", Kind::kTranslated, null_or_string, nullptr},
    {"max_output_tokens", Kind::kTranslated, any_value, nullptr},
    {"temperature", Kind::kTranslated, any_value, nullptr},
    {"top_p", Kind::kTranslated, any_value, nullptr},
    {"tools", Kind::kTranslated, any_value, nullptr},
    {"tool_choice", Kind::kTranslated, any_value, nullptr},
    {"parallel_tool_calls", Kind::kTranslated, any_value, nullptr},
    {"text", Kind::kTranslated, any_value, nullptr},
    {"stream", Kind::kTranslated, any_value, nullptr},
    {"stream_options", Kind::kTranslated, any_value, nullptr},
    {"service_tier", Kind::kTranslated, any_value, nullptr},
    // Chat's fields that vLLM's Responses endpoint takes too (sampling extensions).
    {"seed", Kind::kTranslated, any_value, nullptr},
    {"top_k", Kind::kTranslated, any_value, nullptr},
    {"min_p", Kind::kTranslated, any_value, nullptr},
    {"repetition_penalty", Kind::kTranslated, any_value, nullptr},
    {"ignore_eos", Kind::kTranslated, any_value, nullptr},
    {"metadata", Kind::kHarmless, metadata_value, nullptr},
    {"user", Kind::kHarmless, null_or_string, nullptr},
    {"safety_identifier", Kind::kHarmless, null_or_string, nullptr},
    // The prefix cache is automatic; the key only routes requests at OpenAI.
    {"prompt_cache_key", Kind::kHarmless, null_or_string, nullptr},
    {"store", Kind::kRefused, null_or_false,
     "responses are not stored (no retrieval, no previous_response_id): send 'store': false or "
     "leave it out"},
    {"previous_response_id", Kind::kRefused, null_only,
     "'previous_response_id' is not supported (responses are not stored): send the "
     "conversation in 'input'"},
    {"conversation", Kind::kRefused, null_only,
     "'conversation' is not supported (conversations are not stored): send them in 'input'"},
    {"background", Kind::kRefused, null_or_false, "'background' responses are not supported"},
    {"reasoning", Kind::kRefused, no_reasoning, "'reasoning' is not supported"},
    {"include", Kind::kRefused, null_or_empty, "'include' is not supported"},
    {"truncation", Kind::kRefused, no_truncation,
     "'truncation' other than \"disabled\" is not supported (a prompt past the context is "
     "refused)"},
    {"top_logprobs", Kind::kRefused, null_or_zero, "'top_logprobs' is not supported here"},
    {"max_tool_calls", Kind::kRefused, null_only, "'max_tool_calls' is not supported"},
    {"prompt", Kind::kRefused, null_only, "prompt templates ('prompt') are not supported"},
};
// clang-format on

void check_fields(const json& body) {
  for (const auto& [name, value] : body.items()) {
    const Field* field = nullptr;
    for (const Field& f : kFields)
      if (name == f.name) field = &f;
    if (!field)
      throw ApiError(400, "Unrecognized request argument supplied: '" + name + "' (/v1/responses)",
                     name);
    if (field->accepts(value)) continue;
    if (field->kind == Kind::kRefused) throw ApiError(400, field->refusal, name);
    throw ApiError(400, "'" + name + "' has an invalid value " + value.dump().substr(0, 80), name);
  }
}

const std::string& string_member(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string())
    throw ApiError(400, "'" + where + "." + key + "' must be a string", where + "." + key);
  return it->get_ref<const std::string&>();
}

std::string type_of(const json& object, const std::string& where) {
  if (!object.is_object()) throw ApiError(400, "'" + where + "' must be an object", where);
  auto it = object.find("type");
  if (it == object.end()) return "";
  if (!it->is_string()) throw ApiError(400, "'" + where + ".type' must be a string", where);
  return it->get<std::string>();
}

// --- input -> messages ------------------------------------------------------------------------

// A message's content: a string, or parts of text (input_text; output_text in assistant turns
// sent back) as chat text parts. Images, files and audio are refused by name.
json message_content(const json& content, const std::string& where) {
  if (content.is_string()) return content;
  if (!content.is_array())
    throw ApiError(400, "'" + where + "' must be a string or a list of content parts", where);
  json parts = json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string at = where + "[" + std::to_string(j) + "]";
    const std::string type = type_of(content[j], at);
    if (type != "input_text" && type != "output_text")
      throw ApiError(400,
                     "'" + at + "' is a '" + type +
                         "' content part; this model reads text only (input_text, output_text)",
                     at + ".type");
    parts.push_back({{"type", "text"}, {"text", string_member(content[j], "text", at)}});
  }
  return parts;
}

json message_item(const json& item, const std::string& where) {
  const std::string& role = string_member(item, "role", where);
  if (role != "user" && role != "system" && role != "developer" && role != "assistant")
    throw ApiError(400,
                   "'" + where +
                       ".role' must be \"user\", \"system\", \"developer\" or "
                       "\"assistant\"",
                   where + ".role");
  auto content = item.find("content");
  if (content == item.end())
    throw ApiError(400, "'" + where + ".content' is required", where + ".content");
  // developer messages are the system's (OpenAI's name for it since o1); templates know system.
  return {{"role", role == "developer" ? "system" : role},
          {"content", message_content(*content, where + ".content")}};
}

// function_call_output.output: the tool's result as text.
json call_output(const json& item, const std::string& where) {
  auto it = item.find("output");
  if (it != item.end() && it->is_array()) return message_content(*it, where + ".output");
  return string_member(item, "output", where);
}

void add_input_item(json& messages, const json& item, const std::string& where) {
  const std::string type = type_of(item, where);
  if (type.empty() || type == "message") return messages.push_back(message_item(item, where));
  if (type == "function_call") {
    json call = {{"id", string_member(item, "call_id", where)},
                 {"type", "function"},
                 {"function",
                  {{"name", string_member(item, "name", where)},
                   {"arguments", string_member(item, "arguments", where)}}}};
    // Calls of one turn (and the text before them) are one assistant message with tool_calls.
    if (messages.empty() || messages.back()["role"] != "assistant")
      messages.push_back({{"role", "assistant"}, {"content", nullptr}});
    messages.back()["tool_calls"].push_back(std::move(call));
    return;
  }
  if (type == "function_call_output")
    return messages.push_back({{"role", "tool"},
                               {"tool_call_id", string_member(item, "call_id", where)},
                               {"content", call_output(item, where)}});
  throw ApiError(400,
                 "'" + where + "' is a '" + type +
                     "' item; blend reads message, function_call and function_call_output items",
                 where + ".type");
}

json input_messages(const json& body) {
  json messages = json::array();
  if (auto it = body.find("instructions"); it != body.end() && it->is_string())
    messages.push_back({{"role", "system"}, {"content", *it}});
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) throw ApiError(400, "'input' is required", "input");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i)
      add_input_item(messages, (*input)[i], "input[" + std::to_string(i) + "]");
  } else {
    throw ApiError(400, "'input' must be a string or a non-empty list of items", "input");
  }
  return messages;
}

// --- tools, tool_choice, text.format ----------------------------------------------------------

// Responses' flat function tools ({"type": "function", "name", "description", "parameters",
// "strict"}) as chat's ({"type": "function", "function": {...}}), keys in the order given.
ojson chat_tools(const ojson& tools) {
  if (!tools.is_array()) throw ApiError(400, "'tools' must be a list", "tools");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const std::string type = type_of(json(tools[i]), at);
    if (type != "function")
      throw ApiError(400,
                     "'" + at + "' is a '" + type +
                         "' tool; only function tools are supported (built-in tools are not)",
                     at + ".type");
    ojson function = ojson::object();
    for (const auto& [key, value] : tools[i].items())
      if (key != "type") function[key] = value;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

json chat_tool_choice(const json& choice) {
  if (!choice.is_object()) return choice;  // "none", "auto", "required" (checked by chat)
  const std::string type = type_of(choice, "tool_choice");
  if (type != "function")
    throw ApiError(400,
                   "'tool_choice' of type '" + type +
                       "' is not supported (\"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"name\": ...} are)",
                   "tool_choice");
  for (const auto& [key, value] : choice.items())
    if (key != "type" && key != "name")
      throw ApiError(400, "'tool_choice." + key + "' is not supported", "tool_choice");
  return {{"type", "function"},
          {"function", {{"name", string_member(choice, "name", "tool_choice")}}}};
}

// text.format as chat's response_format; null for plain text.
json chat_response_format(const json& text) {
  if (text.is_null()) return nullptr;
  if (!text.is_object()) throw ApiError(400, "'text' must be an object", "text");
  for (const auto& [key, value] : text.items()) {
    if (key == "verbosity" && !value.is_null())
      throw ApiError(400, "'text.verbosity' is not supported", "text.verbosity");
    if (key != "format" && key != "verbosity")
      throw ApiError(400, "'text." + key + "' is not supported", "text." + key);
  }
  auto format = text.find("format");
  if (format == text.end() || format->is_null()) return nullptr;
  const std::string type = type_of(*format, "text.format");
  if (type == "text" || type == "json_object") return {{"type", type}};
  if (type != "json_schema")
    throw ApiError(400, "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                   "text.format");
  json schema = json::object();
  for (const auto& [key, value] : format->items())
    if (key != "type") schema[key] = value;
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

// The fields the response object repeats, with OpenAI's defaults.
json echoed_fields(const json& body) {
  const auto value = [&](const char* key, json fallback) {
    auto it = body.find(key);
    return it == body.end() || it->is_null() ? fallback : *it;
  };
  return {{"instructions", value("instructions", nullptr)},
          {"max_output_tokens", value("max_output_tokens", nullptr)},
          {"metadata", value("metadata", json::object())},
          {"parallel_tool_calls", value("parallel_tool_calls", true)},
          {"temperature", value("temperature", nullptr)},
          {"tool_choice", value("tool_choice", "auto")},
          {"tools", value("tools", json::array())},
          {"top_p", value("top_p", nullptr)},
          {"text", value("text", {{"format", {{"type", "text"}}}})},
          {"truncation", "disabled"},
          {"store", false},
          {"background", false},
          {"previous_response_id", nullptr},
          {"reasoning", nullptr},
          {"service_tier", value("service_tier", "auto")},
          {"user", value("user", nullptr)}};
}

json message_output(const std::string& id, const std::string& text, const std::string& status) {
  return {{"id", id},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({{{"type", "output_text"},
                                    {"text", text},
                                    {"annotations", json::array()},
                                    {"logprobs", json::array()}}})}};
}

json function_call_output(const std::string& id, const json& chat_call, const std::string& status) {
  return {{"id", id},
          {"type", "function_call"},
          {"status", status},
          {"call_id", chat_call["id"]},
          {"name", chat_call["function"]["name"]},
          {"arguments", chat_call["function"]["arguments"]}};
}

std::string status_of(const std::string& chat_finish_reason) {
  return chat_finish_reason == "length" ? "incomplete" : "completed";
}

}  // namespace

ResponsesRequest parse_responses_request(const json& body, std::string_view raw_body) {
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_fields(body);
  ResponsesRequest r;
  r.echo = echoed_fields(body);
  ojson chat = ojson::object();
  for (const char* key :
       {"model", "temperature", "top_p", "seed", "top_k", "min_p", "repetition_penalty",
        "ignore_eos", "service_tier", "parallel_tool_calls", "stream"})
    if (auto it = body.find(key); it != body.end()) chat[key] = *it;
  // Its type is the chat parser's to check (a 400 naming "stream").
  r.stream = body.contains("stream") && body["stream"] == true;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!r.stream)
      throw ApiError(400, "'stream_options' is only allowed with 'stream': true", "stream_options");
    // include_obfuscation pads events against side channels: nothing a client reads.
    if (!it->is_object() || it->size() > (it->contains("include_obfuscation") ? 1u : 0u))
      throw ApiError(400, "'stream_options' may only hold include_obfuscation", "stream_options");
  }
  if (auto it = body.find("max_output_tokens"); it != body.end())
    chat["max_completion_tokens"] = *it;
  chat["messages"] = input_messages(body);
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    ojson tools = *it;  // sorted keys; the client's order below when the text is at hand
    if (!raw_body.empty() && json_nesting_depth(raw_body) <= kMaxClientJsonDepth) {
      const ojson ordered = ojson::parse(raw_body, nullptr, /*allow_exceptions=*/false);
      if (ordered.is_object() && ordered.contains("tools") && json(ordered["tools"]) == *it)
        tools = ordered["tools"];
    }
    chat["tools"] = chat_tools(tools);
    r.chat_raw_body = ojson{{"tools", chat["tools"]}}.dump();
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null())
    chat["tool_choice"] = chat_tool_choice(*it);
  if (const json format = chat_response_format(body.value("text", json())); !format.is_null())
    chat["response_format"] = format;
  r.chat_body = json(chat);
  return r;
}

ApiError responses_error(const ApiError& e) {
  std::string param = e.param();
  const auto starts = [&](std::string_view prefix) { return param.rfind(prefix, 0) == 0; };
  if (starts("messages") || param == "prompt") {
    param = "input";
  } else if (param == "max_tokens" || param == "max_completion_tokens") {
    param = "max_output_tokens";
  } else if (param == "response_format") {
    param = "text.format";
  } else if (starts("tools[")) {
    if (const size_t at = param.find("].function"); at != std::string::npos)
      param.erase(at + 1, std::string_view(".function").size());
  }
  return ApiError(e.status(), e.what(), param, e.type(), e.code());
}

json responses_usage(const json& chat_usage) {
  if (chat_usage.is_null()) return nullptr;
  return {{"input_tokens", chat_usage["prompt_tokens"]},
          {"input_tokens_details",
           {{"cached_tokens", chat_usage["prompt_tokens_details"]["cached_tokens"]}}},
          {"output_tokens", chat_usage["completion_tokens"]},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", chat_usage["total_tokens"]}};
}

json make_responses_object(const ResponsesRequest& request, const std::string& id,
                           const std::string& model, int64_t created_at, const std::string& status,
                           json output, json usage) {
  json r = {{"id", id},
            {"object", "response"},
            {"created_at", created_at},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"model", model},
            {"output", std::move(output)},
            {"usage", std::move(usage)}};
  if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r.update(request.echo);
  return r;
}

json responses_from_chat(const ResponsesRequest& request, const json& chat_completion,
                         const std::string& id, int64_t created_at) {
  const json& choice = chat_completion["choices"][0];
  const json& message = choice["message"];
  const std::string status = status_of(choice["finish_reason"].get<std::string>());
  json output = json::array();
  const bool calls = message.contains("tool_calls");
  if (message["content"].is_string() && (!calls || !message["content"].empty()))
    output.push_back(message_output(make_id("msg_"), message["content"], status));
  if (calls)
    for (const json& call : message["tool_calls"])
      output.push_back(function_call_output(make_id("fc_"), call, "completed"));
  return make_responses_object(request, id, chat_completion["model"], created_at, status,
                               std::move(output), responses_usage(chat_completion["usage"]));
}

// --- streaming --------------------------------------------------------------------------------

ResponsesEvents::ResponsesEvents(const ResponsesRequest& request, std::string id, std::string model,
                                 int64_t created_at)
    : request_(request), id_(std::move(id)), model_(std::move(model)), created_at_(created_at) {}

json ResponsesEvents::response(const std::string& status, json usage) const {
  return make_responses_object(request_, id_, model_, created_at_, status, output_,
                               std::move(usage));
}

std::string ResponsesEvents::event(json e) {
  e["sequence_number"] = sequence_++;
  return "event: " + e["type"].get<std::string>() +
         "\ndata: " + e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string ResponsesEvents::start() {
  std::string out =
      event({{"type", "response.created"}, {"response", response("in_progress", nullptr)}});
  out += event({{"type", "response.in_progress"}, {"response", response("in_progress", nullptr)}});
  return out;
}

std::string ResponsesEvents::open_message() {
  message_ = message_output(make_id("msg_"), "", "in_progress");
  json added = *message_;
  added["content"] = json::array();
  const json& part = (*message_)["content"][0];
  const size_t index = output_.size();
  // One statement per event: the sequence numbers follow the order they are sent in.
  std::string out =
      event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", added}});
  out += event({{"type", "response.content_part.added"},
                {"item_id", (*message_)["id"]},
                {"output_index", index},
                {"content_index", 0},
                {"part", part}});
  return out;
}

std::string ResponsesEvents::close_message(const std::string& status) {
  json item = std::move(*message_);
  message_.reset();
  item["status"] = status;
  item["content"][0]["text"] = text_;
  text_.clear();
  const json& part = item["content"][0];
  const size_t index = output_.size();
  std::string out = event({{"type", "response.output_text.done"},
                           {"item_id", item["id"]},
                           {"output_index", index},
                           {"content_index", 0},
                           {"text", part["text"]},
                           {"logprobs", json::array()}});
  out += event({{"type", "response.content_part.done"},
                {"item_id", item["id"]},
                {"output_index", index},
                {"content_index", 0},
                {"part", part}});
  out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  return out;
}

std::string ResponsesEvents::function_call(const json& call) {
  json item = function_call_output(make_id("fc_"), call, "in_progress");
  const size_t index = output_.size();
  json added = item;
  added["arguments"] = "";
  std::string out =
      event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", added}});
  out += event({{"type", "response.function_call_arguments.delta"},
                {"item_id", item["id"]},
                {"output_index", index},
                {"delta", item["arguments"]}});
  out += event({{"type", "response.function_call_arguments.done"},
                {"item_id", item["id"]},
                {"output_index", index},
                {"name", item["name"]},
                {"arguments", item["arguments"]}});
  item["status"] = "completed";
  out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  return out;
}

std::string ResponsesEvents::chat_chunk(const json& chunk) {
  if (chunk.is_null()) return "";
  std::string out;
  for (const json& choice : chunk["choices"]) {
    const json& delta = choice["delta"];
    if (auto content = delta.find("content"); content != delta.end() && content->is_string() &&
                                              !content->get_ref<const std::string&>().empty()) {
      if (!message_) out += open_message();
      text_ += content->get_ref<const std::string&>();
      out += event({{"type", "response.output_text.delta"},
                    {"item_id", (*message_)["id"]},
                    {"output_index", output_.size()},
                    {"content_index", 0},
                    {"delta", *content},
                    {"logprobs", json::array()}});
    }
    if (auto calls = delta.find("tool_calls"); calls != delta.end())
      for (const json& call : *calls) {
        if (message_) out += close_message("completed");
        out += function_call(call);
      }
  }
  return out;
}

std::string ResponsesEvents::finish(FinishReason finish, const json& chat_usage) {
  const std::string status = finish == FinishReason::kLength ? "incomplete" : "completed";
  std::string out;
  // As the non-streamed answer: a reply with neither text nor calls is one empty message.
  if (!message_ && output_.empty()) out += open_message();
  if (message_) out += close_message(status);
  return out + event({{"type", "response.completed"},
                      {"response", response(status, responses_usage(chat_usage))}});
}

std::string ResponsesEvents::error(const json& error_body) {
  const json& e = error_body.contains("error") ? error_body["error"] : error_body;
  return event({{"type", "error"},
                {"code", e.value("code", json())},
                {"message", e.value("message", "")},
                {"param", e.value("param", json())}});
}

}  // namespace blend
