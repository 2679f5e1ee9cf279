// Parity with Jinja2 itself (Debian's python3-jinja2), configured as transformers configures
// it: for every template x conversation, our rendering equals Jinja2's byte for byte, and we
// raise exactly when Jinja2 raises.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/chat_template.h"
#include "test_util.h"

namespace blend {
namespace {

using ojson = nlohmann::ordered_json;

std::string templates_dir() {
  return std::string(BLEND_SOURCE_DIR) + "/tests/model/data/chat_templates/";
}

std::vector<std::pair<std::string, std::string>> templates() {
  const auto config = nlohmann::json::parse(
      testing::read_file(std::string(BLEND_TEST_TOKENIZER_DIR) + "/tokenizer_config.json"));
  std::vector<std::pair<std::string, std::string>> t = {
      {"llama-3 (tokenizer_config.json)", config["chat_template"].get<std::string>()}};
  for (const char* name :
       {"llama-3.1-instruct", "qwen2.5-instruct", "mistral-instruct", "zephyr", "features"})
    t.emplace_back(name, testing::read_file(templates_dir() + name + ".jinja"));
  return t;
}

std::vector<std::pair<ojson, ojson>> conversations() {
  // (messages, extra variables)
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather for a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  return {
      {ojson::parse(R"([{"role": "user", "content": "Hi there!"}])"), ojson::object()},
      {ojson::parse(R"([{"role": "system", "content": "  Be terse.\n"},
                        {"role": "user", "content": "Name a prime."}])"),
       ojson::object()},
      {ojson::parse(R"([{"role": "system", "content": "You help."},
                        {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": " Hello! How can I help?  "},
                        {"role": "user", "content": "Tell me about\n\n  whitespace\t "}])"),
       ojson::object()},
      {ojson::parse(R"([{"role": "user", "content": "Unicode: 你好 😀 مرحبا \u00e9"},
                        {"role": "assistant", "content": "Réponse"}])"),
       ojson::object()},
      {ojson::parse(R"([{"role": "user", "content": "What is the weather in Paris?"}])"),
       ojson{{"tools", tools}, {"date_string", "22 Nov 2026"}}},
      {ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"),
       ojson::object()},
      {ojson::parse(R"([{"role": "user", "content": "Weather?"},
                        {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                        {"role": "tool", "content": "18C"}])"),
       ojson{{"tools", tools}}},
  };
}

TEST(ChatTemplateParity, MatchesJinja2) {
  ojson cases = ojson::array();
  struct Meta {
    std::string name;
    std::string source;
    ojson messages, extra;
    bool gen;
  };
  std::vector<Meta> meta;
  for (const auto& [name, source] : templates()) {
    for (const auto& [messages, extra] : conversations()) {
      for (bool gen : {true, false}) {
        cases.push_back({{"template", source},
                         {"messages", messages},
                         {"add_generation_prompt", gen},
                         {"bos_token", "<s>"},
                         {"eos_token", "</s>"},
                         {"extra", extra}});
        meta.push_back({name, source, messages, extra, gen});
      }
    }
  }
  testing::TempDir dir;
  testing::write_file(dir / "cases.json", cases.dump());
  const auto r = testing::run_command("/usr/bin/python3 '" + std::string(BLEND_SOURCE_DIR) +
                                      "/tests/model/render_jinja2.py' < '" +
                                      (dir / "cases.json").string() + "' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << "python3-jinja2 missing? run scripts/setup.sh\n" << r.output;
  const ojson expected = ojson::parse(r.output);
  ASSERT_EQ(expected.size(), meta.size());
  int raised = 0;
  for (size_t i = 0; i < meta.size(); ++i) {
    const Meta& m = meta[i];
    const ChatTemplate tmpl(m.source, "<s>", "</s>");
    std::string ours, error;
    try {
      ours = tmpl.render(m.messages, m.gen, m.extra);
    } catch (const Error& e) {
      error = e.what();
    }
    const std::string where = m.name + " / " + m.messages.dump() + (m.gen ? " +gen" : "");
    if (expected[i].contains("error")) {
      ++raised;
      EXPECT_FALSE(error.empty()) << where << ": Jinja2 raised '" << expected[i]["error"]
                                  << "' but we rendered:\n"
                                  << ours;
    } else {
      EXPECT_EQ(error, "") << where;
      EXPECT_EQ(ours, expected[i]["text"].get<std::string>()) << where;
    }
  }
  EXPECT_GT(raised, 0) << "the Mistral template must reject non-alternating roles";
}

TEST(ChatTemplate, UnsupportedConstructsFailAtLoad) {
  EXPECT_THROW(ChatTemplate("{% include 'x.jinja' %}", "", ""), Error);
  EXPECT_THROW(ChatTemplate("{{ x | wordwrap }}", "", ""), Error);
  EXPECT_THROW(ChatTemplate("{% macro m() %}x{% endmacro %}", "", ""), Error);
  EXPECT_THROW(ChatTemplate("{{ x is sameas y }}", "", ""), Error);
  EXPECT_THROW(ChatTemplate("{% if x %}unclosed", "", ""), Error);
  EXPECT_THROW(ChatTemplate("{{ 'unterminated }}", "", ""), Error);
  EXPECT_THROW(ChatTemplate("{{ foo() }}", "", ""), Error);
  try {
    ChatTemplate("line one\n{{ x | nosuchfilter }}", "", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nosuchfilter"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, FromDirAndRaise) {
  const ChatTemplate t = ChatTemplate::from_dir(BLEND_TEST_TOKENIZER_DIR);
  const std::string text =
      t.render(nlohmann::json::parse(R"([{"role":"user","content":" Hi "}])"), true);
  EXPECT_EQ(text,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const ChatTemplate r("{{ raise_exception('roles must alternate') }}", "", "");
  try {
    r.render(ojson::array(), false);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "roles must alternate");
  }
}

}  // namespace
}  // namespace blend
