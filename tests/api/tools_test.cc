// Tool calling through the OpenAI layer: request checks (each bad field named), tools and tool
// turns rendered through real chat templates (compared with renderings worked out by hand from
// the templates), calls read back into message.tool_calls and stream deltas.
#include "api/tools.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "api/openai.h"
#include "api/stream.h"
#include "grammar/json_schema.h"
#include "llama3_text_fixture.h"

namespace blend {
namespace {

using nlohmann::json;

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(BLEND_SOURCE_DIR) + "/tests/text/data/chat_templates/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Keys in the order a client writes them (not sorted), to check that order reaches the prompt.
const std::string kTool =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Get the weather",)"
    R"( "parameters": {"type": "object", "properties": {"location": {"type": "string",)"
    R"( "maxLength": 20}, "format": {"type": "string", "enum": ["c", "f"]}}, "required":)"
    R"( ["location"]}}})";

class ToolsTest : public Llama3TextTest {
 protected:
  static void SetUpTestSuite() {
    Llama3TextTest::SetUpTestSuite();
    qwen_ = new ChatTemplate(read_template("qwen2.5-instruct.jinja"), "", "<|im_end|>");
    llama31_ = new ChatTemplate(read_template("llama-3.1-instruct.jinja"), "<|begin_of_text|>",
                                "<|eot_id|>");
    mistral_ = new ChatTemplate(read_template("mistral-instruct.jinja"), "<s>", "</s>");
    grammars_ = new GrammarCompiler(*tokenizer_, tokenizer_->vocab_size(), {128001, 128009});
  }
  static void TearDownTestSuite() {
    delete qwen_;
    delete llama31_;
    delete mistral_;
    delete grammars_;
    Llama3TextTest::TearDownTestSuite();
  }

  static ApiRequest parse(const std::string& body, const ChatTemplate* t = qwen_) {
    RequestLimits limits;
    limits.grammars = grammars_;
    return parse_api_request(Endpoint::kChatCompletions, json::parse(body), *tokenizer_, t, limits,
                             body);
  }
  static std::string prompt_text(const std::string& body, const ChatTemplate* t = qwen_) {
    return tokenizer_->decode(parse(body, t).prompt);
  }
  static std::string error_param(const std::string& body, const ChatTemplate* t = qwen_) {
    try {
      parse(body, t);
    } catch (const ApiError& err) {
      EXPECT_EQ(err.status(), 400) << err.what();
      return err.param();
    }
    return "<no error>";
  }

  inline static ChatTemplate* qwen_ = nullptr;
  inline static ChatTemplate* llama31_ = nullptr;
  inline static ChatTemplate* mistral_ = nullptr;
  inline static GrammarCompiler* grammars_ = nullptr;
};

const std::string kUser = R"("messages": [{"role": "user", "content": "Weather in Paris?"}])";

// Qwen2.5's template with tools, by hand: the tools system block (each tool `tojson`, in the
// client's key order, Python's ", " / ": " separators), then the turns.
TEST_F(ToolsTest, QwenRendersToolsAsTheTemplateSays) {
  const std::string expected =
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
      "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
      kTool +
      "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(prompt_text("{" + kUser + R"(, "tools": [)" + kTool + "]}"), expected);
  // tool_choice "none" still renders the tools (vLLM's default), and parses nothing.
  const ApiRequest none =
      parse("{" + kUser + R"(, "tools": [)" + kTool + R"(], "tool_choice": "none"})");
  EXPECT_EQ(tokenizer_->decode(none.prompt), expected);
  EXPECT_FALSE(none.tool_format.has_value());
  EXPECT_EQ(none.params.constraint, nullptr);
  const ApiRequest aut = parse("{" + kUser + R"(, "tools": [)" + kTool + "]}");
  EXPECT_EQ(aut.tool_format, ToolCallFormat::kHermes);
  EXPECT_EQ(aut.params.constraint, nullptr);
}

// The next turn: the assistant's call (arguments sent as a JSON string, rendered as the object
// it holds, keys as written) and the tool's result.
const std::string kToolTurn =
    R"("messages": [{"role": "user", "content": "Weather in Paris?"},)"
    R"( {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type":)"
    R"( "function", "function": {"name": "get_weather", "arguments":)"
    R"( "{\"location\": \"Paris\", \"format\": \"c\"}"}}]},)"
    R"( {"role": "tool", "tool_call_id": "call_1", "content": "18C"}])";

TEST_F(ToolsTest, QwenRendersToolCallsAndResults) {
  const std::string text = prompt_text("{" + kToolTurn + R"(, "tools": [)" + kTool + "]}");
  const std::string turns =
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"location\": \"Paris\", \"format\": \"c\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  ASSERT_GE(text.size(), turns.size());
  EXPECT_EQ(text.substr(text.size() - turns.size()), turns) << text;
}

// Llama 3.1: tools go in the first user message (tojson with indent 4); past calls are
// {"name": ..., "parameters": ...} and results come back as "ipython" turns (a string content
// is "iterable" to Jinja, so the template prints it with tojson: quoted).
TEST_F(ToolsTest, Llama31RendersToolsCallsAndResults) {
  const std::string tool_json =
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
      "        \"description\": \"Get the weather\",\n        \"parameters\": {\n"
      "            \"type\": \"object\",\n            \"properties\": {\n"
      "                \"location\": {\n                    \"type\": \"string\",\n"
      "                    \"maxLength\": 20\n                },\n"
      "                \"format\": {\n                    \"type\": \"string\",\n"
      "                    \"enum\": [\n                        \"c\",\n"
      "                        \"f\"\n                    ]\n                }\n"
      "            },\n            \"required\": [\n                \"location\"\n"
      "            ]\n        }\n    }\n}";
  const std::string first =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
      "respond with a JSON for a function call with its proper arguments that best answers the "
      "given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
      "dictionary of argument name and its value}.Do not use variables.\n\n" +
      tool_json + "\n\nWeather in Paris?<|eot_id|>";
  EXPECT_EQ(prompt_text("{" + kUser + R"(, "tools": [)" + kTool + "]}", llama31_),
            first + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(prompt_text("{" + kToolTurn + R"(, "tools": [)" + kTool + "]}", llama31_),
            first +
                "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", "
                "\"parameters\": {\"location\": \"Paris\", \"format\": \"c\"}}<|eot_id|>"
                "<|start_header_id|>ipython<|end_header_id|>\n\n\"18C\"<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(parse("{" + kUser + R"(, "tools": [)" + kTool + "]}", llama31_).tool_format,
            ToolCallFormat::kLlama3Json);
}

TEST_F(ToolsTest, BadRequestsNameTheField) {
  const std::string u = "{" + kUser + ", ";
  const std::string tools = R"("tools": [)" + kTool + "]";
  EXPECT_EQ(error_param(u + R"("tools": {"a": 1}})"), "tools");
  EXPECT_EQ(error_param(u + R"("tools": [5]})"), "tools[0]");
  EXPECT_EQ(error_param(u + R"("tools": [{"type": "code_interpreter"}]})"), "tools[0].type");
  EXPECT_EQ(error_param(u + R"("tools": [{"type": "function"}]})"), "tools[0].function");
  EXPECT_EQ(error_param(u + R"("tools": [)" + kTool +
                        R"(, {"type": "function", "function": {"name": "bad name!"}}]})"),
            "tools[1].function.name");
  EXPECT_EQ(error_param(u + R"("tools": [{"type": "function", "function": {}}]})"),
            "tools[0].function.name");
  EXPECT_EQ(error_param(u + R"("tools": [)" + kTool + "," + kTool + "]}"),
            "tools[1].function.name");
  EXPECT_EQ(error_param(u + R"("tools": [{"type": "function", "function": {"name": "f",)"
                            R"( "parameters": "x"}}]})"),
            "tools[0].function.parameters");
  EXPECT_EQ(error_param(u + R"("tools": [{"type": "function", "function": {"name": "f",)"
                            R"( "parameters": {"type": "string"}}}]})"),
            "tools[0].function.parameters");
  EXPECT_EQ(error_param(u + R"("tools": [{"type": "function", "function": {"name": "f",)"
                            R"( "returns": {}}}]})"),
            "tools[0].function.returns");
  EXPECT_EQ(error_param(u + tools + R"(, "tool_choice": "sometimes"})"), "tool_choice");
  EXPECT_EQ(error_param(u + tools +
                        R"(, "tool_choice": {"type": "function", "function":)"
                        R"( {"name": "nope"}}})"),
            "tool_choice");
  EXPECT_EQ(error_param(u + R"("tool_choice": "required"})"), "tool_choice");
  EXPECT_EQ(error_param(u + tools + R"(, "parallel_tool_calls": "yes"})"), "parallel_tool_calls");
  // A schema keyword the grammar cannot enforce is refused only where it must be enforced.
  const std::string pattern =
      R"("tools": [)" + kTool +
      R"(, {"type": "function", "function": {"name": "f", "parameters": {"type": "object",)"
      R"( "properties": {"a": {"type": "string", "pattern": "^x+$"}}}}}])";
  EXPECT_NO_THROW(parse(u + pattern + "}"));
  EXPECT_EQ(error_param(u + pattern + R"(, "tool_choice": "required"})"),
            "tools[1].function.parameters");
  // Tools with response_format: refused unless tools are only context.
  EXPECT_EQ(error_param(u + tools + R"(, "response_format": {"type": "json_object"}})"),
            "response_format");
  EXPECT_NO_THROW(parse(u + tools +
                        R"(, "tool_choice": "none", "response_format":)"
                        R"( {"type": "json_object"}})"));
  // Templates: one without tools would drop them; one with an unreadable format (Mistral's
  // [TOOL_CALLS]) would return calls as text, unless nothing is parsed ("none").
  EXPECT_EQ(error_param(u + tools + "}", template_), "tools");
  EXPECT_EQ(error_param(u + tools + "}", mistral_), "tools");
  EXPECT_NO_THROW(parse(u + tools + R"(, "tool_choice": "none"})", mistral_));
}

TEST_F(ToolsTest, BadToolTurnsNameTheMessage) {
  const std::string tools = R"(, "tools": [)" + kTool + "]}";
  std::string bad = kToolTurn;
  bad.replace(bad.find(R"("{\"location)"), 1, R"("not json, )");
  EXPECT_EQ(error_param("{" + bad + tools), "messages[1].tool_calls[0].function.arguments");
  bad = kToolTurn;
  bad.replace(bad.find(R"("tool_call_id": "call_1")"), 24, R"("tool_call_id": 7)");
  EXPECT_EQ(error_param("{" + bad + tools), "messages[2].tool_call_id");
  EXPECT_EQ(error_param(R"({"messages": [{"role": "user", "content": "x"}, {"role":)"
                        R"( "assistant", "tool_calls": [{"function": {"name": "f", "arguments":)"
                        R"( "[1]"}}]}]})"),
            "messages[1].tool_calls[0].function.arguments");
  // The Llama 3 test template renders no tool turns: refused, not rendered wrongly.
  EXPECT_EQ(error_param("{" + kToolTurn + "}", template_), "messages[1]");
}

TEST_F(ToolsTest, RequiredAndNamedAreConstrained) {
  const std::string u = "{" + kUser + R"(, "tools": [)" + kTool +
                        R"(, {"type": "function", "function": {"name": "noop"}}])";
  const ApiRequest required = parse(u + R"(, "tool_choice": "required"})");
  ASSERT_NE(required.params.constraint, nullptr);
  const ApiRequest one = parse(u + R"(, "tool_choice": "required", "parallel_tool_calls": false})");
  EXPECT_EQ(one.max_tool_calls, 1u);
  EXPECT_NE(one.params.constraint, required.params.constraint);
  // A named function: one call, parallel or not (the same grammar either way).
  const std::string named_choice =
      R"(, "tool_choice": {"type": "function", "function": {"name": "noop"}})";
  const ApiRequest named = parse(u + named_choice + R"(, "parallel_tool_calls": false})");
  ASSERT_NE(named.params.constraint, nullptr);
  EXPECT_EQ(parse(u + named_choice + "}").params.constraint, named.params.constraint);
  EXPECT_NE(named.params.constraint, required.params.constraint);
  // The same tools and choice share one compiled grammar (GrammarCompiler's cache).
  EXPECT_EQ(parse(u + R"(, "tool_choice": "required"})").params.constraint,
            required.params.constraint);
}

GenerationResult result_of(const std::string& text, FinishReason finish = FinishReason::kStop) {
  GenerationResult r;
  r.text = text;
  r.finish = finish;
  r.tokens = {1, 2, 3};
  return r;
}

TEST_F(ToolsTest, ResponsesCarryToolCalls) {
  ApiRequest req = parse("{" + kUser + R"(, "tools": [)" + kTool + "]}");
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n"
      "</tool_call>";
  json body = make_response(req, result_of(call), "id", "m", 0, *tokenizer_);
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& c = choice["message"]["tool_calls"][0];
  EXPECT_EQ(c["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(c["id"].get<std::string>().size(), 29u);
  EXPECT_EQ(c["type"], "function");
  EXPECT_EQ(c["function"]["name"], "get_weather");
  EXPECT_EQ(c["function"]["arguments"], R"({"location":"Paris"})");
  // Cut by max_tokens after a call: the call is returned, the finish reason stays "length".
  body = make_response(req, result_of(call + "\n<tool_call>\n{\"na", FinishReason::kLength), "id",
                       "m", 0, *tokenizer_);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"].size(), 1u);
  // No call: plain content, no tool_calls key.
  body = make_response(req, result_of("It is sunny. "), "id", "m", 0, *tokenizer_);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "It is sunny. ");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
}

TEST_F(ToolsTest, StreamSendsEachCallAsADelta) {
  ApiRequest req = parse("{" + kUser + R"(, "tools": [)" + kTool + R"(], "stream": true})");
  StreamChunks chunks(req, "id", "m", 0, *tokenizer_);
  const std::string text =
      "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"location\": \"Rome\"}}\n</tool_call>";
  std::string content;
  json calls = json::array();
  auto take = [&](const json& chunk) {
    if (chunk.is_null()) return;
    const json& d = chunk["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const json& c : d["tool_calls"]) calls.push_back(c);
  };
  for (size_t i = 0; i < text.size(); i += 7) take(chunks.delta(text.substr(i, 7), {}));
  take(chunks.flush());
  EXPECT_EQ(content, "Checking.");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[1]["index"], 1);
  EXPECT_EQ(calls[1]["function"]["arguments"], R"({"location":"Rome"})");
  EXPECT_NE(calls[0]["id"], calls[1]["id"]);
  EXPECT_EQ(chunks.finish(FinishReason::kStop)["choices"][0]["finish_reason"], "tool_calls");
}

}  // namespace
}  // namespace blend
