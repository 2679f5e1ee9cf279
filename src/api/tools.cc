#include "api/tools.h"

#include <algorithm>
#include <random>
#include <set>

#include "api/api_error.h"
#include "api/json_limits.h"
#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar/tool_call_grammar.h"

namespace blend {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// OpenAI's limits: at most 128 tools; names of letters, digits, '_' and '-', up to 64.
constexpr size_t kMaxTools = 128;
constexpr size_t kMaxNameLength = 64;

bool valid_name(const std::string& name) {
  return !name.empty() && name.size() <= kMaxNameLength &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-';
         });
}

// One tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}. Returns the function's name.
std::string check_tool(const json& tool, const std::string& at) {
  if (!tool.is_object()) throw ApiError(400, "'" + at + "' must be an object", at);
  for (const auto& [key, value] : tool.items())
    if (key != "type" && key != "function")
      throw ApiError(400, "'" + at + "." + key + "' is not supported", at + "." + key);
  auto type = tool.find("type");
  if (type == tool.end() || *type != "function")
    throw ApiError(400, "'" + at + ".type' must be \"function\" (the only tool type)",
                   at + ".type");
  auto fn = tool.find("function");
  if (fn == tool.end() || !fn->is_object())
    throw ApiError(400, "'" + at + ".function' must be an object", at + ".function");
  const std::string f = at + ".function";
  for (const auto& [key, value] : fn->items()) {
    const std::string param = f + "." + key;
    if (key == "name") {
      if (!value.is_string() || !valid_name(value.get<std::string>()))
        throw ApiError(
            400, "'" + param + "' must be 1 to 64 letters, digits, underscores or dashes", param);
    } else if (key == "description") {
      if (!value.is_string() && !value.is_null())
        throw ApiError(400, "'" + param + "' must be a string", param);
    } else if (key == "parameters") {
      // Both call formats write the arguments as a JSON object.
      if (!value.is_object() && !value.is_null())
        throw ApiError(400, "'" + param + "' must be a JSON schema object", param);
      if (value.is_object() && value.contains("type") && value["type"] != "object")
        throw ApiError(400, "'" + param + ".type' must be \"object\" (arguments are an object)",
                       param);
    } else if (key == "strict") {
      // Honoured when the output is constrained (the arguments always match the schema); with
      // "auto" nothing is constrained, as in vLLM.
      if (!value.is_boolean() && !value.is_null())
        throw ApiError(400, "'" + param + "' must be a boolean", param);
    } else {
      throw ApiError(400, "'" + param + "' is not supported", param);
    }
  }
  if (!fn->contains("name")) throw ApiError(400, "'" + f + ".name' is required", f + ".name");
  return (*fn)["name"].get<std::string>();
}

void parse_tool_choice(const json& body, ToolRequest& r, const std::set<std::string>& names) {
  constexpr const char* kParam = "tool_choice";
  auto it = body.find(kParam);
  const bool has_tools = !names.empty();
  r.choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  if (it == body.end() || it->is_null()) return;
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "none") {
      r.choice = ToolChoice::kNone;
    } else if (s == "auto") {
      r.choice = ToolChoice::kAuto;
    } else if (s == "required") {
      r.choice = ToolChoice::kRequired;
    } else {
      throw ApiError(400, "'tool_choice' must be \"none\", \"auto\", \"required\" or a function",
                     kParam);
    }
  } else if (it->is_object()) {
    auto fn = it->find("function");
    if (it->value("type", json()) != "function" || fn == it->end() || !fn->is_object() ||
        !fn->contains("name") || !(*fn)["name"].is_string())
      throw ApiError(400,
                     "'tool_choice' as an object must be {\"type\": \"function\", \"function\": "
                     "{\"name\": ...}}",
                     kParam);
    r.choice = ToolChoice::kNamed;
    r.function = (*fn)["name"].get<std::string>();
    if (has_tools && !names.count(r.function))
      throw ApiError(400, "'tool_choice' names '" + r.function + "', which is not in 'tools'",
                     kParam);
  } else {
    throw ApiError(400, "'tool_choice' must be a string or an object", kParam);
  }
  if (!has_tools && r.choice != ToolChoice::kNone)
    throw ApiError(400, "'tool_choice' other than \"none\" needs 'tools' (as in OpenAI and vLLM)",
                   kParam);
}

}  // namespace

ToolRequest parse_tool_request(const json& body, const std::string* template_source) {
  ToolRequest r;
  std::set<std::string> names;
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) throw ApiError(400, "'tools' must be a list", "tools");
    if (it->size() > kMaxTools)
      throw ApiError(400, "'tools' holds more than " + std::to_string(kMaxTools) + " tools",
                     "tools");
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string at = "tools[" + std::to_string(i) + "]";
      const std::string name = check_tool((*it)[i], at);
      if (!names.insert(name).second)
        throw ApiError(400, "two tools are named '" + name + "'", at + ".function.name");
    }
    if (!it->empty()) r.tools = *it;
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      throw ApiError(400, "'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    r.parallel = it->get<bool>();
  }
  parse_tool_choice(body, r, names);
  if (r.tools.is_null()) return r;
  if (!template_source) throw ApiError(400, "this model has no chat template", "tools");
  if (!template_takes_tools(*template_source))
    throw ApiError(400,
                   "this model's chat template does not take tools (they would be left out of "
                   "the prompt); start the server with a --chat-template that does",
                   "tools");
  if (r.choice == ToolChoice::kNone) return r;  // rendered, never parsed: no format needed
  r.format = detect_tool_call_format(*template_source);
  if (!r.format)
    throw ApiError(400,
                   "this model's chat template asks for tool calls in a format blend cannot read "
                   "(supported: Hermes/Qwen <tool_call> and Llama 3.x JSON)",
                   "tools");
  return r;
}

void prepare_tool_messages(ojson& messages, const std::string* template_source) {
  const bool renders_calls = template_source && detect_tool_call_format(*template_source);
  for (size_t i = 0; i < messages.size(); ++i) {
    ojson& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    const bool is_tool = m["role"] == "tool";
    auto calls = m.find("tool_calls");
    const bool has_calls = calls != m.end() && !calls->is_null();
    if (!is_tool && !has_calls) continue;
    if (!renders_calls)
      throw ApiError(400,
                     "'" + at + "' holds a tool " + (is_tool ? "result" : "call") +
                         ", which this model's chat template cannot render",
                     at);
    if (is_tool) {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string())
        throw ApiError(400, "'" + at + ".tool_call_id' must be a string", at + ".tool_call_id");
      continue;
    }
    if (!calls->is_array())
      throw ApiError(400, "'" + at + ".tool_calls' must be a list", at + ".tool_calls");
    if (calls->empty()) {
      m.erase("tool_calls");  // as absent: templates test for the key
      continue;
    }
    for (size_t j = 0; j < calls->size(); ++j) {
      ojson& c = (*calls)[j];
      const std::string cat = at + ".tool_calls[" + std::to_string(j) + "]";
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
        throw ApiError(400, "'" + cat + ".function' must be an object", cat + ".function");
      if (c.contains("type") && c["type"] != "function")
        throw ApiError(400, "'" + cat + ".type' must be \"function\"", cat + ".type");
      ojson& fn = c["function"];
      if (!fn.contains("name") || !fn["name"].is_string())
        throw ApiError(400, "'" + cat + ".function.name' must be a string", cat + ".function.name");
      const std::string param = cat + ".function.arguments";
      auto args = fn.find("arguments");
      if (args == fn.end() || !args->is_string())
        throw ApiError(400, "'" + param + "' must be a string of JSON", param);
      // Parsed keeping the key order, so the template prints the call as the model wrote it.
      const std::string& text = args->get_ref<const std::string&>();
      if (json_nesting_depth(text) > kMaxClientJsonDepth)
        throw ApiError(400, "'" + param + "' nests too deep", param);
      ojson parsed = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) throw ApiError(400, "'" + param + "' is not valid JSON", param);
      if (!parsed.is_object())
        throw ApiError(400, "'" + param + "' must hold a JSON object", param);
      *args = std::move(parsed);
    }
  }
}

ojson tools_in_client_order(const ToolRequest& tools, std::string_view raw_body) {
  if (tools.tools.is_null()) return nullptr;
  if (!raw_body.empty() && json_nesting_depth(raw_body) <= kMaxClientJsonDepth) {
    const ojson body = ojson::parse(raw_body, nullptr, /*allow_exceptions=*/false);
    // Only when it is the same list (a body with duplicate keys could differ).
    if (body.is_object() && body.contains("tools") && json(body["tools"]) == tools.tools)
      return body["tools"];
  }
  return ojson(tools.tools);
}

std::shared_ptr<const TokenConstraint> tool_call_constraint(
    const ToolRequest& tools, GrammarCompiler* grammars, const std::function<bool()>& cancelled) {
  if (!tools.format ||
      (tools.choice != ToolChoice::kRequired && tools.choice != ToolChoice::kNamed))
    return nullptr;
  if (!grammars)
    throw ApiError(400, "constrained tool calls are not available on this endpoint", "tool_choice");
  std::vector<ToolGrammarFunction> functions;
  for (size_t i = 0; i < tools.tools.size(); ++i) {
    const json& fn = tools.tools[i]["function"];
    const std::string name = fn["name"].get<std::string>();
    if (tools.choice == ToolChoice::kNamed && name != tools.function) continue;
    const std::string path = "tools[" + std::to_string(i) + "].function.parameters";
    const json schema = fn.value("parameters", json());
    // Checked alone first (rules only, no token tables: cheap), so the error names this tool.
    try {
      Grammar scratch;
      if (!schema.is_null()) json_schema_expr(scratch, schema, path);
    } catch (const Error& e) {
      throw ApiError(
          400, std::string("tool_choice needs the arguments constrained, and ") + e.what(), path);
    }
    functions.push_back({name, schema, path});
  }
  // A named function is called once (as vLLM's named tool_choice does); "required" may make
  // several calls when parallel calls are allowed.
  const bool parallel = tools.parallel && tools.choice == ToolChoice::kRequired;
  try {
    return grammars->grammar(tool_call_grammar_key(*tools.format, functions, parallel), [&] {
      GrammarBudget budget;
      budget.cancelled = cancelled;
      return tool_call_grammar(*tools.format, functions, parallel, budget);
    });
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "tools");
  }
}

std::string new_tool_call_id() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlphabet) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

json tool_calls_json(const std::vector<ParsedToolCall>& calls, bool with_index,
                     size_t first_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = json::object();
    if (with_index) c["index"] = first_index + i;
    c["id"] = new_tool_call_id();
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace blend
