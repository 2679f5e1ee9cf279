#include "api/stream.h"

#include <gtest/gtest.h>

#include "test_util.h"
#include "text/tokenizer.h"

namespace blend {
namespace {

using nlohmann::json;

class StreamTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = new Tokenizer(Tokenizer::from_dir(BLEND_TEST_TOKENIZER_DIR));
  }
  static void TearDownTestSuite() { delete tokenizer_; }
  static ApiRequest request(Endpoint e, std::optional<int32_t> logprobs, bool usage) {
    ApiRequest r;
    r.endpoint = e;
    r.params.logprobs = logprobs;
    r.include_usage = usage;
    r.stream = true;
    return r;
  }
  static Tokenizer* tokenizer_;
};

Tokenizer* StreamTest::tokenizer_ = nullptr;

// "Hello" = 9906, "," = 11, " my" = 856.
const std::vector<SampledToken> kTokens = {{9906, -0.5f, {{9906, -0.5f}, {11, -2.0f}}},
                                           {11, -1.0f, {{11, -1.0f}, {856, -3.0f}}},
                                           {856, -0.25f, {{856, -0.25f}, {11, -4.0f}}}};

TEST_F(StreamTest, ChatChunksCarryLogprobs) {
  StreamChunks s(request(Endpoint::kChatCompletions, 2, false), "chatcmpl-1", "m", 7, *tokenizer_);
  const json role = s.role();
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(role.contains("usage"));

  const json c = s.delta("Hello,", std::span(kTokens).first(2));
  EXPECT_EQ(c["id"], "chatcmpl-1");
  EXPECT_EQ(c["created"], 7);
  EXPECT_EQ(c["choices"][0]["delta"]["content"], "Hello,");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  const json& content = c["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Hello");
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(content[0]["bytes"], (json{72, 101, 108, 108, 111}));
  EXPECT_EQ(content[1]["top_logprobs"][1]["token"], " my");
  EXPECT_FLOAT_EQ(content[1]["top_logprobs"][1]["logprob"].get<float>(), -3.0f);

  const json f = s.finish(FinishReason::kLength);
  EXPECT_EQ(f["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(f["choices"][0]["delta"], json::object());
  ASSERT_TRUE(f["choices"][0].contains("stop_reason"));
  EXPECT_TRUE(f["choices"][0]["stop_reason"].is_null());
  // The last chunk names what stopped the request, as vLLM's does.
  EXPECT_EQ(s.finish(FinishReason::kStop, std::string("###"))["choices"][0]["stop_reason"], "###");
  EXPECT_EQ(s.finish(FinishReason::kStop, TokenId{13})["choices"][0]["stop_reason"], 13);
}

TEST_F(StreamTest, CompletionChunksContinueTheTextOffsets) {
  StreamChunks s(request(Endpoint::kCompletions, 1, true), "cmpl-1", "m", 7, *tokenizer_);
  EXPECT_TRUE(s.role().is_null());
  const json a = s.delta("Hello,", std::span(kTokens).first(2));
  EXPECT_EQ(a["object"], "text_completion");
  EXPECT_EQ(a["choices"][0]["text"], "Hello,");
  EXPECT_TRUE(a.contains("usage") && a["usage"].is_null());
  EXPECT_EQ(a["choices"][0]["logprobs"]["tokens"], (json{"Hello", ","}));
  EXPECT_EQ(a["choices"][0]["logprobs"]["text_offset"], (json{0, 5}));
  const json b = s.delta(" my", std::span(kTokens).subspan(2));
  EXPECT_EQ(b["choices"][0]["logprobs"]["text_offset"], (json{6}));
  EXPECT_FLOAT_EQ(b["choices"][0]["logprobs"]["token_logprobs"][0].get<float>(), -0.25f);
  EXPECT_FLOAT_EQ(b["choices"][0]["logprobs"]["top_logprobs"][0][","].get<float>(), -4.0f);

  // Named by id (return_tokens_as_token_ids), the offsets still count the text's bytes.
  ApiRequest ids = request(Endpoint::kCompletions, 1, false);
  ids.tokens_as_ids = true;
  StreamChunks t(ids, "cmpl-2", "m", 7, *tokenizer_);
  EXPECT_EQ(t.delta("Hello,", std::span(kTokens).first(2))["choices"][0]["logprobs"]["tokens"],
            (json{"token_id:9906", "token_id:11"}));
  const json c = t.delta(" my", std::span(kTokens).subspan(2));
  EXPECT_EQ(c["choices"][0]["logprobs"]["text_offset"], (json{6}));
  EXPECT_FLOAT_EQ(c["choices"][0]["logprobs"]["top_logprobs"][0]["token_id:11"].get<float>(),
                  -4.0f);

  GenerationResult r;
  r.prompt_tokens = 4;
  r.tokens = {9906, 11, 856};
  const json u = s.usage(r);
  EXPECT_EQ(u["choices"], json::array());
  EXPECT_EQ(u["usage"]["total_tokens"], 7);
}

TEST_F(StreamTest, NoLogprobsUnlessAsked) {
  StreamChunks s(request(Endpoint::kChatCompletions, std::nullopt, false), "c", "m", 1,
                 *tokenizer_);
  EXPECT_TRUE(s.delta("Hello", std::span(kTokens).first(1))["choices"][0]["logprobs"].is_null());
}

}  // namespace
}  // namespace blend
