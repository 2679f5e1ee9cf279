// `blend tokenize` as scripts use it: one JSON array of ids per run, --decode back to text.
#include <gtest/gtest.h>

#include "test_util.h"

namespace blend {
namespace {

TEST(TokenizeCli, EncodeDecodeAndErrors) {
  testing::TempDir dir;
  testing::write_file(dir / "in.txt", "Hello, my dog");
  const std::string blend =
      std::string("'") + BLEND_BINARY + "' tokenize --model '" + BLEND_TEST_TOKENIZER_DIR + "'";
  auto r = testing::run_command(blend + " < " + (dir / "in.txt").string());
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "[9906,11,856,5679]\n");
  r = testing::run_command(blend + " --add-bos < " + (dir / "in.txt").string());
  EXPECT_EQ(r.output, "[128000,9906,11,856,5679]\n");
  testing::write_file(dir / "ids.json", "[9906,11,856,5679]");
  r = testing::run_command(blend + " --decode < " + (dir / "ids.json").string());
  EXPECT_EQ(r.output, "Hello, my dog");
  testing::write_file(dir / "bad.json", "[1, 999999]");
  r = testing::run_command(blend + " --decode < " + (dir / "bad.json").string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("out of range"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace blend
