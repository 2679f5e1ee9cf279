// `blend template` as scripts use it: messages on stdin, the rendered prompt on stdout, and
// exit code 1 with "blend: error: ..." for bad input.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace blend {
namespace {

std::string blend_template(const std::string& model_dir) {
  return std::string("'") + BLEND_BINARY + "' template --model '" + model_dir + "'";
}

TEST(TemplateCli, RendersTheModelsTemplate) {
  testing::TempDir dir;
  testing::write_file(dir / "m.json", R"([{"role":"user","content":" Hi "}])");
  const auto r = testing::run_command(blend_template(BLEND_TEST_TOKENIZER_DIR) + " < '" +
                                      (dir / "m.json").string() + "'");
  ASSERT_EQ(r.exit_code, 0);
  // Exactly the prompt: no newline after it.
  EXPECT_EQ(r.output,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(TemplateCli, NoGenerationPrompt) {
  testing::TempDir model;
  testing::write_file(model / "tokenizer_config.json", R"({"bos_token": "<s>",
      "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"})");
  testing::write_file(model / "m.json", R"([{"role":"user","content":"Hi ✓"}])");
  const std::string cmd = blend_template(model.path().string());
  auto r = testing::run_command(cmd + " < '" + (model / "m.json").string() + "'");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "<s>[user] Hi ✓\n[assistant]");
  r = testing::run_command(cmd + " --no-generation-prompt < '" + (model / "m.json").string() + "'");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "<s>[user] Hi ✓\n");
}

// The CLI renders through the server's path (issue 56): content-part lists join into the text
// (not a Python repr of the list), an assistant's string tool arguments reach the template as the
// object they hold (not a JSON string encoded twice), and a whole chat request body's tools
// reach it in the client's key order.
TEST(TemplateCli, RendersAsTheServerDoes) {
  testing::TempDir model;
  const std::string qwen = testing::read_file(
      std::string(BLEND_SOURCE_DIR) + "/tests/text/data/chat_templates/qwen2.5-instruct.jinja");
  testing::write_file(model / "tokenizer_config.json",
                      nlohmann::json{{"chat_template", qwen}}.dump());
  testing::write_file(model / "m.json", R"([
      {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"there"}]},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
       "function":{"name":"f","arguments":"{\"x\": 1}"}}]}])");
  const std::string cmd = blend_template(model.path().string());
  auto r = testing::run_command(cmd + " < '" + (model / "m.json").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("<|im_start|>user\nHi\nthere<|im_end|>"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(R"(<tool_call>
{"name": "f", "arguments": {"x": 1}}
</tool_call>)"),
            std::string::npos)
      << r.output;
  testing::write_file(model / "body.json", R"({"messages":[{"role":"user","content":"Q"}],
      "tools":[{"type":"function","function":{"name":"g","parameters":{"type":"object"},
       "description":"d"}}]})");
  r = testing::run_command(cmd + " < '" + (model / "body.json").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(R"({"type": "function", "function": {"name": "g", "parameters": )"
                          R"({"type": "object"}, "description": "d"}})"),
            std::string::npos)
      << r.output;
}

TEST(TemplateCli, BadInputExitsWithOne) {
  testing::TempDir dir;
  const std::string cmd = blend_template(BLEND_TEST_TOKENIZER_DIR);
  for (const char* input : {R"({"role":"user"})", "not json", ""}) {
    testing::write_file(dir / "bad.json", input);
    const auto r = testing::run_command(cmd + " < '" + (dir / "bad.json").string() + "' 2>&1");
    EXPECT_EQ(r.exit_code, 1) << input;
    EXPECT_NE(r.output.find("blend: error: expected a JSON array of messages"), std::string::npos)
        << r.output;
  }
  // A folder without a chat template.
  testing::write_file(dir / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  auto r = testing::run_command(blend_template(dir.path().string()) + " < /dev/null 2>&1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("no chat template"), std::string::npos) << r.output;
  // The template's own raise_exception() message.
  testing::write_file(dir / "tokenizer_config.json",
                      R"({"chat_template": "{{ raise_exception('roles must alternate') }}"})");
  testing::write_file(dir / "m.json", R"([{"role":"user","content":"Hi"}])");
  r = testing::run_command(blend_template(dir.path().string()) + " < '" +
                           (dir / "m.json").string() + "' 2>&1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "blend: error: chat template: roles must alternate\n");
  // The server's checks on the messages, with the field named.
  testing::write_file(dir / "tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  for (const auto& [input, message] :
       {std::pair{"[]", "'messages' must be a non-empty list"},
        std::pair{R"([{"role":"user","content":7}])",
                  "'messages[0].content' must be a string or a list of content parts"}}) {
    testing::write_file(dir / "m.json", input);
    r = testing::run_command(blend_template(dir.path().string()) + " < '" +
                             (dir / "m.json").string() + "' 2>&1");
    EXPECT_EQ(r.exit_code, 1) << input;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace blend
