// Tool calls in a model's own text format: which format a chat template teaches, and a parser
// that finds the calls in generated text (incrementally, so a stream can send each call as soon
// as it is complete).
//
// The format is a property of the model's chat template (the template both describes it to the
// model and renders past calls in it), so it is chosen from the template's source:
//  * kHermes (Qwen2.5, Qwen3, Hermes, ...): the template writes "<tool_call>"; a call is
//    <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>, several in a row allowed.
//  * kLlama3Json (Llama 3.1/3.2/3.3): the template asks for {"name": ..., "parameters": ...}
//    and renders past calls with '"parameters": '; a call is that JSON object as the whole
//    reply (several separated by ";", as vLLM's llama3_json parser accepts).
// Any other template that mentions `tools` uses a format this parser does not know, and tools
// are refused for it (api/tools.cc) rather than returned unparsed.
//
// Lives in text/ because it is about text the model writes, next to the chat template that
// teaches it; grammar/tool_call_grammar.h writes the same wrapper text as a grammar.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace blend {

enum class ToolCallFormat { kHermes, kLlama3Json };

// Whether the template reads the `tools` variable at all (else tools would be dropped).
bool template_takes_tools(std::string_view template_source);
// The tool-call format the template teaches; nullopt when it takes no tools or uses a format
// not listed above.
std::optional<ToolCallFormat> detect_tool_call_format(std::string_view template_source);
const char* tool_call_format_name(ToolCallFormat format);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text, compact, in the model's key order
};

// What a stretch of generated text turned out to be: plain content, and complete calls.
struct ToolCallOutput {
  std::string content;
  std::vector<ParsedToolCall> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

// Feed the generated text in pieces; each feed returns what is decided so far. Text that may
// still turn out to be part of a call is held back until it is decided (Hermes: a partial
// "<tool_call>" or an open call; Llama: the whole reply when it starts with "{"). Malformed
// calls come back as content, verbatim, so nothing the model wrote is lost. Whitespace between
// calls, before a call and after the last call is dropped (it is formatting, not content).
class ToolCallParser {
 public:
  // `max_calls`: calls past this many are dropped (parallel_tool_calls false keeps the first,
  // as vLLM does).
  explicit ToolCallParser(ToolCallFormat format, size_t max_calls = static_cast<size_t>(-1));

  ToolCallOutput feed(std::string_view text);
  // The end of the output: whatever was held back is decided.
  ToolCallOutput finish();
  // Calls returned so far (kept ones).
  size_t calls() const { return calls_; }

 private:
  void feed_hermes(ToolCallOutput& out);
  void feed_llama(ToolCallOutput& out);
  void emit_content(std::string_view text, ToolCallOutput& out);
  void add_call(ParsedToolCall call, ToolCallOutput& out);

  ToolCallFormat format_;
  size_t max_calls_;
  size_t calls_ = 0;         // kept
  bool any_call_ = false;    // seen, kept or not
  bool after_call_ = false;  // the whitespace that follows a call is dropped
  std::string buf_;          // undecided text
  bool in_call_ = false;     // Hermes: after "<tool_call>"
  enum class Mode { kUndecided, kContent, kJson } mode_ = Mode::kUndecided;  // Llama
  std::string ws_;  // trailing whitespace of the content so far, held back
};

// The whole text at once: feed + finish.
ToolCallOutput parse_tool_calls(ToolCallFormat format, std::string_view text,
                                size_t max_calls = static_cast<size_t>(-1));

}  // namespace blend
