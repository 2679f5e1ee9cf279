// The tool-call grammar: what it matches is exactly calls in the model's format whose arguments
// fit the schema, and every text it matches reads back as those calls.
#include "grammar/tool_call_grammar.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/token_mask.h"

namespace blend {
namespace {

using nlohmann::json;

std::vector<ToolGrammarFunction> functions() {
  return {{"get_weather",
           json::parse(R"({"type": "object", "properties": {"city": {"type":)"
                       R"( "string", "maxLength": 8}, "unit": {"enum": ["c",)"
                       R"( "f"]}}, "required": ["city"],)"
                       R"( "additionalProperties": false})"),
           "tools[0].function.parameters"},
          {"noop", json(), "tools[1].function.parameters"}};
}

const std::string kWeather =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
    "\"c\"}}\n</tool_call>";
const std::string kNoop = "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>";

TEST(ToolCallGrammar, HermesMatchesCallsOnly) {
  const auto g = tool_call_grammar(ToolCallFormat::kHermes, functions(), /*parallel=*/false);
  EXPECT_TRUE(g->matches(kWeather));
  EXPECT_TRUE(g->matches(kNoop));
  EXPECT_TRUE(
      g->matches("<tool_call>\n{\"name\": \"noop\", \"arguments\": {\"x\": [1]}}\n"
                 "</tool_call>"));  // no parameters: any object
  for (const std::string& bad : {
           kWeather + "\n" + kNoop,  // one call only without parallel
           std::string("<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n"
                       "</tool_call>"),  // "city" is required
           std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Paris\", \"unit\": \"k\"}}\n</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                       "\"Amsterdam!\"}}\n</tool_call>"),           // over maxLength
           std::string("{\"name\": \"noop\", \"arguments\": {}}"),  // no wrapper
           std::string("Sure. ") + kNoop,                           // no text around calls
       })
    EXPECT_FALSE(g->matches(bad)) << bad;
  EXPECT_TRUE(g->matches_prefix("<tool_call>\n{\"name\": \"get_"));
  EXPECT_FALSE(g->matches_prefix("<tool_call>\n{\"name\": \"x"));

  const auto parallel = tool_call_grammar(ToolCallFormat::kHermes, functions(), true);
  EXPECT_TRUE(parallel->matches(kWeather + "\n" + kNoop + "\n" + kWeather));
  EXPECT_TRUE(parallel->matches(kNoop));
  EXPECT_FALSE(parallel->matches(kWeather + kNoop));  // the newline between calls
  // What matches reads back as the calls.
  const ToolCallOutput out = parse_tool_calls(ToolCallFormat::kHermes, kWeather + "\n" + kNoop);
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
  EXPECT_EQ(out.content, "");
}

TEST(ToolCallGrammar, Llama3JsonIsOneCall) {
  // Llama 3.x renders one call per turn, so even parallel gives exactly one.
  const auto g = tool_call_grammar(ToolCallFormat::kLlama3Json, functions(), true);
  const std::string call = R"({"name": "get_weather", "parameters": {"city": "Oslo"}})";
  EXPECT_TRUE(g->matches(call));
  EXPECT_FALSE(g->matches(call + "; " + call));
  EXPECT_FALSE(g->matches(R"({"name": "get_weather", "arguments": {"city": "Oslo"}})"));
  const ToolCallOutput out = parse_tool_calls(ToolCallFormat::kLlama3Json, call);
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
}

TEST(ToolCallGrammar, ErrorsNameTheSchema) {
  auto fs = functions();
  fs[1].schema = json::parse(R"({"type": "object", "properties": {"a": {"type": "string",)"
                             R"( "format": "date"}}})");
  try {
    tool_call_grammar(ToolCallFormat::kHermes, fs, false);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tools[1].function.parameters"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(tool_call_grammar(ToolCallFormat::kHermes, {}, false), Error);
  EXPECT_NE(tool_call_grammar_key(ToolCallFormat::kHermes, functions(), false),
            tool_call_grammar_key(ToolCallFormat::kHermes, functions(), true));
}

// Token masks over the wrapper text and the JSON inside it, exact at every byte of two
// parallel calls: tokens that cross from the arguments' JSON into the literal text around them
// ("}}\n", "\"}}\n</") leave the JSON rules with bytes their follow sets must hold.
TEST(ToolCallGrammar, MasksEqualBruteForceAcrossTheWrapper) {
  std::vector<std::string> bytes = {"<eos>"};
  for (int c = 0x20; c < 0x7f; ++c) bytes.push_back(std::string(1, static_cast<char>(c)));
  for (const char* t : {"\n",     "<tool_call>", "<tool_call>\n{", "</tool_call>", "\n</", "}}",
                        "}}\n",   "\"}}\n</",    "\"}}",           "\n<",          " \"",  "\": \"",
                        "\", \"", "{}",          " {}}",           "\"c\"}}\n",    " the", " c",
                        "\n\n",   "name",        "arguments",      "Paris"})
    bytes.push_back(t);
  auto vocab = std::make_shared<TokenVocab>(bytes, std::vector<TokenId>{0});
  const auto g = tool_call_grammar(ToolCallFormat::kHermes, functions(), /*parallel=*/true);
  auto cg = std::make_shared<CompiledGrammar>(g, vocab);
  std::vector<GrammarStack> state = g->initial();
  const std::string text = kWeather + "\n" + kNoop;
  for (char c : text) {
    ASSERT_EQ(cg->mask_for(state)->words, cg->brute_force_mask(state).words)
        << "before byte " << static_cast<int>(c);
    state = g->advance(state, static_cast<uint8_t>(c));
    ASSERT_FALSE(state.empty());
  }
  ASSERT_EQ(cg->mask_for(state)->words, cg->brute_force_mask(state).words);
}

// A function whose parameters no finite JSON value satisfies is refused by its path, not
// silently never called; with no function callable the whole grammar is refused.
TEST(ToolCallGrammar, FunctionsThatCannotBeCalledAreRefused) {
  std::vector<ToolGrammarFunction> fs = functions();
  fs.push_back({"loop",
                json::parse(R"({"type": "object", "properties": {"x": {"$ref": "#"}},)"
                            R"( "required": ["x"]})"),
                "tools[2].function.parameters"});
  try {
    tool_call_grammar(ToolCallFormat::kHermes, fs, false);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tools[2].function.parameters"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(tool_call_grammar(ToolCallFormat::kLlama3Json, {fs[2]}, false), Error);
}

}  // namespace
}  // namespace blend
