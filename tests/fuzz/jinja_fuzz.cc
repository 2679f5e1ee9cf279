// Fuzzes the Jinja engine through ChatTemplate, as a downloaded model folder's template reaches
// it: the input is the template source, rendered for a fixed two-turn conversation with tools
// given. Either text or a blend::Error (a syntax error, an unsupported construct, a limit of
// text/jinja.h reached); never a crash, a hang (libFuzzer's -timeout) or an allocation past its
// -rss_limit_mb. The limits themselves are what this fuzzes hardest: loops, recursion, filters
// over strings and lists.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi <b>there</b> \u00e9\u4e16"},
    {"role": "assistant", "content": "Hello.", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5]}}}]},
    {"role": "user", "content": [{"type": "text", "text": "part"}]}
  ])");
  static const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(R"({
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
      "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}],
    "enable_thinking": false
  })");
  try {
    const blend::ChatTemplate chat_template(std::string(reinterpret_cast<const char*>(data), size),
                                            "<s>", "</s>");
    (void)chat_template.render(messages, /*add_generation_prompt=*/true, extra);
  } catch (const blend::Error&) {
  }
  return 0;
}
