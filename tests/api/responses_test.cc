// The Responses API as a translation onto the chat path (api/responses.h): input items,
// instructions, flat tools and text.format become the chat request they mean (the same prompt
// and constraint as that chat request), the refusals name their field in Responses terms, and
// the chat answer and stream chunks become the response object and its events.
#include "api/responses.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "api/openai.h"
#include "grammar/json_schema.h"
#include "llama3_text_fixture.h"

namespace blend {
namespace {

using nlohmann::json;

class ResponsesTest : public Llama3TextTest {
 protected:
  static void SetUpTestSuite() {
    Llama3TextTest::SetUpTestSuite();
    std::ifstream in(std::string(BLEND_SOURCE_DIR) +
                     "/tests/text/data/chat_templates/qwen2.5-instruct.jinja");
    std::stringstream ss;
    ss << in.rdbuf();
    qwen_ = new ChatTemplate(ss.str(), "", "<|im_end|>");
    grammars_ = new GrammarCompiler(*tokenizer_, tokenizer_->vocab_size(), {128001, 128009});
  }
  static void TearDownTestSuite() {
    delete qwen_;
    delete grammars_;
    Llama3TextTest::TearDownTestSuite();
  }

  static RequestLimits limits() {
    RequestLimits l;
    l.grammars = grammars_;
    return l;
  }
  // A /v1/responses body through the translation and the chat parser.
  static ApiRequest parse_responses(const std::string& body, const ChatTemplate* t = qwen_) {
    const ResponsesRequest r = parse_responses_request(json::parse(body), body);
    try {
      return parse_api_request(Endpoint::kChatCompletions, r.chat_body, *tokenizer_, t, limits(),
                               r.chat_raw_body);
    } catch (const ApiError& e) {
      throw responses_error(e);
    }
  }
  static ApiRequest parse_chat(const std::string& body, const ChatTemplate* t = qwen_) {
    return parse_api_request(Endpoint::kChatCompletions, json::parse(body), *tokenizer_, t,
                             limits(), body);
  }
  // The param of the 400 a body gets ("<no error>" when accepted).
  static std::string error_param(const std::string& body) {
    try {
      parse_responses(body);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << e.what();
      return e.param();
    }
    return "<no error>";
  }

  inline static ChatTemplate* qwen_ = nullptr;
  inline static GrammarCompiler* grammars_ = nullptr;
};

TEST_F(ResponsesTest, AStringInputWithInstructionsIsASystemThenAUserMessage) {
  const ResponsesRequest r = parse_responses_request(
      json::parse(R"({"model": "m", "instructions": "Be brief", "input": "Hi",
                      "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3})"));
  EXPECT_EQ(r.chat_body["messages"], json::parse(R"([{"role": "system", "content": "Be brief"},
                                                     {"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(r.chat_body["max_completion_tokens"], 7);
  EXPECT_EQ(r.chat_body["model"], "m");
  EXPECT_FALSE(r.stream);
  const ApiRequest parsed = parse_responses(R"({"instructions": "Be brief", "input": "Hi",
      "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3})");
  const ApiRequest chat = parse_chat(R"({"messages": [{"role": "system", "content": "Be brief"},
      {"role": "user", "content": "Hi"}], "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
      "seed": 3})");
  EXPECT_EQ(parsed.prompt, chat.prompt);
  EXPECT_EQ(parsed.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(parsed.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(parsed.params.top_p, 0.9f);
  EXPECT_EQ(parsed.params.seed, 3u);
}

TEST_F(ResponsesTest, InputItemsBecomeMessagesAndToolTurns) {
  const std::string tool =
      R"({"type": "function", "name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})";
  const std::string body = R"({"tools": [)" + tool + R"(], "input": [
      {"role": "developer", "content": "Use tools"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris"},
                                                      {"type": "input_text", "text": "now"}]},
      {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
       "content": [{"type": "output_text", "text": "Looking", "annotations": []}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
       "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
      {"type": "function_call", "call_id": "call_b", "name": "get_weather",
       "arguments": "{\"city\": \"Lyon\"}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "18C"},
      {"type": "function_call_output", "call_id": "call_b", "output": "20C"}]})";
  const ResponsesRequest r = parse_responses_request(json::parse(body), body);
  EXPECT_EQ(r.chat_body["messages"], json::parse(R"([
      {"role": "system", "content": "Use tools"},
      {"role": "user", "content": [{"type": "text", "text": "Paris"},
                                   {"type": "text", "text": "now"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "Looking"}], "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_b", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}}]},
      {"role": "tool", "tool_call_id": "call_a", "content": "18C"},
      {"role": "tool", "tool_call_id": "call_b", "content": "20C"}])"))
      << r.chat_body.dump(1);
  // The same prompt as the chat request with those messages and the nested tool, key order kept.
  const std::string chat_tool =
      R"({"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})";
  const std::string chat =
      R"({"tools": [)" + chat_tool + R"(], "messages": )" + r.chat_body["messages"].dump() + "}";
  EXPECT_EQ(tokenizer_->decode(parse_responses(body).prompt),
            tokenizer_->decode(parse_chat(chat).prompt));
}

TEST_F(ResponsesTest, FlatToolsAndToolChoiceAreChatsToolsAndConstrainTheCall) {
  const std::string tools =
      R"("tools": [{"type": "function", "name": "lookup", "strict": true,
                    "parameters": {"type": "object", "properties": {"id": {"type": "integer"}},
                                   "required": ["id"], "additionalProperties": false}}])";
  const ApiRequest named = parse_responses(R"({"input": "x", )" + tools +
                                           R"(, "tool_choice": {"type": "function",
                                               "name": "lookup"}})");
  EXPECT_TRUE(named.tool_format.has_value());
  EXPECT_NE(named.params.constraint, nullptr);  // a named function: the call is constrained
  const ApiRequest required =
      parse_responses(R"({"input": "x", )" + tools + R"(, "tool_choice": "required",
                          "parallel_tool_calls": false})");
  EXPECT_NE(required.params.constraint, nullptr);
  EXPECT_EQ(required.max_tool_calls, 1u);
  const ApiRequest automatic = parse_responses(R"({"input": "x", )" + tools + "}");
  EXPECT_TRUE(automatic.tool_format.has_value());
  EXPECT_EQ(automatic.params.constraint, nullptr);
}

TEST_F(ResponsesTest, TextFormatIsResponseFormatThroughTheSameGrammars) {
  const ApiRequest schema = parse_responses(R"({"input": "x", "text": {"format": {
      "type": "json_schema", "name": "thing", "strict": true,
      "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})");
  EXPECT_NE(schema.params.constraint, nullptr);
  EXPECT_NE(parse_responses(R"({"input": "x", "text": {"format": {"type": "json_object"}}})")
                .params.constraint,
            nullptr);
  EXPECT_EQ(
      parse_responses(R"({"input": "x", "text": {"format": {"type": "text"}}})").params.constraint,
      nullptr);
  const ResponsesRequest r = parse_responses_request(json::parse(R"({"input": "x", "text":
      {"format": {"type": "json_schema", "name": "t", "schema": {"type": "string"}}}})"));
  EXPECT_EQ(r.chat_body["response_format"], json::parse(R"({"type": "json_schema",
      "json_schema": {"name": "t", "schema": {"type": "string"}}})"));
  // A schema the grammar cannot hold is chat's refusal, named as text.format.
  EXPECT_EQ(error_param(R"({"input": "x", "text": {"format": {"type": "json_schema",
      "name": "t", "schema": {"$ref": "#"}}}})"),
            "text.format");
}

TEST_F(ResponsesTest, WhatWouldChangeTheResultAndIsNotImplementedIsRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("previous_response_id": "resp_1")", "previous_response_id"},
      {R"("store": true)", "store"},
      {R"("reasoning": {"effort": "high"})", "reasoning"},
      {R"("background": true)", "background"},
      {R"("include": ["message.output_text.logprobs"])", "include"},
      {R"("truncation": "auto")", "truncation"},
      {R"("top_logprobs": 3)", "top_logprobs"},
      {R"("max_tool_calls": 2)", "max_tool_calls"},
      {R"("prompt": {"id": "pmpt_1"})", "prompt"},
      {R"("conversation": "conv_1")", "conversation"},
      {R"("frobnicate": 1)", "frobnicate"},
      {R"("stream_options": {"include_obfuscation": false})", "stream_options"},
      {R"("text": {"verbosity": "low"})", "text.verbosity"},
      {R"("text": {"format": {"type": "grammar"}})", "text.format"},
      {R"("tools": [{"type": "web_search_preview"}])", "tools[0].type"},
      {R"("tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "file_search"})",
       "tool_choice"},
      {R"("metadata": {"k": 1})", "metadata"},
      {R"("stream": "yes")", "stream"},
      {R"("stream": true, "stream_options": {"include_usage": true})", "stream_options"},
      // The chat parser's refusals, named as the Responses body names the field.
      {R"("max_output_tokens": 0)", "max_output_tokens"},
      {R"("tools": [{"type": "function", "description": "no name"}])", "tools[0].name"},
  };
  for (const auto& [field, param] : cases)
    EXPECT_EQ(error_param(std::string(R"({"input": "Hi", )") + field + "}"), param) << field;
  // The input's own: images and files, items blend does not read, bad roles.
  EXPECT_EQ(error_param(R"({"input": [{"role": "user", "content": [{"type": "input_text",
      "text": "a"}, {"type": "input_image", "image_url": "http://x"}]}]})"),
            "input[0].content[1].type");
  EXPECT_EQ(error_param(R"({"input": [{"role": "user", "content": "a"},
      {"type": "reasoning", "summary": []}]})"),
            "input[1].type");
  EXPECT_EQ(error_param(R"({"input": [{"role": "tool", "content": "a"}]})"), "input[0].role");
  EXPECT_EQ(error_param(R"({"input": [{"type": "function_call_output", "output": "a"}]})"),
            "input[0].call_id");
  EXPECT_EQ(error_param(R"({"input": []})"), "input");
  EXPECT_EQ(error_param(R"({"model": "m"})"), "input");
  // Their defaults are accepted.
  EXPECT_EQ(error_param(R"({"input": "Hi", "store": false, "truncation": "disabled",
      "background": false, "reasoning": {"effort": null}, "include": [], "metadata": {"k": "v"},
      "user": "u", "stream": true, "stream_options": {"include_obfuscation": false}})"),
            "<no error>");
}

TEST_F(ResponsesTest, TheChatAnswerBecomesAResponseObject) {
  const ResponsesRequest request = parse_responses_request(json::parse(
      R"({"input": "Hi", "instructions": "Be brief", "max_output_tokens": 4,
          "metadata": {"k": "v"}})"));
  const json usage = {{"prompt_tokens", 5},
                      {"completion_tokens", 4},
                      {"total_tokens", 9},
                      {"prompt_tokens_details", {{"cached_tokens", 2}}}};
  const json cut = {{"model", "tiny"},
                    {"choices",
                     {{{"index", 0},
                       {"finish_reason", "length"},
                       {"message", {{"role", "assistant"}, {"content", "abcd"}}}}}},
                    {"usage", usage}};
  const json r = responses_from_chat(request, cut, "resp_1", 100);
  EXPECT_EQ(r["id"], "resp_1");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["created_at"], 100);
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"], json({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(r["instructions"], "Be brief");
  EXPECT_EQ(r["max_output_tokens"], 4);
  EXPECT_EQ(r["metadata"], json({{"k", "v"}}));
  ASSERT_EQ(r["output"].size(), 1u);
  const json& message = r["output"][0];
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(message["content"][0]["type"], "output_text");
  EXPECT_EQ(message["content"][0]["text"], "abcd");
  EXPECT_EQ(message["content"][0]["annotations"], json::array());
  EXPECT_EQ(r["usage"], json::parse(R"({"input_tokens": 5, "input_tokens_details":
      {"cached_tokens": 2}, "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0},
      "total_tokens": 9})"));

  const json calls = {{"model", "tiny"},
                      {"choices",
                       {{{"index", 0},
                         {"finish_reason", "tool_calls"},
                         {"message",
                          {{"role", "assistant"},
                           {"content", nullptr},
                           {"tool_calls",
                            {{{"id", "call_x"},
                              {"type", "function"},
                              {"function", {{"name", "f"}, {"arguments", "{\"a\":1}"}}}}}}}}}}},
                      {"usage", usage}};
  const json c = responses_from_chat(request, calls, "resp_2", 100);
  EXPECT_EQ(c["status"], "completed");
  EXPECT_TRUE(c["incomplete_details"].is_null());
  ASSERT_EQ(c["output"].size(), 1u) << c.dump();  // only the call: no empty message
  EXPECT_EQ(c["output"][0]["type"], "function_call");
  EXPECT_EQ(c["output"][0]["call_id"], "call_x");
  EXPECT_EQ(c["output"][0]["name"], "f");
  EXPECT_EQ(c["output"][0]["arguments"], "{\"a\":1}");
  EXPECT_EQ(c["output"][0]["id"].get<std::string>().rfind("fc_", 0), 0u);
}

// The SSE events of a stream, as (type, data) pairs.
std::vector<json> parse_events(const std::string& sse) {
  std::vector<json> out;
  std::istringstream in(sse);
  std::string line, type;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) type = line.substr(7);
    if (line.rfind("data: ", 0) != 0) continue;
    json data = json::parse(line.substr(6));
    EXPECT_EQ(data["type"], type) << line;
    out.push_back(std::move(data));
  }
  return out;
}

std::vector<std::string> types_of(const std::vector<json>& events) {
  std::vector<std::string> types;
  for (const json& e : events) types.push_back(e["type"]);
  return types;
}

json content_chunk(const std::string& text) {
  return {{"choices", {{{"index", 0}, {"delta", {{"content", text}}}}}}};
}

TEST_F(ResponsesTest, StreamEventsComeInOpenAisOrderWithSequenceNumbers) {
  const ResponsesRequest request = parse_responses_request(json::parse(R"({"input": "Hi"})"));
  ResponsesEvents events(request, "resp_1", "tiny", 100);
  std::string sse = events.start();
  sse += events.chat_chunk(content_chunk("Hel"));
  sse += events.chat_chunk(nullptr);
  sse += events.chat_chunk(content_chunk("lo"));
  const json usage = {{"prompt_tokens", 3},
                      {"completion_tokens", 2},
                      {"total_tokens", 5},
                      {"prompt_tokens_details", {{"cached_tokens", 0}}}};
  sse += events.finish(FinishReason::kStop, usage);
  const std::vector<json> e = parse_events(sse);
  EXPECT_EQ(types_of(e),
            (std::vector<std::string>{"response.created", "response.in_progress",
                                      "response.output_item.added", "response.content_part.added",
                                      "response.output_text.delta", "response.output_text.delta",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"}));
  for (size_t i = 0; i < e.size(); ++i) EXPECT_EQ(e[i]["sequence_number"], i);
  EXPECT_EQ(e[0]["response"]["status"], "in_progress");
  EXPECT_EQ(e[0]["response"]["output"], json::array());
  EXPECT_EQ(e[4]["delta"].get<std::string>() + e[5]["delta"].get<std::string>(), "Hello");
  EXPECT_EQ(e[6]["text"], "Hello");
  EXPECT_EQ(e[4]["item_id"], e[2]["item"]["id"]);
  EXPECT_EQ(e[8]["item"]["content"][0]["text"], "Hello");
  EXPECT_EQ(e[9]["response"]["status"], "completed");
  EXPECT_EQ(e[9]["response"]["output"][0], e[8]["item"]);
  EXPECT_EQ(e[9]["response"]["usage"]["output_tokens"], 2);
}

TEST_F(ResponsesTest, AStreamedCallClosesTheTextAndIsOneFunctionCallItem) {
  const ResponsesRequest request = parse_responses_request(json::parse(R"({"input": "Hi"})"));
  ResponsesEvents events(request, "resp_1", "tiny", 100);
  std::string sse = events.start() + events.chat_chunk(content_chunk("ok"));
  sse += events.chat_chunk({{"choices",
                             {{{"index", 0},
                               {"delta",
                                {{"tool_calls",
                                  {{{"index", 0},
                                    {"id", "call_x"},
                                    {"type", "function"},
                                    {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}}}}}}});
  sse += events.finish(FinishReason::kLength, nullptr);
  const std::vector<json> e = parse_events(sse);
  EXPECT_EQ(
      types_of(e),
      (std::vector<std::string>{
          "response.created", "response.in_progress", "response.output_item.added",
          "response.content_part.added", "response.output_text.delta", "response.output_text.done",
          "response.content_part.done", "response.output_item.done", "response.output_item.added",
          "response.function_call_arguments.delta", "response.function_call_arguments.done",
          "response.output_item.done", "response.completed"}));
  EXPECT_EQ(e[8]["output_index"], 1);
  EXPECT_EQ(e[8]["item"]["arguments"], "");
  EXPECT_EQ(e[11]["item"]["call_id"], "call_x");
  EXPECT_EQ(e[11]["item"]["arguments"], "{}");
  EXPECT_EQ(e[12]["response"]["status"], "incomplete");
  EXPECT_EQ(e[12]["response"]["output"].size(), 2u);
  // An empty reply is still one (empty) message, as in the whole answer.
  ResponsesEvents empty(request, "resp_2", "tiny", 100);
  const std::vector<json> quiet =
      parse_events(empty.start() + empty.finish(FinishReason::kStop, nullptr));
  ASSERT_EQ(quiet.size(), 8u);
  EXPECT_EQ(quiet.back()["response"]["output"][0]["content"][0]["text"], "");
}

}  // namespace
}  // namespace blend
