// `blend template` as scripts use it: messages on stdin, the rendered prompt on stdout.
#include <gtest/gtest.h>

#include "test_util.h"

namespace blend {
namespace {

TEST(TemplateCli, RendersAndRejectsBadInput) {
  testing::TempDir dir;
  const std::string blend =
      std::string("'") + BLEND_BINARY + "' template --model '" + BLEND_TEST_TOKENIZER_DIR + "'";
  testing::write_file(dir / "m.json", R"([{"role":"user","content":"Hi"}])");
  auto r = testing::run_command(blend + " < " + (dir / "m.json").string());
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // The Llama-3 template of this tokenizer always appends the assistant header; a ChatML
  // template shows the flag at work.
  testing::write_file(dir / "tokenizer_config.json",
                      R"({"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ )"
                      R"(m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %})"
                      R"(<|im_start|>assistant\n{% endif %}"})");
  const std::string chatml =
      std::string("'") + BLEND_BINARY + "' template --model '" + dir.path().string() + "'";
  r = testing::run_command(chatml + " < " + (dir / "m.json").string());
  EXPECT_EQ(r.output, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  r = testing::run_command(chatml + " --no-generation-prompt < " + (dir / "m.json").string());
  EXPECT_EQ(r.output, "<|im_start|>user\nHi<|im_end|>\n");
  testing::write_file(dir / "bad.json", R"({"role":"user"})");
  r = testing::run_command(blend + " < " + (dir / "bad.json").string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("JSON array of messages"), std::string::npos) << r.output;
  testing::write_file(dir / "bad.json", "not json");
  r = testing::run_command(blend + " < " + (dir / "bad.json").string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 1);
}

}  // namespace
}  // namespace blend
