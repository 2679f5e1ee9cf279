// Structured output through the engine on the tiny random-weight model: every constrained
// output is a complete JSON value of the schema's grammar, masking keeps batch invariance, and
// max_tokens still cuts with finish "length".
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/constraint.h"
#include "engine/engine.h"
#include "grammar/json_schema.h"
#include "grammar/tool_call_grammar.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "run_requests.h"
#include "test_models.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

const json kSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "id": {"type": "integer"},
    "name": {"type": "string", "maxLength": 12},
    "kind": {"enum": ["a", "b", "c"]},
    "ok": {"type": "boolean"},
    "vals": {"type": "array", "items": {"type": "number"}, "maxItems": 4}
  },
  "required": ["id", "kind", "name"],
  "additionalProperties": false
})");

class StructuredTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::write_tiny_model(dir_->path(), 5);
  }
  static void TearDownTestSuite() { delete dir_; }

  static EngineOptions options() {
    EngineOptions o;
    o.threads = 2;
    o.deterministic = true;
    o.kv_memory_gb = 0.05;
    o.overlap = GetParam();
    return o;
  }

  static GenerationRequest request(const std::string& id, uint64_t seed,
                                   std::shared_ptr<const TokenConstraint> constraint) {
    GenerationRequest r;
    r.id = id;
    r.prompt = {128000, 791, 1121, 374};
    r.params.max_tokens = 600;
    r.params.temperature = 1.0f;
    r.params.seed = seed;
    r.params.constraint = std::move(constraint);
    return r;
  }

  static std::map<std::string, GenerationResult> run(Engine& engine,
                                                     std::vector<GenerationRequest> requests) {
    return testing::run_requests(engine, std::move(requests));
  }

  static testing::TempDir* dir_;
};
testing::TempDir* StructuredTest::dir_ = nullptr;

// `text` parsed after each number literal outside strings is replaced by 0 (an integer) or 0.5
// (a fraction or exponent form): JSON allows numbers past a double's range, random weights
// write them (-3325309092358243E744 on the AVX2 path), and nlohmann's parser refuses them. The
// grammar's own matcher checks the literals; this keeps the structure and each number's kind.
json parse_structure(const std::string& text) {
  std::string out;
  bool in_string = false;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      if (c == '"') in_string = false;
      ++i;
    } else if (c == '"') {
      in_string = true;
      out += c;
      ++i;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t end = text.find_first_not_of("-+0123456789.eE", i);
      const std::string literal = text.substr(i, end == std::string::npos ? end : end - i);
      out += literal.find_first_of(".eE") == std::string::npos ? "0" : "0.5";
      i = end == std::string::npos ? text.size() : end;
    } else {
      out += c;
      ++i;
    }
  }
  return json::parse(out);
}

TEST_P(StructuredTest, EveryOutputIsAValueOfTheSchema) {
  Engine engine(dir_->path(), options());
  GrammarCompiler grammars(engine.tokenizer(), engine.config().vocab_size,
                           engine.config().eos_token_ids);
  auto schema = grammars.json_schema(kSchema);
  auto object = grammars.json_object();
  std::vector<GenerationRequest> requests;
  // Random weights rarely pick a closing quote or bracket among 128K tokens, so the json_object
  // requests (strings of any length, any nesting) favour them: their values end in max_tokens.
  const TokenId quote = *engine.tokenizer().token_id("\"");
  const TokenId bracket = *engine.tokenizer().token_id("]");
  const TokenId brace = *engine.tokenizer().token_id("}");
  for (int i = 0; i < 12; ++i) {
    requests.push_back(request("r" + std::to_string(i), 100 + i, i % 3 == 2 ? object : schema));
    if (i % 3 == 2)
      requests.back().params.logit_bias = {{quote, 8.0f}, {bracket, 8.0f}, {brace, 8.0f}};
  }
  const auto out = run(engine, requests);
  const auto g_schema = json_schema_grammar(kSchema);
  const auto g_object = json_object_grammar();
  for (int i = 0; i < 12; ++i) {
    const GenerationResult& r = out.at("r" + std::to_string(i));
    ASSERT_EQ(r.finish, FinishReason::kStop) << r.text;
    const json v = parse_structure(r.text);  // a complete JSON text
    ASSERT_TRUE(v.is_object()) << r.text;
    EXPECT_TRUE((i % 3 == 2 ? g_object : g_schema)->matches(r.text)) << r.text;
    if (i % 3 != 2) {
      EXPECT_TRUE(v["id"].is_number_integer()) << r.text;
      EXPECT_TRUE(v["name"].is_string()) << r.text;
      EXPECT_TRUE(v["kind"] == "a" || v["kind"] == "b" || v["kind"] == "c") << r.text;
    }
  }
}

TEST_P(StructuredTest, MaskingKeepsBatchInvariance) {
  Engine engine(dir_->path(), options());
  GrammarCompiler grammars(engine.tokenizer(), engine.config().vocab_size,
                           engine.config().eos_token_ids);
  auto schema = grammars.json_schema(kSchema);
  const auto alone = run(engine, {request("x", 7, schema)});
  std::vector<GenerationRequest> crowd;
  for (int i = 0; i < 6; ++i) {
    crowd.push_back(request("o" + std::to_string(i), 50 + i, i % 2 ? schema : nullptr));
    crowd.back().params.max_tokens = 40;
  }
  crowd.insert(crowd.begin() + 3, request("x", 7, schema));
  const auto together = run(engine, crowd);
  EXPECT_EQ(alone.at("x").tokens, together.at("x").tokens);
  EXPECT_EQ(alone.at("x").text, together.at("x").text);
}

TEST_P(StructuredTest, MaxTokensCutsWithLengthAndAValidPrefix) {
  Engine engine(dir_->path(), options());
  GrammarCompiler grammars(engine.tokenizer(), engine.config().vocab_size,
                           engine.config().eos_token_ids);
  auto r = request("cut", 3, grammars.json_schema(kSchema));
  r.params.max_tokens = 5;
  const auto out = run(engine, {r});
  EXPECT_EQ(out.at("cut").finish, FinishReason::kLength);
  EXPECT_EQ(out.at("cut").tokens.size(), 5u);
  EXPECT_TRUE(json_schema_grammar(kSchema)->matches_prefix(out.at("cut").text))
      << out.at("cut").text;
}

// A stop string that cuts the constrained value short ends the request with an error, never
// with finish "stop" on output the grammar did not accept (issue 54); one that never meets the
// value leaves it as it was.
TEST_P(StructuredTest, AStopStringInsideTheValueIsAnErrorNotStop) {
  Engine engine(dir_->path(), options());
  GrammarCompiler grammars(engine.tokenizer(), engine.config().vocab_size,
                           engine.config().eos_token_ids);
  auto cut = request("cut", 4, grammars.json_schema(kSchema));
  cut.params.stop = {"\""};  // every value of the schema has its keys quoted
  auto untouched = request("untouched", 4, grammars.json_schema(kSchema));
  untouched.params.stop = {"never in JSON \x01"};
  const auto out = run(engine, {cut, untouched});
  EXPECT_EQ(out.at("cut").finish, FinishReason::kError) << out.at("cut").text;
  EXPECT_NE(out.at("cut").error.find("stop string"), std::string::npos) << out.at("cut").error;
  EXPECT_EQ(out.at("cut").error_param, "stop");  // the request's doing: a 400 (api_error.h)
  const GenerationResult& ok = out.at("untouched");
  ASSERT_NE(ok.finish, FinishReason::kError) << ok.error;
  if (ok.finish == FinishReason::kStop) {
    EXPECT_TRUE(json_schema_grammar(kSchema)->matches(ok.text)) << ok.text;
  }
}

// OpenAI's n: samples of one request (same id and seed, index 0..n-1) each draw from their own
// seed stream, and only the first computes the prompt: the others find it in the prefix cache.
TEST_P(StructuredTest, SamplesOfOnePromptShareOnePrefill) {
  Engine engine(dir_->path(), options());
  std::vector<GenerationRequest> requests;
  GenerationRequest base = request("n", 42, nullptr);
  base.prompt.clear();
  for (int i = 0; i < 40; ++i) base.prompt.push_back(static_cast<TokenId>(1000 + 7 * i));
  base.params.max_tokens = 8;
  std::vector<GenerationResult> results;
  for (int32_t i = 0; i < 4; ++i) {
    GenerationRequest r = base;
    r.index = i;
    engine.submit(std::move(r), [&](GenerationResult&& g) { results.push_back(std::move(g)); });
  }
  engine.run_until_done();
  ASSERT_EQ(results.size(), 4u);
  std::set<std::vector<TokenId>> distinct;
  std::set<int32_t> indices;
  for (const GenerationResult& r : results) {
    distinct.insert(r.tokens);
    indices.insert(r.index);
  }
  EXPECT_EQ(indices, (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_GT(distinct.size(), 1u);
  const EngineStats st = engine.stats();
  // The prompt's 40 tokens are computed once; each other sample computes only its last token
  // (whose logits it needs) and takes the other 39 from the cache.
  EXPECT_EQ(st.cached_prompt_tokens, 3 * 39);
  // A sample is reproducible alone: same seed + index, same tokens.
  GenerationRequest again = base;
  again.index = 2;
  const auto alone = run(engine, {again});
  const auto same = std::find_if(results.begin(), results.end(),
                                 [](const GenerationResult& g) { return g.index == 2; });
  EXPECT_EQ(alone.at("n").tokens, same->tokens);
}

// tool_choice "required": on random weights every output is calls in the model's format (read
// back by the parser: nothing else, no malformed call), each naming a listed function with
// arguments of its schema; one call unless parallel. Strings are bounded (maxLength): random
// weights seldom close one.
TEST_P(StructuredTest, EveryToolCallOutputIsACallOfTheSchema) {
  Engine engine(dir_->path(), options());
  GrammarCompiler grammars(engine.tokenizer(), engine.config().vocab_size,
                           engine.config().eos_token_ids);
  const std::vector<ToolGrammarFunction> functions = {
      {"get_weather",
       json::parse(R"({"type": "object", "properties": {"city": {"type": "string",)"
                   R"( "maxLength": 8}, "unit": {"enum": ["c", "f"]}, "days":)"
                   R"( {"type": "integer"}}, "required": ["city", "days"],)"
                   R"( "additionalProperties": false})"),
       "get_weather"},
      {"lookup",
       json::parse(R"({"type": "object", "properties": {"ok": {"type": "boolean"}},)"
                   R"( "required": ["ok"], "additionalProperties": false})"),
       "lookup"}};
  for (const ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json}) {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < 8; ++i) {
      const bool parallel = i % 2 == 1;
      requests.push_back(request(
          "t" + std::to_string(i), 300 + i,
          grammars.grammar(tool_call_grammar_key(format, functions, parallel),
                           [&] { return tool_call_grammar(format, functions, parallel); })));
      requests.back().params.max_tokens = 1200;
    }
    const auto out = run(engine, requests);
    for (int i = 0; i < 8; ++i) {
      const GenerationResult& r = out.at("t" + std::to_string(i));
      SCOPED_TRACE(r.text);
      ASSERT_EQ(r.finish, FinishReason::kStop);
      const ToolCallOutput calls = parse_tool_calls(format, r.text);
      EXPECT_EQ(calls.content, "");
      ASSERT_GE(calls.calls.size(), 1u);
      if (i % 2 == 0 || format == ToolCallFormat::kLlama3Json) {
        EXPECT_EQ(calls.calls.size(), 1u);
      }
      for (const ParsedToolCall& c : calls.calls) {
        const auto f =
            std::find_if(functions.begin(), functions.end(),
                         [&](const ToolGrammarFunction& fn) { return fn.name == c.name; });
        ASSERT_NE(f, functions.end()) << c.name;
        // The arguments (re-written compactly by the parser) are a value of the schema.
        EXPECT_TRUE(json_schema_grammar(f->schema)->matches(c.arguments)) << c.arguments;
        const json args = json::parse(c.arguments);
        if (c.name == "get_weather") {
          EXPECT_TRUE(args["city"].is_string() && args["days"].is_number_integer());
        } else {
          EXPECT_TRUE(args["ok"].is_boolean());
        }
      }
    }
  }
}

// Overwrites row `row` of tensor `name` in a model folder's model.safetensors with NaN (the
// embedding of one token: a sequence whose prompt holds it computes NaN from there on, the
// others never read it).
void poison_row(const std::filesystem::path& dir, const std::string& name, int64_t row) {
  std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), sizeof header_len);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  const json t = json::parse(header).at(name);
  const std::string dtype = t.at("dtype");
  ASSERT_TRUE(dtype == "BF16" || dtype == "F32") << dtype;
  const size_t elem = dtype == "BF16" ? 2 : 4;
  const int64_t cols = t.at("shape")[1];
  const uint64_t at = 8 + header_len + t.at("data_offsets")[0].get<uint64_t>() +
                      static_cast<uint64_t>(row * cols) * elem;
  const uint32_t nan32 = 0x7fc00000;
  const uint16_t nan16 = 0x7fc0;
  f.seekp(static_cast<std::streamoff>(at));
  for (int64_t c = 0; c < cols; ++c)
    f.write(
        elem == 2 ? reinterpret_cast<const char*>(&nan16) : reinterpret_cast<const char*>(&nan32),
        static_cast<std::streamsize>(elem));
  ASSERT_TRUE(f.good());
}

// A model whose logits are NaN fails the request (FinishReason::kError, a message saying so),
// constrained or not, instead of answering "!" (token 0) as a complete value (issue 54); the
// other requests of the batch are served as before.
TEST_P(StructuredTest, NanLogitsFailTheRequestAloneNeverAnAnswer) {
  testing::TempDir dir;
  testing::write_tiny_model(dir.path(), 5);
  constexpr TokenId kPoisoned = 791;
  poison_row(dir.path(), "model.embed_tokens.weight", kPoisoned);
  Engine engine(dir.path(), options());
  GrammarCompiler grammars(engine.tokenizer(), engine.config().vocab_size,
                           engine.config().eos_token_ids);
  auto constrained = request("nan-json", 1, grammars.json_schema(kSchema));
  auto plain = request("nan-text", 2, nullptr);
  plain.params.max_tokens = 8;
  auto healthy = request("healthy", 3, grammars.json_schema(kSchema));
  healthy.prompt = {128000, 1121, 374, 264};
  ASSERT_NE(std::find(constrained.prompt.begin(), constrained.prompt.end(), kPoisoned),
            constrained.prompt.end());
  const auto out = run(engine, {constrained, plain, healthy});
  for (const char* id : {"nan-json", "nan-text"}) {
    const GenerationResult& r = out.at(id);
    EXPECT_EQ(r.finish, FinishReason::kError) << id << ": " << r.text;
    EXPECT_NE(r.error.find("NaN logits"), std::string::npos) << r.error;
    EXPECT_TRUE(r.error_param.empty());   // the server's failure: a 500
    EXPECT_TRUE(r.tokens.empty()) << id;  // the made-up token is not output
  }
  EXPECT_GT(engine.stats().invalid_logit_rows, 0);
  const GenerationResult& ok = out.at("healthy");
  EXPECT_NE(ok.finish, FinishReason::kError) << ok.error;
  EXPECT_TRUE(ok.error.empty());
  if (ok.finish == FinishReason::kStop) {
    EXPECT_TRUE(json_schema_grammar(kSchema)->matches(ok.text)) << ok.text;
  } else {
    EXPECT_TRUE(json_schema_grammar(kSchema)->matches_prefix(ok.text)) << ok.text;
  }
}

INSTANTIATE_TEST_SUITE_P(Steps, StructuredTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "Overlapped" : "Plain";
                         });

}  // namespace
}  // namespace blend
