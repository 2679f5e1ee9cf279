// OpenAI tool calling on /v1/chat/completions: the request side (tools, tool_choice,
// parallel_tool_calls, and the assistant tool_calls / tool messages of later turns) and the
// response side (message.tool_calls and stream deltas). The model's text format for calls is
// text/tool_calls.h's (chosen from the chat template); the constraint for tool_choice
// "required" or a named function is grammar/tool_call_grammar.h's.
//
// What each tool_choice does:
//  * "auto" (the default with tools): tools are rendered through the template; calls the model
//    writes are parsed out of the text into message.tool_calls (finish_reason "tool_calls").
//  * "none": tools are still rendered (as vLLM does by default: the conversation may refer to
//    them), and the output is plain content, never parsed.
//  * "required": the output is constrained to one or more calls of the listed functions whose
//    arguments match their schemas; {"type": "function", "function": {"name": ...}}: to exactly
//    one call of that function (as vLLM's named tool_choice).
// parallel_tool_calls false: at most one call (the grammar makes exactly one; with "auto" calls
// after the first are dropped, as vLLM does). The Llama 3.x format is always one call when
// constrained (its template renders one call per turn).
// Tools render in the client's key order when the caller passes the body's text (the server's
// chat route does); Batch API lines keep no text, so their tools render with sorted keys.
// tools with response_format (other than text) is refused unless tool_choice is "none": the
// output would have to be both a call and the schema's JSON, and picking one silently would be
// a wrong answer.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/constraint.h"
#include "text/tool_calls.h"

namespace blend {

class GrammarCompiler;

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolRequest {
  nlohmann::json tools;  // the request's list (checked), for the template; null when none
  ToolChoice choice = ToolChoice::kNone;
  std::string function;                  // kNamed: the function's name
  bool parallel = true;                  // parallel_tool_calls
  std::optional<ToolCallFormat> format;  // set when the output is parsed for calls

  bool parses_output() const { return format.has_value(); }
  size_t max_calls() const { return parallel ? static_cast<size_t>(-1) : 1; }
};

// Parses and checks tools, tool_choice and parallel_tool_calls (ApiError 400 naming the field:
// "tools[1].function.name", ...). `template_source` is the model's chat template (null: none),
// whose support for tools is checked: tools a template does not read would be silently
// dropped, and calls in a format blend cannot read would come back as text; both are refused.
ToolRequest parse_tool_request(const nlohmann::json& body, const std::string* template_source);

// `messages` (flattened by api/openai.cc) made ready for the template the way vLLM feeds HF
// templates: each assistant tool_calls[j].function.arguments, a JSON string on the wire, becomes
// the object it holds (templates print it with tojson or iterate its items); tool messages need
// a string tool_call_id. Refused (400 naming the message) when the template renders no tool
// calls.
void prepare_tool_messages(nlohmann::ordered_json& messages, const std::string* template_source);

// The tools list for the template, in the client's key order when `raw_body` (the body's text,
// empty if unknown) holds it: templates print tools with tojson, and HF renders the keys in the
// order the client wrote them ("type" before "function", the parameters' properties as
// listed), where the parsed body's objects are sorted. Falls back to the sorted list.
nlohmann::ordered_json tools_in_client_order(const ToolRequest& tools, std::string_view raw_body);

// The constraint for "required" or a named function; null for "auto"/"none". ApiError 400
// naming "tools[i].function.parameters" for a schema the grammar compiler cannot enforce.
// `cancelled` is polled while the grammar compiles (the client left).
std::shared_ptr<const TokenConstraint> tool_call_constraint(
    const ToolRequest& tools, GrammarCompiler* grammars,
    const std::function<bool()>& cancelled = {});

// A fresh "call_..." id (24 random letters and digits, as OpenAI's look).
std::string new_tool_call_id();
// message.tool_calls entries ({"id", "type": "function", "function": {"name", "arguments"}});
// for stream deltas with "index" (first_index + position) too.
nlohmann::json tool_calls_json(const std::vector<ParsedToolCall>& calls, bool with_index = false,
                               size_t first_index = 0);

}  // namespace blend
