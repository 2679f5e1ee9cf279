// `blend tokenize` as scripts use it: one JSON array of ids per run, --decode back to text, and
// bad input as a message with exit status 1 (never a crash).
#include <gtest/gtest.h>

#include "test_util.h"

namespace blend {
namespace {

class TokenizeCli : public ::testing::Test {
 protected:
  std::string blend_tokenize(const std::string& flags, const std::string& stdin_text) {
    testing::write_file(dir_ / "stdin", stdin_text);
    const std::string cmd = std::string("'") + BLEND_BINARY + "' tokenize --model '" +
                            BLEND_TEST_TOKENIZER_DIR + "' " + flags + " < '" +
                            (dir_ / "stdin").string() + "' 2>&1";
    last_ = testing::run_command(cmd);
    return last_.output;
  }
  testing::TempDir dir_;
  testing::CommandResult last_;
};

TEST_F(TokenizeCli, EncodesStdinToOneJsonLine) {
  EXPECT_EQ(blend_tokenize("", "Hello, my dog"), "[9906,11,856,5679]\n");
  EXPECT_EQ(last_.exit_code, 0);
  EXPECT_EQ(blend_tokenize("--add-bos", "Hello, my dog"), "[128000,9906,11,856,5679]\n");
  EXPECT_EQ(blend_tokenize("", ""), "[]\n");
  EXPECT_EQ(blend_tokenize("", "a<|eot_id|>b"), "[64,128009,65]\n");
  // --no-special: the special token's text is tokenized as text.
  const std::string plain = blend_tokenize("--no-special", "a<|eot_id|>b");
  EXPECT_EQ(last_.exit_code, 0);
  EXPECT_EQ(plain.find("128009"), std::string::npos) << plain;
  // Invalid UTF-8 is encoded, not refused.
  blend_tokenize("", "ok \xff\xfe");
  EXPECT_EQ(last_.exit_code, 0);
}

TEST_F(TokenizeCli, DecodesIds) {
  EXPECT_EQ(blend_tokenize("--decode", "[9906,11,856,5679]"), "Hello, my dog");
  EXPECT_EQ(blend_tokenize("--decode", "[64, 128009, 65]"), "a<|eot_id|>b");
  EXPECT_EQ(blend_tokenize("--decode", "[]"), "");
  // Half a character decodes to U+FFFD.
  EXPECT_EQ(blend_tokenize("--decode", "[160]"), "\xEF\xBF\xBD");
  EXPECT_EQ(last_.exit_code, 0);
}

TEST_F(TokenizeCli, BadInputIsAnErrorNotACrash) {
  EXPECT_NE(blend_tokenize("--decode", "[1, 999999]").find("out of range"), std::string::npos);
  EXPECT_EQ(last_.exit_code, 1);
  EXPECT_NE(blend_tokenize("--decode", "[-1]").find("out of range"), std::string::npos);
  EXPECT_EQ(last_.exit_code, 1);
  blend_tokenize("--decode", "[1.5]");
  EXPECT_EQ(last_.exit_code, 1);
  blend_tokenize("--decode", "not json");
  EXPECT_EQ(last_.exit_code, 1);
  blend_tokenize("--decode", "{\"ids\": [1]}");
  EXPECT_EQ(last_.exit_code, 1);
  const std::string missing =
      testing::run_command(std::string("'") + BLEND_BINARY +
                           "' tokenize --model /nonexistent < /dev/null 2>&1")
          .output;
  EXPECT_NE(missing.find("/nonexistent"), std::string::npos) << missing;
}

}  // namespace
}  // namespace blend
