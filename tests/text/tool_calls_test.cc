#include "text/tool_calls.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace blend {
namespace {

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(BLEND_SOURCE_DIR) + "/tests/text/data/chat_templates/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The same text fed one byte at a time: what a stream sends, added up.
ToolCallOutput parse_bytewise(ToolCallFormat f, const std::string& text,
                              size_t max_calls = static_cast<size_t>(-1)) {
  ToolCallParser p(f, max_calls);
  ToolCallOutput all;
  auto add = [&](ToolCallOutput o) {
    all.content += o.content;
    for (auto& c : o.calls) all.calls.push_back(std::move(c));
  };
  for (char c : text) add(p.feed(std::string_view(&c, 1)));
  add(p.finish());
  return all;
}

void expect_same(const ToolCallOutput& a, const ToolCallOutput& b) {
  EXPECT_EQ(a.content, b.content);
  ASSERT_EQ(a.calls.size(), b.calls.size());
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name);
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments);
  }
}

TEST(ToolCallFormat, ChosenFromTheTemplate) {
  EXPECT_EQ(detect_tool_call_format(read_template("qwen2.5-instruct.jinja")),
            ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(read_template("qwen3.jinja")), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format(read_template("llama-3.1-instruct.jinja")),
            ToolCallFormat::kLlama3Json);
  // Mistral takes tools but writes [TOOL_CALLS]: a format this parser does not read.
  EXPECT_TRUE(template_takes_tools(read_template("mistral-instruct.jinja")));
  EXPECT_EQ(detect_tool_call_format(read_template("mistral-instruct.jinja")), std::nullopt);
  // Templates without tools.
  EXPECT_FALSE(template_takes_tools(read_template("zephyr.jinja")));
  EXPECT_EQ(detect_tool_call_format(read_template("gemma.jinja")), std::nullopt);
}

TEST(ToolCallParser, HermesOneCallAfterContent) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"c\"}}\n</tool_call>";
  const ToolCallOutput out = parse_tool_calls(ToolCallFormat::kHermes, text);
  EXPECT_EQ(out.content, "Let me check.");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  // Compact, in the model's key order (not sorted).
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
  expect_same(parse_bytewise(ToolCallFormat::kHermes, text), out);
}

TEST(ToolCallParser, HermesSeveralCalls) {
  const std::string text =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>{\"arguments\": \"{\\\"y\\\": [1, 2]}\", \"name\": \"c\"}</tool_call>\n";
  const ToolCallOutput out = parse_tool_calls(ToolCallFormat::kHermes, text);
  EXPECT_EQ(out.content, "");  // the newlines between and after calls are formatting
  ASSERT_EQ(out.calls.size(), 3u);
  EXPECT_EQ(out.calls[0].name, "a");
  EXPECT_EQ(out.calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(out.calls[1].arguments, "{}");
  // Arguments quoted as a string holding an object are read as that object.
  EXPECT_EQ(out.calls[2].name, "c");
  EXPECT_EQ(out.calls[2].arguments, R"({"y":[1,2]})");
  expect_same(parse_bytewise(ToolCallFormat::kHermes, text), out);
  // parallel_tool_calls false: the first call only.
  const ToolCallOutput one = parse_tool_calls(ToolCallFormat::kHermes, text, 1);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "a");
  EXPECT_EQ(one.content, "");
  expect_same(parse_bytewise(ToolCallFormat::kHermes, text, 1), one);
}

TEST(ToolCallParser, HermesMalformedCallsStayContent) {
  for (const std::string& text : {
           std::string("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}\n</tool_call>"),
           std::string("<tool_call>\n{\"arguments\": {}}\n</tool_call>"),  // no name
           std::string("<tool_call>\n{\"name\": \"a\", \"arguments\": 3}\n</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"a\"} trailing\n</tool_call>"),
           std::string("<tool_call>\n[1, 2]\n</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\":"),  // cut off
           std::string("<tool_ca"),
           std::string("plain text with < and <tool and trailing space \n"),
       }) {
    const ToolCallOutput out = parse_tool_calls(ToolCallFormat::kHermes, text);
    EXPECT_TRUE(out.calls.empty()) << text;
    EXPECT_EQ(out.content, text);  // verbatim: nothing the model wrote is lost
    expect_same(parse_bytewise(ToolCallFormat::kHermes, text), out);
  }
  // A malformed call beside a good one: the good one is a call, the bad one content.
  const std::string mixed =
      "<tool_call>\n{\"name\": \"a\"\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
      "\"arguments\": {}}\n</tool_call>";
  const ToolCallOutput out = parse_tool_calls(ToolCallFormat::kHermes, mixed);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "b");
  EXPECT_EQ(out.content, "<tool_call>\n{\"name\": \"a\"\n</tool_call>");
}

TEST(ToolCallParser, HermesUnclosedLastCallIsACall) {
  const std::string text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": \"x}\"}}\n";
  const ToolCallOutput out = parse_tool_calls(ToolCallFormat::kHermes, text);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, R"({"q":"x}"})");
}

// A stream sends a call as soon as its closing tag arrives, and holds back a partial tag.
TEST(ToolCallParser, HermesIncremental) {
  ToolCallParser p(ToolCallFormat::kHermes);
  ToolCallOutput o = p.feed("Sure <tool");
  EXPECT_EQ(o.content, "Sure");  // the space may precede a call: held
  o = p.feed("_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_");
  EXPECT_TRUE(o.empty());
  o = p.feed("call>");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(p.calls(), 1u);
  o = p.feed(" done");
  EXPECT_EQ(o.content, "done");
  EXPECT_TRUE(p.finish().empty());
}

TEST(ToolCallParser, Llama3Json) {
  const std::string one = R"({"name": "get_weather", "parameters": {"city": "Paris"}})";
  ToolCallOutput out = parse_tool_calls(ToolCallFormat::kLlama3Json, one);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(out.content, "");
  expect_same(parse_bytewise(ToolCallFormat::kLlama3Json, one), out);

  const std::string two = "<|python_tag|>" + one + "; {\"name\": \"b\", \"arguments\": {}}\n";
  out = parse_tool_calls(ToolCallFormat::kLlama3Json, two);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[1].name, "b");
  expect_same(parse_bytewise(ToolCallFormat::kLlama3Json, two), out);
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kLlama3Json, two, 1).calls.size(), 1u);

  // Not a call: the text as it is.
  for (const std::string& text :
       {std::string("The weather is fine."), std::string("  {\"name\": \"a\"} and more"),
        std::string("{\"city\": \"Paris\"}"), std::string("{\"name\": \"a\", \"parameters\": {"),
        std::string(one + "; "), std::string("\n\n")}) {
    const ToolCallOutput plain = parse_tool_calls(ToolCallFormat::kLlama3Json, text);
    EXPECT_TRUE(plain.calls.empty()) << text;
    EXPECT_EQ(plain.content, text);
    expect_same(parse_bytewise(ToolCallFormat::kLlama3Json, text), plain);
  }
}

// Generated text is untrusted: deep nesting is refused by a bracket count before nlohmann's
// recursive parser sees it.
TEST(ToolCallParser, DeepNestingIsContent) {
  const std::string deep =
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": " + std::string(100000, '[') +
      std::string(100000, ']') + "}}</tool_call>";
  const ToolCallOutput out = parse_tool_calls(ToolCallFormat::kHermes, deep);
  EXPECT_TRUE(out.calls.empty());
  EXPECT_EQ(out.content, deep);
  const std::string llama = "{\"name\": \"a\", \"parameters\": " + std::string(100000, '{');
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kLlama3Json, llama).content, llama);
}

}  // namespace
}  // namespace blend
