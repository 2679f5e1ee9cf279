// vLLM's prompt_logprobs and OpenAI's echo with logprobs in the API layer: what is parsed and
// refused, and the shapes of the responses built from the engine's scores.
#include <gtest/gtest.h>

#include "api/openai.h"
#include "llama3_text_fixture.h"

namespace blend {
namespace {

using nlohmann::json;

class PromptLogprobsApiTest : public Llama3TextTest {
 protected:
  static ApiRequest parse(Endpoint e, const std::string& body) {
    return parse_api_request(e, json::parse(body), *tokenizer_, template_, RequestLimits{});
  }
  static std::string refused_param(Endpoint e, const std::string& body) {
    try {
      parse(e, body);
    } catch (const ApiError& err) {
      EXPECT_EQ(err.status(), 400) << body;
      return err.param();
    }
    return "<no error>";
  }
  // A finished result for the prompt "Hello, my" (9906 11 856) that generated " dog" (5679),
  // its first token unscored, the two others with two alternatives each.
  static GenerationResult scored_result() {
    GenerationResult r;
    r.prompt_tokens = 3;
    r.text = " dog";
    r.tokens = {5679};
    r.finish = FinishReason::kLength;
    r.logprobs = {{5679, -0.75f, {{5679, -0.75f}}}};
    r.prompt_logprobs = {{9906, 0.0f, 0, {}},
                         {11, -1.5f, 2, {{856, -0.5f}, {11, -1.5f}}},
                         {856, -3.0f, 7, {{11, -0.25f}, {9906, -1.0f}}}};
    return r;
  }
};

constexpr const char* kChat = R"({"messages":[{"role":"user","content":"Hi"}],)";

TEST_F(PromptLogprobsApiTest, PromptLogprobsAreBoundedLikeTopLogprobsOnBothEndpoints) {
  EXPECT_EQ(
      parse(Endpoint::kCompletions, R"({"prompt":"x","prompt_logprobs":0})").params.prompt_logprobs,
      0);
  EXPECT_EQ(parse(Endpoint::kCompletions, R"({"prompt":"x","prompt_logprobs":20})")
                .params.prompt_logprobs,
            20);
  EXPECT_EQ(parse(Endpoint::kChatCompletions, std::string(kChat) + R"("prompt_logprobs":3})")
                .params.prompt_logprobs,
            3);
  EXPECT_FALSE(parse(Endpoint::kCompletions, R"({"prompt":"x","prompt_logprobs":null})")
                   .params.prompt_logprobs);
  for (const char* bad : {"21", "-1", "1.5", "\"2\"", "100000"}) {
    EXPECT_EQ(refused_param(Endpoint::kCompletions,
                            std::string(R"({"prompt":"x","prompt_logprobs":)") + bad + "}"),
              "prompt_logprobs")
        << bad;
    EXPECT_EQ(refused_param(Endpoint::kChatCompletions,
                            std::string(kChat) + R"("prompt_logprobs":)" + bad + "}"),
              "prompt_logprobs")
        << bad;
  }
  EXPECT_EQ(
      refused_param(Endpoint::kCompletions, R"({"prompt":"x","prompt_logprobs":1,"stream":true})"),
      "prompt_logprobs");
}

// vLLM's shape: on completions in each choice, on chat beside the choices; null for the first
// prompt token, then a dict by token id holding the token and its top alternatives.
TEST_F(PromptLogprobsApiTest, ResponsesCarryPromptLogprobsInVllmsShape) {
  const GenerationResult res = scored_result();
  ApiRequest r = parse(Endpoint::kCompletions, R"({"prompt":"Hello, my","prompt_logprobs":2})");
  ASSERT_EQ(r.prompt, (std::vector<TokenId>{9906, 11, 856}));
  const json choice = make_response(r, res, "c", "m", 1, *tokenizer_)["choices"][0];
  const json expected =
      json::array({nullptr,
                   {{"11", {{"logprob", -1.5f}, {"rank", 2}, {"decoded_token", ","}}},
                    {"856", {{"logprob", -0.5f}, {"rank", 1}, {"decoded_token", " my"}}}},
                   {{"856", {{"logprob", -3.0f}, {"rank", 7}, {"decoded_token", " my"}}},
                    {"11", {{"logprob", -0.25f}, {"rank", 1}, {"decoded_token", ","}}},
                    {"9906", {{"logprob", -1.0f}, {"rank", 2}, {"decoded_token", "Hello"}}}}});
  EXPECT_EQ(choice["prompt_logprobs"], expected);
  EXPECT_TRUE(choice["logprobs"].is_null());  // logprobs were not asked
  EXPECT_EQ(choice["text"], " dog");

  r = parse(Endpoint::kChatCompletions, std::string(kChat) + R"("prompt_logprobs":2})");
  GenerationResult chat = res;
  chat.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  chat.prompt_logprobs.assign(r.prompt.size(), res.prompt_logprobs[1]);
  chat.prompt_logprobs[0] = res.prompt_logprobs[0];
  const json body = make_response(r, chat, "c", "m", 1, *tokenizer_);
  ASSERT_TRUE(body["prompt_logprobs"].is_array());
  EXPECT_EQ(body["prompt_logprobs"].size(), r.prompt.size());
  EXPECT_TRUE(body["prompt_logprobs"][0].is_null());
  EXPECT_EQ(body["prompt_logprobs"][1], expected[1]);
  EXPECT_FALSE(body["choices"][0].contains("prompt_logprobs"));
  // Not asked: no such key anywhere.
  r = parse(Endpoint::kCompletions, R"({"prompt":"Hello, my"})");
  EXPECT_FALSE(
      make_response(r, res, "c", "m", 1, *tokenizer_)["choices"][0].contains("prompt_logprobs"));
}

// OpenAI's legacy echo with logprobs: the prompt's tokens first, the first with null logprob
// and alternatives, each later one with its top `logprobs` alternatives and itself; then the
// completion's tokens, their offsets after the echoed text.
TEST_F(PromptLogprobsApiTest, EchoWithLogprobsPutsThePromptTokensFirst) {
  ApiRequest r =
      parse(Endpoint::kCompletions, R"({"prompt":"Hello, my","echo":true,"logprobs":1})");
  EXPECT_TRUE(r.echo_logprobs);
  EXPECT_EQ(r.params.prompt_logprobs, 1);  // the prompt is scored with as many alternatives
  EXPECT_EQ(parse(Endpoint::kCompletions,
                  R"({"prompt":"x","echo":true,"logprobs":1,"prompt_logprobs":4})")
                .params.prompt_logprobs,
            4);
  EXPECT_FALSE(parse(Endpoint::kCompletions, R"({"prompt":"x","echo":true})").echo_logprobs);
  GenerationResult res = scored_result();
  res.prompt_logprobs[1].top.resize(1);
  res.prompt_logprobs[2].top.resize(1);
  const json choice = make_response(r, res, "c", "m", 1, *tokenizer_)["choices"][0];
  EXPECT_EQ(choice["text"], "Hello, my dog");
  const json& lp = choice["logprobs"];
  EXPECT_EQ(lp["tokens"], (json{"Hello", ",", " my", " dog"}));
  EXPECT_EQ(lp["token_logprobs"], (json{nullptr, -1.5f, -3.0f, -0.75f}));
  EXPECT_EQ(lp["top_logprobs"], (json{nullptr,
                                      {{" my", -0.5f}, {",", -1.5f}},
                                      {{",", -0.25f}, {" my", -3.0f}},
                                      {{" dog", -0.75f}}}));
  EXPECT_EQ(lp["text_offset"], (json{0, 5, 6, 9}));
  EXPECT_EQ(choice["prompt_logprobs"].size(), 3u);
}

}  // namespace
}  // namespace blend
