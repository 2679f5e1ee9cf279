// Parity with Jinja2 itself (Debian's python3-jinja2, set up as transformers sets it up by
// tests/text/render_jinja2.py): for every chat template x conversation x add_generation_prompt,
// our rendering equals Jinja2's byte for byte, and we raise exactly when Jinja2 raises. The same
// holds for the small templates in data/jinja_snippets.json. A missing python3-jinja2 fails the
// test (scripts/setup.sh installs it); it is never skipped.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "text/chat_template.h"
#include "text/jinja.h"

namespace blend {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kDataDir = std::string(BLEND_SOURCE_DIR) + "/tests/text/data/";

// Runs render_jinja2.py over `cases`; returns one {"text"} or {"error"} per case.
ojson run_jinja2(const ojson& cases) {
  testing::TempDir dir;
  testing::write_file(dir / "cases.json", cases.dump());
  const std::string python =
      std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const auto r =
      testing::run_command(python + " '" + BLEND_SOURCE_DIR + "/tests/text/render_jinja2.py' < '" +
                           (dir / "cases.json").string() + "' 2>&1");
  if (r.exit_code != 0) {
    ADD_FAILURE() << "render_jinja2.py failed (is python3-jinja2 installed? run "
                     "scripts/setup.sh):\n"
                  << r.output;
    return ojson::array();
  }
  ojson out = ojson::parse(r.output);
  EXPECT_EQ(out.size(), cases.size());
  return out;
}

struct NamedTemplate {
  std::string name;
  std::string source;
};

std::vector<NamedTemplate> templates() {
  // Llama-3's template is read where the tokenizer data lives, never copied into the tree.
  const auto config = nlohmann::json::parse(
      testing::read_file(std::string(BLEND_TEST_TOKENIZER_DIR) + "/tokenizer_config.json"));
  std::vector<NamedTemplate> t = {
      {"llama-3 (tokenizer_config.json)", config["chat_template"].get<std::string>()}};
  for (const char* name : {"llama-3.1-instruct", "qwen2.5-instruct", "qwen3", "mistral-instruct",
                           "gemma", "zephyr", "features"})
    t.push_back({name, testing::read_file(kDataDir + "chat_templates/" + name + ".jinja")});
  return t;
}

struct Conversation {
  std::string name;
  ojson messages;
  ojson extra;
};

std::vector<Conversation> conversations() {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather for a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "description": "The city"}},
      "required": ["city"]}}}])");
  return {
      {"single user", ojson::parse(R"([{"role": "user", "content": "Hi there!"}])"), {}},
      {"system + user",
       ojson::parse(R"([{"role": "system", "content": "  Be terse.\n"},
                                         {"role": "user", "content": "Name a prime."}])"),
       {}},
      {"multi-turn",
       ojson::parse(R"([{"role": "system", "content": "You help."},
                                      {"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": " Hello! How can I help?  "},
                                      {"role": "user", "content": "Tell me about\n\n  whitespace\t "}])"),
       {}},
      {"unicode, assistant last",
       ojson::parse(R"([{"role": "user", "content": "Unicode: 你好 😀 مرحبا \u00e9 \u3000x\u00a0"},
                        {"role": "assistant", "content": "Réponse ΟΔΟΣ"}])"),
       {}},
      {"no system, tools", ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"}])"),
       ojson{{"tools", tools}, {"date_string", "22 Nov 2026"}}},
      {"system, tools, tools in system",
       ojson::parse(R"([{"role": "system", "content": "Use tools."},
                        {"role": "user", "content": "Weather in Paris?"}])"),
       ojson{{"tools", tools}, {"tools_in_user_message", false}}},
      {"non-alternating roles",
       ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"),
       {}},
      {"assistant first",
       ojson::parse(R"([{"role": "assistant", "content": "I start."},
                                           {"role": "user", "content": "ok"}])"),
       {}},
      {"tool call and result", ojson::parse(R"([{"role": "user", "content": "Weather?"},
                        {"role": "assistant", "content": "", "tool_calls": [{"id": "call12345",
                         "type": "function", "function": {"name": "get_weather",
                         "arguments": {"city": "Paris"}}}]},
                        {"role": "tool", "tool_call_id": "call12345", "content": "18C"},
                        {"role": "tool", "tool_call_id": "call12345", "content": {"temp": 18}}])"),
       ojson{{"tools", tools}}},
      {"builtin tools", ojson::parse(R"([{"role": "user", "content": "Search it"},
                        {"role": "assistant", "tool_calls": [{"type": "function", "function":
                         {"name": "brave_search", "arguments": {"query": "blend"}}}]}])"),
       ojson{{"builtin_tools", ojson::array({"brave_search", "code_interpreter"})}}},
      {"thinking", ojson::parse(R"([{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
                        {"role": "user", "content": "and 3+3?"}])"),
       ojson{{"enable_thinking", false}}},
      {"content parts",
       ojson::parse(R"([{"role": "user", "content": [{"type": "text",
                         "text": "Describe"}, {"type": "image"}]}])"),
       {}},
      {"empty", ojson::array(), {}},
  };
}

TEST(ChatTemplateParity, MatchesJinja2) {
  struct Case {
    const NamedTemplate* tmpl;
    const Conversation* conv;
    bool gen;
  };
  const auto tmpls = templates();
  const auto convs = conversations();
  std::vector<Case> meta;
  ojson cases = ojson::array();
  for (const auto& t : tmpls) {
    for (const auto& c : convs) {
      for (bool gen : {true, false}) {
        cases.push_back({{"template", t.source},
                         {"messages", c.messages},
                         {"add_generation_prompt", gen},
                         {"bos_token", "<s>"},
                         {"eos_token", "</s>"},
                         {"extra", c.extra.is_null() ? ojson::object() : c.extra}});
        meta.push_back({&t, &c, gen});
      }
    }
  }
  const ojson expected = run_jinja2(cases);
  ASSERT_EQ(expected.size(), meta.size());
  int raised = 0;
  for (size_t i = 0; i < meta.size(); ++i) {
    const Case& m = meta[i];
    const ChatTemplate tmpl(m.tmpl->source, "<s>", "</s>");
    std::string ours, error;
    try {
      ours = tmpl.render(m.conv->messages, m.gen,
                         m.conv->extra.is_null() ? ojson::object() : m.conv->extra);
    } catch (const Error& e) {
      error = e.what();
    }
    const std::string where =
        m.tmpl->name + " / " + m.conv->name + (m.gen ? " / generation prompt" : "");
    if (expected[i].contains("error")) {
      ++raised;
      EXPECT_NE(error, "") << where << ": Jinja2 raised " << expected[i]["error"]
                           << " but we rendered:\n"
                           << ours;
      continue;
    }
    ASSERT_EQ(error, "") << where << ": we raised but Jinja2 rendered:\n"
                         << expected[i]["text"].get<std::string>();
    EXPECT_EQ(ours, expected[i]["text"].get<std::string>()) << where;

    // The templates do what they are known for.
    if (m.tmpl->name == "qwen2.5-instruct" && m.conv->name == "no system, tools") {
      EXPECT_NE(ours.find("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                          "helpful assistant.\n\n# Tools"),
                std::string::npos)
          << ours;
      EXPECT_NE(ours.find("\"name\": \"get_weather\""), std::string::npos) << ours;
    }
  }
  // Both sides raise on what the templates reject: Mistral and Gemma on roles that do not
  // alternate, and most templates on an empty conversation.
  for (size_t i = 0; i < meta.size(); ++i) {
    const Case& m = meta[i];
    if ((m.tmpl->name == "mistral-instruct" || m.tmpl->name == "gemma") &&
        m.conv->name == "non-alternating roles") {
      ASSERT_TRUE(expected[i].contains("error")) << m.tmpl->name;
      EXPECT_NE(expected[i]["error"].get<std::string>().find("alternate"), std::string::npos);
    }
  }
  EXPECT_GT(raised, 0);
}

TEST(ChatTemplateParity, SnippetsMatchJinja2) {
  const ojson data = ojson::parse(testing::read_file(kDataDir + "jinja_snippets.json"));
  ojson cases = ojson::array();
  for (const auto& t : data["templates"])
    cases.push_back({{"template", t}, {"context", data["context"]}});
  const ojson expected = run_jinja2(cases);
  ASSERT_EQ(expected.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string source = cases[i]["template"].get<std::string>();
    std::string ours, error;
    try {
      ours = jinja::Template(source).render(data["context"]);
    } catch (const Error& e) {
      error = e.what();
    }
    if (expected[i].contains("error")) {
      EXPECT_NE(error, "") << source << "\nJinja2 raised " << expected[i]["error"]
                           << " but we rendered:\n"
                           << ours;
    } else {
      EXPECT_EQ(error, "") << source;
      EXPECT_EQ(ours, expected[i]["text"].get<std::string>()) << source;
    }
  }
}

TEST(ChatTemplate, UnsupportedConstructsFailAtLoad) {
  EXPECT_THROW(ChatTemplate("{% include 'x.jinja' %}", "", ""), Error);
  EXPECT_THROW(ChatTemplate("{{ x | wordwrap }}", "", ""), Error);
  EXPECT_THROW(ChatTemplate("{% if x %}unclosed", "", ""), Error);
  try {
    ChatTemplate("line one\n{{ x | nosuchfilter }}", "", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nosuchfilter"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, FromDirReadsTokenizerConfig) {
  const ChatTemplate t = ChatTemplate::from_dir(BLEND_TEST_TOKENIZER_DIR);
  EXPECT_EQ(t.render(nlohmann::json::parse(R"([{"role":"user","content":" Hi "}])"), true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // This (first) Llama-3 template appends the assistant header even without
  // add_generation_prompt, and so do we.
  EXPECT_EQ(t.render(ojson::parse(R"([{"role":"user","content":"Hi"}])"), false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, FromDirVariants) {
  testing::TempDir dir;
  // A list of named templates: "default" is used; AddedToken objects give the token text; a
  // null token is undefined in the template.
  testing::write_file(dir / "tokenizer_config.json", R"({
      "chat_template": [{"name": "tool_use", "template": "tools"},
                        {"name": "default", "template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}|{{ tools }}"}],
      "bos_token": {"content": "<B>", "lstrip": false}, "eos_token": "<E>", "pad_token": null})");
  EXPECT_EQ(ChatTemplate::from_dir(dir.path()).render(ojson::array(), true), "<B>|<E>|False|None");
  // chat_template.jinja takes priority over tokenizer_config.json, as in transformers.
  testing::write_file(dir / "chat_template.jinja", "file:{{ messages | length }}\n");
  EXPECT_EQ(ChatTemplate::from_dir(dir.path()).render(ojson::array({ojson::object()}), true),
            "file:1");
  // No template at all, or no default among named ones: a clear error.
  testing::TempDir empty;
  testing::write_file(empty / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_THROW(ChatTemplate::from_dir(empty.path()), Error);
  testing::write_file(empty / "tokenizer_config.json",
                      R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  EXPECT_THROW(ChatTemplate::from_dir(empty.path()), Error);
  // A number beyond a double is JSON's out_of_range, not a parse_error: still a blend::Error.
  testing::write_file(empty / "tokenizer_config.json", R"({"model_max_length": 1e999})");
  EXPECT_THROW(ChatTemplate::from_dir(empty.path()), Error);
  // An unsupported construct names the file.
  testing::write_file(empty / "tokenizer_config.json", R"({"chat_template": "{% include 'a' %}"})");
  try {
    ChatTemplate::from_dir(empty.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("include"), std::string::npos);
  }
}

TEST(ChatTemplate, WrongJsonTypesInTokenizerConfigAreErrorsNamingTheField) {
  testing::TempDir dir;
  // A special token of another type than string / {"content": ...} / null is refused, naming
  // the file and the token, instead of being left out of the template silently.
  testing::write_file(dir / "tokenizer_config.json",
                      R"({"chat_template": "{{ bos_token }}", "bos_token": 5})");
  try {
    ChatTemplate::from_dir(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bos_token"), std::string::npos);
  }
  // A named template whose name is not a string is not the default (it was a raw type_error).
  testing::write_file(dir / "tokenizer_config.json",
                      R"({"chat_template": [{"name": 5, "template": "x"},
                                            {"name": "default", "template": "ok"}]})");
  EXPECT_EQ(ChatTemplate::from_dir(dir.path()).render(ojson::array(), true), "ok");
  testing::write_file(dir / "tokenizer_config.json",
                      R"({"chat_template": [{"name": 5, "template": "x"}]})");
  EXPECT_THROW(ChatTemplate::from_dir(dir.path()), Error);
}

TEST(ChatTemplate, VariablesAndErrors) {
  const ChatTemplate t(
      "{{ bos_token }}{{ messages | length }}{{ add_generation_prompt }}"
      "{{ tools }}{{ documents }}{{ extra_var | default('-') }}",
      "<s>", "</s>");
  EXPECT_EQ(t.render(ojson::array(), true), "<s>0TrueNoneNone-");
  EXPECT_EQ(t.render(ojson::array(), false, ojson{{"extra_var", 5}, {"tools", ojson::array()}}),
            "<s>0False[]None5");
  EXPECT_THROW(t.render(ojson::object(), true), Error);  // messages must be a list
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
