// What a vLLM user sends to /v1/completions (issue 54): top_logprobs dicts that hold the
// sampled token.
#include <gtest/gtest.h>

#include "api/openai.h"
#include "api/stream.h"
#include "llama3_text_fixture.h"

namespace blend {
namespace {

using nlohmann::json;

class CompletionsTest : public Llama3TextTest {
 protected:
  static ApiRequest parse(Endpoint e, const std::string& body, bool prompt_lists = true) {
    (void)prompt_lists;  // lists of prompts: not parsed yet
    return parse_api_request(e, json::parse(body), *tokenizer_, template_);
  }
  // The parameter a refused body names, with its message.
  static std::pair<std::string, std::string> refusal(Endpoint e, const std::string& body,
                                                     bool prompt_lists = true) {
    try {
      parse(e, body, prompt_lists);
    } catch (const ApiError& err) {
      EXPECT_EQ(err.status(), 400);
      return {err.param(), err.what()};
    }
    return {"<no error>", ""};
  }
  // A result of choice `index` whose prompt had `prompt_tokens` tokens.
  static GenerationResult result(int32_t index, int64_t prompt_tokens, std::string text,
                                 std::vector<TokenId> tokens) {
    GenerationResult r;
    r.index = index;
    r.prompt_tokens = prompt_tokens;
    r.text = std::move(text);
    r.tokens = std::move(tokens);
    r.finish = FinishReason::kLength;
    return r;
  }
};

// "Hello" = 9906, "," = 11, " my" = 856.

// vLLM's completions logprobs list the sampled token beside the top k even when it is not
// one of them; chat keeps OpenAI's k.
TEST_F(CompletionsTest, TopLogprobsHoldTheSampledTokenOnCompletionsOnly) {
  GenerationResult res = result(0, 1, "Hello,", {9906, 11});
  res.logprobs = {{9906, -0.5f, {{9906, -0.5f}}},  // sampled = the top one
                  {11, -2.0f, {{856, -0.25f}}}};   // sampled outside the top 1
  ApiRequest r = parse(Endpoint::kCompletions, R"({"prompt":"Hi","logprobs":1})");
  json top =
      make_response(r, res, "c", "m", 1, *tokenizer_)["choices"][0]["logprobs"]["top_logprobs"];
  EXPECT_EQ(top[0], (json{{"Hello", -0.5f}}));
  EXPECT_EQ(top[1], (json{{" my", -0.25f}, {",", -2.0f}}));
  // Streamed chunks say the same.
  StreamChunks s(parse(Endpoint::kCompletions, R"({"prompt":"Hi","logprobs":1,"stream":true})"),
                 "c", "m", 1, *tokenizer_);
  EXPECT_EQ(s.delta("Hello,", res.logprobs)["choices"][0]["logprobs"]["top_logprobs"], top);
  // logprobs 0: the sampled token alone.
  r = parse(Endpoint::kCompletions, R"({"prompt":"Hi","logprobs":0})");
  res.logprobs = {{9906, -0.5f, {}}, {11, -2.0f, {}}};
  top = make_response(r, res, "c", "m", 1, *tokenizer_)["choices"][0]["logprobs"]["top_logprobs"];
  EXPECT_EQ(top, (json{{{"Hello", -0.5f}}, {{",", -2.0f}}}));

  res.logprobs = {{9906, -0.5f, {{9906, -0.5f}}}, {11, -2.0f, {{856, -0.25f}}}};
  r = parse(Endpoint::kChatCompletions,
            R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":1})");
  const json content =
      make_response(r, res, "c", "m", 1, *tokenizer_)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content[1]["top_logprobs"].size(), 1u);
  EXPECT_EQ(content[1]["top_logprobs"][0]["token"], " my");
}

}  // namespace
}  // namespace blend
