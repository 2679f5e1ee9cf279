// What a vLLM user sends to /v1/completions (issue 54): a list of prompts, echo, top_logprobs
// dicts that hold the sampled token, and stream_options.continuous_usage_stats.
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
    RequestLimits limits;
    limits.prompt_lists = prompt_lists;
    return parse_api_request(e, json::parse(body), *tokenizer_, template_, limits);
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

TEST_F(CompletionsTest, AListOfPromptsIsOneRequestPerPrompt) {
  ApiRequest r = parse(Endpoint::kCompletions, R"({"prompt":["Hello, my dog","Hello"],"n":2})");
  EXPECT_EQ(r.prompt_count(), 2u);
  EXPECT_EQ(r.prompt_at(0), (std::vector<TokenId>{9906, 11, 856, 5679}));
  EXPECT_EQ(r.prompt_at(1), (std::vector<TokenId>{9906}));
  EXPECT_TRUE(r.echo.empty());
  r = parse(Endpoint::kCompletions, R"({"prompt":[[5,6,7],[8],[9,10]]})");
  ASSERT_EQ(r.prompt_count(), 3u);
  EXPECT_EQ(r.prompt_at(2), (std::vector<TokenId>{9, 10}));
  // One prompt in a list is that prompt, wherever lists are answered or not.
  for (const bool lists : {true, false}) {
    r = parse(Endpoint::kCompletions, R"({"prompt":["Hello"]})", lists);
    EXPECT_EQ(r.prompt_count(), 1u);
    EXPECT_EQ(r.prompt, (std::vector<TokenId>{9906}));
  }
  // A caller that answers one prompt (a Batch API line, /tokenize) refuses several by name.
  EXPECT_EQ(refusal(Endpoint::kCompletions, R"({"prompt":["a","b"]})", false).first, "prompt");
}

TEST_F(CompletionsTest, APromptListIsBoundedAndEachPromptChecked) {
  const auto prompts = [](size_t count) {
    json list = json::array();
    for (size_t i = 0; i < count; ++i) list.push_back("p" + std::to_string(i));
    return list;
  };
  const auto body = [&](size_t count, int n) {
    return json{{"prompt", prompts(count)}, {"n", n}}.dump();
  };
  EXPECT_EQ(parse(Endpoint::kCompletions, body(kMaxChoices, 1)).prompt_count(),
            static_cast<size_t>(kMaxChoices));
  EXPECT_EQ(parse(Endpoint::kCompletions, body(kMaxChoices / 2, 2)).prompt_count(),
            static_cast<size_t>(kMaxChoices / 2));
  auto [param, message] = refusal(Endpoint::kCompletions, body(kMaxChoices + 1, 1));
  EXPECT_EQ(param, "prompt");
  EXPECT_NE(message.find("at most 128 choices"), std::string::npos) << message;
  EXPECT_EQ(refusal(Endpoint::kCompletions, body(kMaxChoices / 2 + 1, 2)).first, "prompt");
  // Every element is a prompt of its own: checked as a single one is.
  for (const char* bad :
       {R"({"prompt":["a",5]})", R"({"prompt":["a",[1,-2]]})", R"({"prompt":["a",""]})",
        R"({"prompt":[[1],[]]})", R"({"prompt":["a",["b"]]})", R"({"prompt":[]})"})
    EXPECT_EQ(refusal(Endpoint::kCompletions, bad).first, "prompt") << bad;
  // The context check looks at every prompt: the second one is too long here.
  const ApiRequest r = parse(Endpoint::kCompletions, R"({"prompt":[[1,2],[1,2,3,4,5,6]]})");
  EXPECT_NO_THROW(check_context(r, json::object(), 7));
  try {
    check_context(r, json::object(), 6);
    FAIL() << "the second prompt fills the context";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "prompt");
  }
  try {
    check_context(r, json{{"max_tokens", 2}}, 7);
    FAIL() << "the second prompt and max_tokens pass the context";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "max_tokens");
  }
}

// Choices are indexed prompt_index * n + sample_index, each with its own prompt's echo; usage
// counts each prompt once and every choice's tokens.
TEST_F(CompletionsTest, ResponsesIndexChoicesByPromptAndSumUsage) {
  const ApiRequest r =
      parse(Endpoint::kCompletions, R"({"prompt":["Hello, my","Hello"],"n":2,"echo":true})");
  EXPECT_EQ(r.echo, (std::vector<std::string>{"Hello, my", "Hello"}));
  const std::vector<GenerationResult> results = {
      result(3, 1, " b1", {11, 11, 11}), result(0, 3, " a0", {11}), result(2, 1, " b0", {11, 11}),
      result(1, 3, " a1", {11})};
  const json body = make_response(r, results, "cmpl-1", "m", 1, *tokenizer_);
  ASSERT_EQ(body["choices"].size(), 4u);
  const char* want[] = {"Hello, my a0", "Hello, my a1", "Hello b0", "Hello b1"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"], want[i]);
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(body["usage"]["completion_tokens"], 7);
  EXPECT_EQ(body["usage"]["total_tokens"], 11);
}

TEST_F(CompletionsTest, EchoPrependsThePromptText) {
  ApiRequest r = parse(Endpoint::kCompletions, R"({"prompt":"Hello,","echo":true})");
  EXPECT_EQ(r.echo, (std::vector<std::string>{"Hello,"}));
  r = parse(Endpoint::kCompletions,
            R"({"prompt":[9906,11],"echo":true})");  // token ids: their text
  EXPECT_EQ(r.echo, (std::vector<std::string>{"Hello,"}));
  EXPECT_EQ(
      make_response(r, result(0, 2, " my", {856}), "c", "m", 1, *tokenizer_)["choices"][0]["text"],
      "Hello, my");
  EXPECT_TRUE(parse(Endpoint::kCompletions, R"({"prompt":"x","echo":false})").echo.empty());
  // Each choice repeats its prompt: 128 choices of a 600 KB prompt would answer 77 MB.
  std::string long_prompt;
  for (int i = 0; i < 100000; ++i) long_prompt += "hello ";
  json big = {{"prompt", long_prompt}, {"echo", true}, {"n", 100}};
  EXPECT_NO_THROW(parse(Endpoint::kCompletions, big.dump()));
  big["n"] = 128;
  EXPECT_EQ(refusal(Endpoint::kCompletions, big.dump()).first, "echo");
  // echo with logprobs scores the prompt (prompt_logprobs_test.cc), not streamed.
  EXPECT_EQ(
      refusal(Endpoint::kCompletions, R"({"prompt":"x","echo":true,"logprobs":1,"stream":true})")
          .first,
      "echo");
  EXPECT_EQ(refusal(Endpoint::kChatCompletions,
                    R"({"messages":[{"role":"user","content":"Hi"}],"echo":true})")
                .first,
            "echo");

  // Streaming: the first delta starts with the prompt; the finish chunk carries it when no
  // delta came.
  r = parse(Endpoint::kCompletions, R"({"prompt":["Hello","Hello,"],"echo":true,"stream":true})");
  StreamChunks first(r, "c", "m", 1, *tokenizer_, 0);
  const SampledToken comma{11, -1.0f, {}};
  EXPECT_EQ(first.delta(",", std::span(&comma, 1))["choices"][0]["text"], "Hello,");
  EXPECT_EQ(first.delta(",", std::span(&comma, 1))["choices"][0]["text"], ",");
  EXPECT_EQ(first.finish(FinishReason::kStop)["choices"][0]["text"], "");
  StreamChunks second(r, "c", "m", 1, *tokenizer_, 1);
  const json f = second.finish(FinishReason::kStop);
  EXPECT_EQ(f["choices"][0]["text"], "Hello,");
  EXPECT_EQ(f["choices"][0]["index"], 1);
}

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

// stream_options.continuous_usage_stats (vLLM): every chunk has its choice's usage so far.
TEST_F(CompletionsTest, ContinuousUsageStatsPutUsageInEveryChunk) {
  const std::string stream = R"("stream":true,"stream_options":{"include_usage":true,)"
                             R"("continuous_usage_stats":true}})";
  ApiRequest r = parse(Endpoint::kCompletions, R"({"prompt":["Hello, my dog","Hello"],)" + stream);
  EXPECT_TRUE(r.continuous_usage);
  const std::vector<SampledToken> tokens = {{11, -1.0f, {}}, {856, -1.0f, {}}, {11, -1.0f, {}}};
  StreamChunks s(r, "c", "m", 1, *tokenizer_, 1);  // the second prompt's: 1 token
  json c = s.delta(",", std::span(tokens).first(1));
  EXPECT_EQ(c["usage"],
            (json{{"prompt_tokens", 1}, {"completion_tokens", 1}, {"total_tokens", 2}}));
  c = s.delta(" my", std::span(tokens).subspan(1, 1));
  EXPECT_EQ(c["usage"]["completion_tokens"], 2);
  s.count(std::span(tokens).subspan(2));  // a token whose text was held back
  c = s.finish(FinishReason::kLength);
  EXPECT_EQ(c["usage"],
            (json{{"prompt_tokens", 1}, {"completion_tokens", 3}, {"total_tokens", 4}}));

  r = parse(Endpoint::kChatCompletions,
            R"({"messages":[{"role":"user","content":"Hi"}],)" + stream);
  StreamChunks chat(r, "c", "m", 1, *tokenizer_);
  const json role = chat.role();
  EXPECT_EQ(role["usage"]["prompt_tokens"], r.prompt.size());
  EXPECT_EQ(role["usage"]["completion_tokens"], 0);
  // As vLLM: without include_usage it asks for nothing; without stream, it is refused.
  r = parse(Endpoint::kCompletions,
            R"({"prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true}})");
  EXPECT_FALSE(r.continuous_usage);
  EXPECT_FALSE(StreamChunks(r, "c", "m", 1, *tokenizer_).delta("x", {}).contains("usage"));
  EXPECT_EQ(refusal(Endpoint::kCompletions,
                    R"({"prompt":"x","stream_options":{"continuous_usage_stats":true}})")
                .first,
            "stream_options");
  EXPECT_EQ(refusal(Endpoint::kCompletions,
                    R"({"prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":1}})")
                .first,
            "continuous_usage_stats");
}

}  // namespace
}  // namespace blend
