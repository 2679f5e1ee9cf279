#include "api/openai.h"

#include <chrono>
#include <fstream>
#include <iterator>
#include <tuple>

#include <gtest/gtest.h>

#include "api/batch_file.h"
#include "core/regular_file.h"
#include "grammar/json_schema.h"
#include "llama3_text_fixture.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

class OpenAiTest : public Llama3TextTest {
 protected:
  static ApiRequest parse(Endpoint e, const std::string& body) {
    return parse_api_request(e, json::parse(body), *tokenizer_, template_);
  }
  static std::string error_param(Endpoint e, const std::string& body) {
    try {
      parse(e, body);
    } catch (const ApiError& err) {
      EXPECT_EQ(err.status(), 400);
      return err.param();
    }
    return "<no error>";
  }
};

TEST_F(OpenAiTest, CompletionDefaultsAndFields) {
  ApiRequest r = parse(Endpoint::kCompletions, R"({"model":"m","prompt":"Hello, my dog"})");
  EXPECT_EQ(r.prompt, (std::vector<TokenId>{9906, 11, 856, 5679}));
  EXPECT_EQ(r.params.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_FLOAT_EQ(r.params.temperature, 1.0f);
  r = parse(Endpoint::kCompletions,
            R"({"prompt":[[5,6,7]],"max_tokens":9,"temperature":0,"top_p":0.5,"top_k":4,)"
            R"("min_p":0.1,"seed":3,"stop":["x","yz"],"ignore_eos":true,"logprobs":3})");
  EXPECT_EQ(r.prompt, (std::vector<TokenId>{5, 6, 7}));
  EXPECT_EQ(r.params.max_tokens, 9);
  EXPECT_EQ(r.params.top_k, 4);
  EXPECT_EQ(r.params.seed, 3u);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_EQ(r.params.logprobs, 3);
}

// The model's generation_config.json defaults fill what a request leaves unset (vLLM's
// --generation-config auto); what the request sets is its own.
TEST_F(OpenAiTest, ModelSamplingDefaultsFillUnsetFields) {
  SamplingDefaults model;
  model.temperature = 0.6f;
  model.top_p = 0.9f;
  model.top_k = 20;
  model.min_p = 0.05f;
  model.repetition_penalty = 1.1f;
  model.max_tokens = 64;
  RequestLimits limits;
  limits.sampling_defaults = &model;
  for (const Endpoint e : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const json unset = e == Endpoint::kCompletions
                           ? json::parse(R"({"prompt":"x"})")
                           : json::parse(R"({"messages":[{"role":"user","content":"x"}]})");
    const SamplingParams p = parse_api_request(e, unset, *tokenizer_, template_, limits).params;
    EXPECT_FLOAT_EQ(p.temperature, 0.6f);
    EXPECT_FLOAT_EQ(p.top_p, 0.9f);
    EXPECT_EQ(p.top_k, 20);
    EXPECT_FLOAT_EQ(p.min_p, 0.05f);
    EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
    EXPECT_EQ(p.max_tokens, 64);
    json set = unset;
    set.update(json::parse(R"({"temperature":0,"top_p":1,"top_k":-1,"min_p":0,)"
                           R"("repetition_penalty":1,"max_tokens":5})"));
    const SamplingParams q = parse_api_request(e, set, *tokenizer_, template_, limits).params;
    EXPECT_FLOAT_EQ(q.temperature, 0.0f);
    EXPECT_FLOAT_EQ(q.top_p, 1.0f);
    EXPECT_EQ(q.top_k, 0);
    EXPECT_FLOAT_EQ(q.min_p, 0.0f);
    EXPECT_FLOAT_EQ(q.repetition_penalty, 1.0f);
    EXPECT_EQ(q.max_tokens, 5);
  }
}

TEST_F(OpenAiTest, LatencyTargetsAreAnExtensionField) {
  const ApiRequest r = parse_api_request(
      Endpoint::kCompletions, json::parse(R"({"prompt":"x","ttft_slo":0.25,"tpot_slo":0.05})"),
      *tokenizer_, template_);
  EXPECT_DOUBLE_EQ(*r.ttft_slo, 0.25);
  EXPECT_DOUBLE_EQ(*r.tpot_slo, 0.05);
  const ApiRequest d = parse_api_request(Endpoint::kCompletions, json::parse(R"({"prompt":"x"})"),
                                         *tokenizer_, template_);
  EXPECT_FALSE(d.ttft_slo);
  EXPECT_FALSE(d.tpot_slo);
}

TEST_F(OpenAiTest, AdaptiveBlocksIsAnExtensionField) {
  auto parsed = [&](const char* body) {
    return parse_api_request(Endpoint::kCompletions, json::parse(body), *tokenizer_, template_)
        .adaptive_blocks;
  };
  EXPECT_EQ(parsed(R"({"prompt":"x","adaptive_blocks":true})"), true);
  EXPECT_EQ(parsed(R"({"prompt":"x","adaptive_blocks":false})"), false);
  EXPECT_FALSE(parsed(R"({"prompt":"x"})"));
  EXPECT_FALSE(parsed(R"({"prompt":"x","adaptive_blocks":null})"));
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","adaptive_blocks":1})"),
            "adaptive_blocks");
}

TEST_F(OpenAiTest, ChatRendersTheTemplate) {
  ApiRequest r = parse(Endpoint::kChatCompletions,
                       R"({"messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":7,)"
                       R"("logprobs":true,"top_logprobs":2,"stream":true,)"
                       R"("stream_options":{"include_usage":true}})");
  const std::string text = tokenizer_->decode(r.prompt);
  EXPECT_EQ(text,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(r.prompt.front(), 128000);
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST_F(OpenAiTest, BadFieldsNameTheParameter) {
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"max_tokens":4})"), "prompt");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","temperature":3})"),
            "temperature");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","max_tokens":-1})"), "max_tokens");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","max_tokens":1.5})"),
            "max_tokens");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","n":0})"), "n");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","ttft_slo":0})"), "ttft_slo");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","tpot_slo":"fast"})"), "tpot_slo");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","stop":5})"), "stop");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":["a","b"]})"), "prompt");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":[1,-2]})"), "prompt");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","top_p":0})"), "top_p");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions, R"({"messages":[]})"), "messages");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions, R"({"messages":[{"content":"x"}]})"),
            "messages");
  // Invalid UTF-8 in a prompt string.
  json body = {{"prompt", std::string("ab\xff", 3)}};
  EXPECT_THROW(parse_api_request(Endpoint::kCompletions, body, *tokenizer_, template_), ApiError);
  try {
    parse_endpoint("/v1/embeddings");
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.body()["error"]["type"], "invalid_request_error");
    EXPECT_EQ(e.body()["error"]["param"], "url");
  }
}

TEST_F(OpenAiTest, ResponseShapes) {
  ApiRequest req = parse(Endpoint::kCompletions, R"({"prompt":"Hi","logprobs":1})");
  GenerationResult res;
  res.prompt_tokens = 1;
  res.tokens = {9906, 11};
  res.text = "Hello,";
  res.finish = FinishReason::kLength;
  res.logprobs = {{9906, -0.5f, {{9906, -0.5f}}}, {11, -1.0f, {{11, -1.0f}}}};
  json body = make_response(req, res, "cmpl-1", "m", 123, *tokenizer_);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "Hello,");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["total_tokens"], 3);
  EXPECT_EQ(body["choices"][0]["logprobs"]["tokens"], (json{"Hello", ","}));
  EXPECT_EQ(body["choices"][0]["logprobs"]["text_offset"], (json{0, 5}));

  // vLLM's return_tokens_as_token_ids names the tokens by id (the offsets still count text).
  req = parse(Endpoint::kCompletions,
              R"({"prompt":"Hi","logprobs":1,"return_tokens_as_token_ids":true})");
  body = make_response(req, res, "cmpl-1", "m", 123, *tokenizer_);
  EXPECT_EQ(body["choices"][0]["logprobs"]["tokens"], (json{"token_id:9906", "token_id:11"}));
  EXPECT_EQ(body["choices"][0]["logprobs"]["top_logprobs"][1], (json{{"token_id:11", -1.0f}}));
  EXPECT_EQ(body["choices"][0]["logprobs"]["text_offset"], (json{0, 5}));
  EXPECT_EQ(body["choices"][0]["text"], "Hello,");
  req = parse(Endpoint::kChatCompletions,
              R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":1,)"
              R"("return_tokens_as_token_ids":true})");
  body = make_response(req, res, "chatcmpl-1", "m", 123, *tokenizer_);
  const json& content = body["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(content[0]["token"], "token_id:9906");
  EXPECT_EQ(content[1]["top_logprobs"][0]["token"], "token_id:11");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","return_tokens_as_token_ids":1})"),
            "return_tokens_as_token_ids");
  EXPECT_FALSE(parse(Endpoint::kCompletions, R"({"prompt":"x"})").tokens_as_ids);

  req = parse(Endpoint::kChatCompletions, R"({"messages":[{"role":"user","content":"Hi"}]})");
  res.finish = FinishReason::kStop;
  body = make_response(req, res, "chatcmpl-1", "m", 123, *tokenizer_);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello,");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());

  // n samples finish in any order; the choices come in index order.
  req = parse(Endpoint::kCompletions, R"({"prompt":"Hi","n":3})");
  std::vector<GenerationResult> samples(3, res);
  for (int32_t i = 0; i < 3; ++i) {
    samples[static_cast<size_t>(i)].index = 2 - i;
    samples[static_cast<size_t>(i)].text = "sample " + std::to_string(2 - i);
  }
  body = make_response(req, samples, "cmpl-1", "m", 123, *tokenizer_);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"], "sample " + std::to_string(i));
  }
}

// Clients send content as a list of parts; the template used to print the list's repr.
TEST_F(OpenAiTest, ContentPartsAreFlattenedAsVllmDoes) {
  const ApiRequest parts = parse(
      Endpoint::kChatCompletions,
      R"({"messages":[{"role":"system","content":[{"type":"text","text":"Be brief."}]},)"
      R"({"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"there"}]}]})");
  const ApiRequest plain =
      parse(Endpoint::kChatCompletions, R"({"messages":[{"role":"system","content":"Be brief."},)"
                                        R"({"role":"user","content":"Hi\nthere"}]})");
  EXPECT_EQ(parts.prompt, plain.prompt);
  EXPECT_EQ(tokenizer_->decode(parts.prompt).find("'type'"), std::string::npos);
  // Parts a text model cannot read are refused, naming the part.
  EXPECT_EQ(error_param(Endpoint::kChatCompletions,
                        R"({"messages":[{"role":"user","content":[{"type":"text","text":"x"},)"
                        R"({"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]})"),
            "messages[0].content[1].type");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions,
                        R"({"messages":[{"role":"user","content":[{"type":"input_audio"}]}]})"),
            "messages[0].content[0].type");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions,
                        R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})"),
            "messages[0].content[0].text");
  EXPECT_EQ(
      error_param(Endpoint::kChatCompletions, R"({"messages":[{"role":"user","content":5}]})"),
      "messages[0].content");
  json bad = {
      {"messages",
       {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", std::string("\xff", 1)}}}}}}}};
  EXPECT_THROW(parse_api_request(Endpoint::kChatCompletions, bad, *tokenizer_, template_),
               ApiError);
}

// response_format: json_object and json_schema become a constraint; what cannot be honoured is
// a 400 naming response_format and the keyword.
TEST_F(OpenAiTest, ResponseFormatCompilesSchemasAndRefusesWhatItCannotHonour) {
  GrammarCompiler grammars(*tokenizer_, tokenizer_->vocab_size(),
                           {*tokenizer_->token_id("<|eot_id|>")});
  RequestLimits limits;
  limits.grammars = &grammars;
  const std::string chat = R"({"messages":[{"role":"user","content":"Hi"}],"response_format":)";
  auto constraint = [&](Endpoint e, const std::string& body) {
    return parse_api_request(e, json::parse(body), *tokenizer_, template_, limits)
        .params.constraint;
  };
  EXPECT_EQ(constraint(Endpoint::kChatCompletions, chat + R"({"type":"text"}})"), nullptr);
  EXPECT_NE(constraint(Endpoint::kChatCompletions, chat + R"({"type":"json_object"}})"), nullptr);
  const std::string schema =
      R"({"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":)"
      R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}})";
  const auto c1 = constraint(Endpoint::kChatCompletions, chat + schema + "}");
  EXPECT_NE(c1, nullptr);
  // The same schema again shares the compiled grammar (its caches).
  EXPECT_EQ(constraint(Endpoint::kChatCompletions, chat + schema + "}"), c1);
  EXPECT_NE(
      constraint(Endpoint::kCompletions, R"({"prompt":"x","response_format":)" + schema + "}"),
      nullptr);
  for (const std::string bad :
       {R"({"type":"xml"})", R"({"type":"json_object","schema":{}})",
        R"({"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"a"}}})",
        R"({"type":"json_schema","json_schema":{"schema":{},"extra":1}})",
        R"({"type":"json_schema","json_schema":{"schema":{"type":"object","required":["z"]}}})",
        R"({"type":"json_schema"})", R"("json")"}) {
    try {
      constraint(Endpoint::kChatCompletions, chat + bad + "}");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), "response_format") << bad;
      if (bad.find("pattern") != std::string::npos) {
        EXPECT_NE(std::string(e.what()).find("'pattern'"), std::string::npos) << e.what();
      }
    }
  }
}

// A prompt too long for the context is refused before its schema or tools compile: a 4,096-value
// enum compiled for 27 s before such a request was refused (issue 54). A schema no finite JSON
// value satisfies is a 400 naming response_format.
TEST_F(OpenAiTest, ThePromptIsCheckedBeforeTheGrammarCompiles) {
  GrammarCompiler grammars(*tokenizer_, tokenizer_->vocab_size(),
                           {*tokenizer_->token_id("<|eot_id|>")});
  RequestLimits limits;
  limits.grammars = &grammars;
  limits.max_sequence_tokens = 8;
  const std::string format =
      R"("response_format":{"type":"json_schema","json_schema":{"schema":{"enum":["a","b"]}}})";
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],)"
      R"("tool_choice":"required")";
  std::ifstream in(BLEND_SOURCE_DIR "/tests/text/data/chat_templates/qwen2.5-instruct.jinja");
  const ChatTemplate qwen(std::string(std::istreambuf_iterator<char>(in), {}), "", "<|im_end|>");
  for (const auto& [endpoint, body, chat_template] :
       {std::tuple{Endpoint::kCompletions,
                   R"({"prompt":"one two three four five six seven eight nine",)" + format + "}",
                   static_cast<const ChatTemplate*>(template_)},
        std::tuple{Endpoint::kChatCompletions,
                   R"({"messages":[{"role":"user","content":"one two three"}],)" + format + "}",
                   static_cast<const ChatTemplate*>(template_)},
        std::tuple{Endpoint::kChatCompletions,
                   R"({"messages":[{"role":"user","content":"one two three"}],)" + tools + "}",
                   &qwen}}) {
    try {
      parse_api_request(endpoint, json::parse(body), *tokenizer_, chat_template, limits);
      ADD_FAILURE() << body << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_NE(std::string(e.what()).find("maximum context length"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(grammars.cached_grammars(), 0u);  // nothing was compiled
  limits.max_sequence_tokens = 0;
  try {
    parse_api_request(Endpoint::kCompletions,
                      json::parse(R"({"prompt":"x","response_format":{"type":"json_schema",)"
                                  R"("json_schema":{"schema":{"$ref":"#"}}}})"),
                      *tokenizer_, template_, limits);
    ADD_FAILURE() << "{\"$ref\": \"#\"} was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "response_format");
    EXPECT_NE(std::string(e.what()).find("no finite"), std::string::npos) << e.what();
  }
}

// Fields that would change the result and are not implemented are a 400 naming them; those
// that cannot are accepted; penalties and logit_bias reach SamplingParams.
TEST_F(OpenAiTest, EveryFieldIsImplementedHarmlessOrRefused) {
  const std::string chat = R"({"messages":[{"role":"user","content":"Hi"}],)";
  EXPECT_EQ(error_param(Endpoint::kChatCompletions,
                        chat + R"("response_format":{"type":"json_object"}})"),
            "response_format");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions,
                        chat + R"("tools":[{"type":"function","function":{"name":"f"}}]})"),
            "tools");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions, chat + R"("tool_choice":"auto"})"),
            "tool_choice");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions, chat + R"("functions":[{"name":"f"}]})"),
            "functions");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions, chat + R"("n":200})"), "n");
  EXPECT_EQ(parse(Endpoint::kChatCompletions, chat + R"("n":3})").n, 3);
  // best_of = n is plain n; picking the best of more samples is not implemented.
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","best_of":3})"), "best_of");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","n":3,"best_of":2})"), "best_of");
  EXPECT_EQ(parse(Endpoint::kCompletions, R"({"prompt":"x","n":2,"best_of":2})").n, 2);
  // echo is implemented (tests/api/completions_test.cc), with logprobs too but not streamed
  // (tests/api/prompt_logprobs_test.cc).
  EXPECT_EQ(error_param(Endpoint::kCompletions,
                        R"({"prompt":"x","echo":true,"logprobs":1,"stream":true})"),
            "echo");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","suffix":"end"})"), "suffix");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","guided_choice":["a","b"]})"),
            "guided_choice");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","guided_regex":"a+"})"),
            "guided_regex");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","frobnicate":1})"), "frobnicate");
  // A chat-only field on /v1/completions is unknown there.
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","tools":[{}]})"), "tools");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","service_tier":5})"),
            "service_tier");
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","stream_options":5})"),
            "stream_options");
  // A blend workload file's planner hint changes nothing the model produces.
  EXPECT_NO_THROW(parse(Endpoint::kCompletions, R"({"prompt":"x","estimated_output":40})"));
  // Defaults and harmless fields pass.
  EXPECT_NO_THROW(parse(Endpoint::kChatCompletions,
                        chat +
                            R"("response_format":{"type":"text"},"tools":[],"tool_choice":"none",)"
                            R"("user":"u1","metadata":{"k":"v"},"store":false,"n":1,)"
                            R"("parallel_tool_calls":true,"service_tier":"flex",)"
                            R"("functions":null,"skip_special_tokens":true})"));
  EXPECT_NO_THROW(parse(Endpoint::kCompletions,
                        R"({"prompt":"x","suffix":null,"echo":false,"best_of":1,"user":"u"})"));

  const ApiRequest r = parse(Endpoint::kCompletions,
                             R"({"prompt":"x","presence_penalty":0.5,"frequency_penalty":-1.5,)"
                             R"("repetition_penalty":1.3,"logit_bias":{"50256":-100,"11":2.5}})");
  EXPECT_FLOAT_EQ(r.params.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.params.frequency_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.3f);
  EXPECT_EQ(r.params.logit_bias,
            (std::vector<std::pair<TokenId, float>>{{11, 2.5f}, {50256, -100.0f}}));
  for (const char* body :
       {R"({"prompt":"x","presence_penalty":2.5})", R"({"prompt":"x","frequency_penalty":-3})",
        R"({"prompt":"x","frequency_penalty":"high"})"})
    EXPECT_NE(error_param(Endpoint::kCompletions, body).find("penalty"), std::string::npos) << body;
  EXPECT_EQ(error_param(Endpoint::kCompletions, R"({"prompt":"x","repetition_penalty":0})"),
            "repetition_penalty");
  for (const char* bias : {R"({"x":1})", R"({"-1":1})", R"({"999999999":1})", R"({"5":101})",
                           R"({"5":"1"})", R"({"5":1,"05":2})", R"([1])"})
    EXPECT_EQ(error_param(Endpoint::kCompletions,
                          std::string(R"({"prompt":"x","logit_bias":)") + bias + "}"),
              "logit_bias")
        << bias;
}

TEST_F(OpenAiTest, AddGenerationPromptCanBeTurnedOff) {
  const ChatTemplate t(
      "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}[assistant]{% endif %}",
      "", "");
  const auto text = [&](const std::string& body) {
    return tokenizer_->decode(
        parse_api_request(Endpoint::kChatCompletions, json::parse(body), *tokenizer_, &t).prompt);
  };
  EXPECT_EQ(text(R"({"messages":[{"role":"user","content":"Hi"}]})"), "[user]Hi[assistant]");
  EXPECT_EQ(text(R"({"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false})"),
            "[user]Hi");
}

// A prompt whose bytes alone cannot fit the context is refused before it is tokenized.
TEST_F(OpenAiTest, APromptTooLongInBytesIsRefusedBeforeTokenizing) {
  const int64_t bound = max_prompt_bytes(*tokenizer_, 8192);
  // Llama-3's longest token is over a hundred bytes (runs of spaces, dashes...).
  EXPECT_GT(bound, 8191 * 16);
  EXPECT_LT(bound, 8191 * 1024);
  RequestLimits limits;
  limits.max_prompt_bytes = bound;
  const json ok = {{"prompt", std::string(1000, 'a')}};
  EXPECT_NO_THROW(parse_api_request(Endpoint::kCompletions, ok, *tokenizer_, template_, limits));
  // 60 MB: refused at once (it took 24 s and 2.4 GB to tokenize before the context check).
  const json huge = {{"prompt", std::string(60u << 20, 'a')}};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    parse_api_request(Endpoint::kCompletions, huge, *tokenizer_, template_, limits);
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "prompt");
  }
  // Generous for a shared CI machine; tokenizing first took 24 s.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  const json chat = {{"messages", {{{"role", "user"}, {"content", std::string(bound + 1, 'a')}}}}};
  try {
    parse_api_request(Endpoint::kChatCompletions, chat, *tokenizer_, template_, limits);
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "messages");
  }
}

TEST_F(OpenAiTest, ContextCheckNamesPromptOrMaxTokens) {
  const json body = json::parse(R"({"prompt":"Hello, my dog","max_tokens":10})");
  const ApiRequest r = parse_api_request(Endpoint::kCompletions, body, *tokenizer_, template_);
  EXPECT_NO_THROW(check_context(r, body, 14));
  try {
    check_context(r, body, 13);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "max_tokens");
  }
  try {
    check_context(r, body, 4);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "prompt");
  }
  // An unset max_tokens is the engine's to clamp.
  const json no_max = json::parse(R"({"prompt":"Hello, my dog"})");
  EXPECT_NO_THROW(check_context(r, no_max, 5));
}

// Fields vLLM answers 400 for, where blend used to accept them and run something else than
// asked (issue 54): each names its parameter, and the valid spelling next to it still passes.
TEST_F(OpenAiTest, FieldCombinationsVllmRefusesAreRefused) {
  const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
  // top_logprobs asks for alternatives that only logprobs: true returns.
  EXPECT_EQ(error_param(Endpoint::kChatCompletions, chat + R"("top_logprobs":3})"), "top_logprobs");
  EXPECT_EQ(error_param(Endpoint::kChatCompletions, chat + R"("logprobs":false,"top_logprobs":3})"),
            "top_logprobs");
  EXPECT_EQ(parse(Endpoint::kChatCompletions, chat + R"("logprobs":true,"top_logprobs":3})")
                .params.logprobs,
            3);
  EXPECT_NO_THROW(parse(Endpoint::kChatCompletions, chat + R"("top_logprobs":0})"));
  // Its range is checked whether or not logprobs is on (OpenAI: 0 to 20).
  for (const char* bad :
       {R"("top_logprobs":50})", R"("top_logprobs":-1})", R"("logprobs":true,"top_logprobs":21})"})
    EXPECT_EQ(error_param(Endpoint::kChatCompletions, chat + bad), "top_logprobs") << bad;
  // stream_options only means something for a stream.
  for (const Endpoint e : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    const std::string head = e == Endpoint::kCompletions ? R"({"prompt":"x",)" : chat;
    EXPECT_EQ(error_param(e, head + R"("stream_options":{"include_usage":true}})"),
              "stream_options");
    EXPECT_EQ(error_param(e, head + R"("stream":false,"stream_options":{"include_usage":true}})"),
              "stream_options");
    EXPECT_TRUE(
        parse(e, head + R"("stream":true,"stream_options":{"include_usage":true}})").include_usage);
    EXPECT_NO_THROW(parse(e, head + R"("stream_options":null})"));
    // Options it does not know would change the stream: refused by name (vLLM's
    // continuous_usage_stats is implemented: tests/api/completions_test.cc).
    EXPECT_EQ(error_param(e, head + R"("stream":true,"stream_options":{"frobnicate":1}})"),
              "stream_options");
    EXPECT_NO_THROW(parse(e, head +
                                 R"("stream":true,"stream_options":{"include_usage":false,)"
                                 R"("continuous_usage_stats":false,"include_obfuscation":true}})"));
    // A stop id the model cannot produce would never stop anything.
    const std::string past_vocab = std::to_string(tokenizer_->vocab_size());
    EXPECT_EQ(error_param(e, head + R"("stop_token_ids":[5,)" + past_vocab + "]}"),
              "stop_token_ids");
    const std::string last = std::to_string(tokenizer_->vocab_size() - 1);
    EXPECT_EQ(parse(e, head + R"("stop_token_ids":[5,)" + last + "]}").params.stop_token_ids,
              (std::vector<TokenId>{5, tokenizer_->vocab_size() - 1}));
    // Nothing to generate is not a request (vLLM: "max_tokens must be at least 1").
    EXPECT_EQ(error_param(e, head + R"("max_tokens":0})"), "max_tokens");
    EXPECT_EQ(parse(e, head + R"("max_tokens":1})").params.max_tokens, 1);
  }
  EXPECT_EQ(error_param(Endpoint::kChatCompletions, chat + R"("max_completion_tokens":0})"),
            "max_completion_tokens");
}

// A NUL in the input (JSON "\u0000") survives: in a chat message's content it reaches the
// rendered prompt, and an error message quoting it is whole (what() is a C string: it was cut
// at the NUL, "Unrecognized request argument supplied: 'fro").
TEST_F(OpenAiTest, NulBytesAreKeptInMessagesAndErrors) {
  const ApiRequest r =
      parse(Endpoint::kChatCompletions, R"({"messages":[{"role":"user","content":"a\u0000b"}]})");
  EXPECT_NE(tokenizer_->decode(r.prompt).find(std::string("a\0b", 3)), std::string::npos);
  try {
    parse(Endpoint::kCompletions, R"({"prompt":"x","fro\u0000b":1})");
    FAIL() << "expected an error";
  } catch (const ApiError& e) {
    const std::string message = e.body()["error"]["message"];
    EXPECT_NE(message.find("'fro\\u0000b' (/v1/completions)"), std::string::npos) << message;
    EXPECT_EQ(e.body()["error"]["param"], std::string("fro\0b", 5));
  }
}

// vLLM's spellings of a JSON format (guided_json, structured_outputs) are response_format:
// the same schema compiles to the same grammar whichever names it (they were refused with
// "structured output is not supported"). What vLLM's fields ask beyond JSON is refused by name.
TEST_F(OpenAiTest, VllmStructuredOutputFieldsAreResponseFormat) {
  GrammarCompiler grammars(*tokenizer_, tokenizer_->vocab_size(),
                           {*tokenizer_->token_id("<|eot_id|>")});
  RequestLimits limits;
  limits.grammars = &grammars;
  const auto constraint = [&](const std::string& fields) {
    const json body =
        json::parse(R"({"messages":[{"role":"user","content":"Hi"}],)" + fields + "}");
    return parse_api_request(Endpoint::kChatCompletions, body, *tokenizer_, template_, limits)
        .params.constraint;
  };
  const std::string schema =
      R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})";
  const auto by_response_format = constraint(
      R"("response_format":{"type":"json_schema","json_schema":{"schema":)" + schema + "}}");
  ASSERT_NE(by_response_format, nullptr);
  EXPECT_EQ(constraint(R"("guided_json":)" + schema), by_response_format);
  EXPECT_EQ(constraint(R"("guided_json":)" + json(schema).dump()), by_response_format);  // text
  EXPECT_EQ(constraint(R"("structured_outputs":{"json":)" + schema + "}"), by_response_format);
  EXPECT_NE(constraint(R"("structured_outputs":{"json_object":true})"), nullptr);
  EXPECT_EQ(constraint(R"("structured_outputs":{"json_object":false})"), nullptr);
  const std::pair<std::string, std::string> refused[] = {
      {R"("guided_json":{},"response_format":{"type":"json_object"})", "guided_json"},
      {R"("guided_json":"{not json")", "guided_json"},
      {R"("guided_json":{"type":"string","pattern":"a"})", "guided_json"},
      {R"("structured_outputs":{"choice":["a","b"]})", "structured_outputs"},
      {R"("structured_outputs":{"json":{},"json_object":true})", "structured_outputs"},
      {R"("structured_outputs":{"json_object":"yes"})", "structured_outputs"},
      {R"("structured_outputs":[])", "structured_outputs"},
      {R"("guided_regex":"a+")", "guided_regex"},
  };
  for (const auto& [fields, param] : refused) {
    try {
      constraint(fields);
      ADD_FAILURE() << fields << " was accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.param(), param) << fields << ": " << e.what();
    }
  }
}

// The assistant turn blend itself returns (content null beside tool_calls) is accepted back:
// null content reaches the template as "", as vLLM passes it.
TEST_F(OpenAiTest, NullContentReachesTheTemplateAsEmptyText) {
  const auto text = [&](const std::string& body, const ChatTemplate* t) {
    return tokenizer_->decode(
        parse_api_request(Endpoint::kChatCompletions, json::parse(body), *tokenizer_, t).prompt);
  };
  // Llama 3's template trims every content.
  const std::string llama = text(R"({"messages":[{"role":"user","content":"Hi"},)"
                                 R"({"role":"assistant","content":null},)"
                                 R"({"role":"user","content":"Again"}]})",
                                 template_);
  EXPECT_NE(llama.find("<|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>"),
            std::string::npos)
      << llama;
  const ChatTemplate qwen3(
      read_regular_file(
          std::string(BLEND_SOURCE_DIR) + "/tests/text/data/chat_templates/qwen3.jinja", 1 << 20),
      "", "<|im_end|>");
  const std::string qwen = text(
      R"({"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,)"
      R"("tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather",)"
      R"("arguments":"{\"location\":\"Paris\"}"}}]},)"
      R"({"role":"tool","tool_call_id":"c1","content":"sunny"}]})",
      &qwen3);
  EXPECT_NE(qwen.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\""),
            std::string::npos)
      << qwen;
}

TEST(BatchFile, ReadsLinesAndRejectsDuplicateIds) {
  testing::TempDir dir;
  testing::write_file(
      dir / "in.jsonl",
      R"({"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"x"}})"
      "\n\n{oops\n"
      R"({"custom_id":"b","url":"/v1/completions"})"
      "\n");
  auto lines = read_batch_input(dir / "in.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_FALSE(lines[0].error.has_value());
  EXPECT_EQ(lines[1].custom_id, unreadable_line_key(3));  // no custom_id to read
  EXPECT_TRUE(lines[1].error.has_value());
  EXPECT_EQ(lines[2].custom_id, "b");
  EXPECT_TRUE(lines[2].error.has_value());  // no body
  testing::write_file(dir / "dup.jsonl", "{\"custom_id\":\"a\"}\n{\"custom_id\":\"a\"}\n");
  EXPECT_THROW(read_batch_input(dir / "dup.jsonl"), Error);
  EXPECT_THROW(read_batch_input(dir / "missing.jsonl"), Error);
}

TEST(BatchFile, WriterRepairsATornLastLineAndKnowsWhatIsDone) {
  testing::TempDir dir;
  const auto path = dir / "out.jsonl";
  {
    BatchResultWriter w(path);
    w.write_success("a", {{"x", 1}});
    w.write_error("b", 400, {{"error", {{"message", "no"}}}});
  }
  // A kill in the middle of a write leaves a partial line.
  testing::write_file(path,
                      testing::read_file(path) + R"({"id":"batch_req_1","custom_id":"c","resp)");
  BatchResultWriter w(path);
  EXPECT_EQ(w.done_ids().size(), 2u);
  EXPECT_TRUE(w.done_ids().count("a"));
  EXPECT_FALSE(w.done_ids().count("c"));
  w.write_success("c", {{"x", 3}});
  const std::string text = testing::read_file(path);
  size_t lines = 0;
  for (char ch : text) lines += ch == '\n';
  EXPECT_EQ(lines, 3u);
  EXPECT_EQ(text.find("resp)"), std::string::npos);
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    EXPECT_TRUE(json::accept(text.substr(start, end - start))) << text.substr(start, end - start);
    start = end + 1;
  }
}

// vLLM's output fields reach SamplingParams, checked as vLLM checks them; the ones a grammar
// cannot honour are refused beside one by name.
TEST_F(OpenAiTest, VllmOutputFieldsAreParsedAndChecked) {
  const std::string chat = R"({"messages":[{"role":"user","content":"Hi"}],)";
  SamplingParams p = parse(Endpoint::kCompletions, R"({"prompt":"x"})").params;
  EXPECT_EQ(p.min_tokens, 0);
  EXPECT_FALSE(p.include_stop_str_in_output);
  EXPECT_TRUE(p.skip_special_tokens);
  p = parse(Endpoint::kCompletions,
            R"({"prompt":"x","max_tokens":9,"min_tokens":9,"include_stop_str_in_output":true,)"
            R"("skip_special_tokens":false,"spaces_between_special_tokens":false})")
          .params;
  EXPECT_EQ(p.min_tokens, 9);
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_FALSE(p.skip_special_tokens);
  EXPECT_EQ(parse(Endpoint::kChatCompletions, chat + R"("min_tokens":500})").params.min_tokens,
            500);
  for (const char* bad :
       {R"({"prompt":"x","max_tokens":4,"min_tokens":5})", R"({"prompt":"x","min_tokens":-1})",
        R"({"prompt":"x","min_tokens":1.5})", R"({"prompt":"x","min_tokens":"3"})"})
    EXPECT_EQ(error_param(Endpoint::kCompletions, bad), "min_tokens") << bad;
  EXPECT_EQ(error_param(Endpoint::kChatCompletions,
                        chat + R"("max_completion_tokens":3,"min_tokens":4})"),
            "min_tokens");
  for (const char* field :
       {"include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens"})
    EXPECT_EQ(error_param(Endpoint::kCompletions,
                          std::string(R"({"prompt":"x",")") + field + R"(":"yes"})"),
              field);

  GrammarCompiler grammars(*tokenizer_, tokenizer_->vocab_size(),
                           {*tokenizer_->token_id("<|eot_id|>")});
  RequestLimits limits;
  limits.grammars = &grammars;
  const auto refused = [&](const std::string& body) {
    try {
      parse_api_request(Endpoint::kChatCompletions, json::parse(body), *tokenizer_, template_,
                        limits);
    } catch (const ApiError& e) {
      return e.param();
    }
    return std::string("<no error>");
  };
  const std::string json_format = R"("response_format":{"type":"json_object"},)";
  EXPECT_EQ(refused(chat + json_format + R"("min_tokens":2})"), "min_tokens");
  EXPECT_EQ(refused(chat + json_format + R"("include_stop_str_in_output":true})"),
            "include_stop_str_in_output");
  EXPECT_EQ(refused(chat + json_format + R"("min_tokens":0,"skip_special_tokens":false})"),
            "<no error>");
}

// stop_reason in every choice: the stop string, the stop token id, or null.
TEST_F(OpenAiTest, ChoicesCarryTheStopReason) {
  const ApiRequest req = parse(Endpoint::kCompletions, R"({"prompt":"Hi","n":3})");
  std::vector<GenerationResult> samples(3);
  for (int32_t i = 0; i < 3; ++i) {
    samples[static_cast<size_t>(i)].index = i;
    samples[static_cast<size_t>(i)].finish = FinishReason::kStop;
  }
  samples[0].stop_reason = std::string("\n\n");
  samples[1].stop_reason = TokenId{128009};
  json body = make_response(req, samples, "cmpl-1", "m", 123, *tokenizer_);
  EXPECT_EQ(body["choices"][0]["stop_reason"], "\n\n");
  EXPECT_EQ(body["choices"][1]["stop_reason"], 128009);
  ASSERT_TRUE(body["choices"][2].contains("stop_reason"));
  EXPECT_TRUE(body["choices"][2]["stop_reason"].is_null());
  body = make_response(
      parse(Endpoint::kChatCompletions, R"({"messages":[{"role":"user","content":"Hi"}]})"),
      samples[1], "chatcmpl-1", "m", 123, *tokenizer_);
  EXPECT_EQ(body["choices"][0]["stop_reason"], 128009);
}

}  // namespace
}  // namespace blend
