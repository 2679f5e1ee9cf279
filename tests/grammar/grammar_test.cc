#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "text/tokenizer.h"

namespace blend {
namespace {

using nlohmann::json;

const json kPerson = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    "role": {"enum": ["admin", "user", null]},
    "active": {"type": "boolean"},
    "address": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": false}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})");

TEST(GrammarTest, JsonObjectAcceptsObjectsOnly) {
  auto g = json_object_grammar();
  EXPECT_TRUE(g->matches("{}"));
  EXPECT_TRUE(g->matches(R"({"a": [1, 2.5e3, -0, true, null, {"b": "x\n\u00e9\"y"}]})"));
  EXPECT_TRUE(g->matches("{\n  \"a\": 1\n}"));
  EXPECT_TRUE(g->matches("{\"k\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}"));  // UTF-8
  EXPECT_FALSE(g->matches("[]"));
  EXPECT_FALSE(g->matches("{"));
  EXPECT_FALSE(g->matches(" {}"));                        // nothing before the value
  EXPECT_FALSE(g->matches("{}\n"));                       // nor after it
  EXPECT_FALSE(g->matches("{\"a\": 01}"));                // no leading zeros
  EXPECT_FALSE(g->matches("{\"a\": \"\x01\"}"));          // control character in a string
  EXPECT_FALSE(g->matches("{\"a\": \"\\ud800\"}"));       // lone surrogate escape
  EXPECT_FALSE(g->matches("{\"a\": \"\xc3\"}"));          // truncated UTF-8
  EXPECT_FALSE(g->matches("{\"a\": \"\xed\xa0\x80\"}"));  // encoded surrogate
  EXPECT_FALSE(g->matches("{\"a\" : 1,}"));
  EXPECT_TRUE(g->matches_prefix("{\"a\": [1, {\"b"));
}

// FOLLOW sets over bytes: what can come right after JSON whitespace is structure or the first
// byte of a value, never another letter; nothing follows the root.
TEST(GrammarTest, FollowSetsHoldWhatCanComeAfterARule) {
  auto g = json_object_grammar();
  int32_t ws = -1, root = -1;
  for (int32_t r = 0; r < g->num_rules(); ++r) {
    if (g->rule_name(r) == "ws") ws = r;
    if (g->node_rule(g->initial()[0][0]) == r) root = r;
  }
  ASSERT_GE(ws, 0);
  for (char c : std::string("\"{}[],:-0123456789tfn")) EXPECT_TRUE(g->follow(ws).has(c)) << c;
  for (char c : std::string("axyz ")) EXPECT_FALSE(g->follow(ws).has(c)) << c;
  EXPECT_EQ(g->follow(root), ByteSet{});
  // Every byte that really follows ws somewhere in a text is in its set.
  const std::string text = "{ \"a\" : [ 1 , -2 , \"x\" , { } , [ ] , true , false , null ] }";
  for (size_t i = 0; i + 1 < text.size(); ++i)
    if (text[i] == ' ') {
      EXPECT_TRUE(g->follow(ws).has(static_cast<uint8_t>(text[i + 1]))) << i;
    }
}

// The one-node step table agrees with step() wherever it claims to know (a string's interior
// is such a node), and refuses nodes that call, can end, or have a byte on two edges.
TEST(GrammarTest, DeterministicStepsAgreeWithStep) {
  auto g = json_object_grammar();
  int deterministic = 0;
  for (int32_t n = 0; n < g->num_nodes(); ++n)
    for (int b = 0; b < 256; ++b) {
      const int32_t next = g->deterministic_step(n, static_cast<uint8_t>(b));
      if (next == Grammar::kNotDeterministic) continue;
      deterministic += b == 0;
      std::vector<GrammarStack> out;
      g->step({n}, static_cast<uint8_t>(b), out);
      if (next == Grammar::kNoEdge) {
        EXPECT_TRUE(out.empty()) << n << " " << b;
      } else {
        ASSERT_EQ(out.size(), 1u) << n << " " << b;
        EXPECT_EQ(out[0], GrammarStack{next});
      }
    }
  EXPECT_GT(deterministic, 5);  // the string's interior, escapes and UTF-8 continuations
  // The string's interior node: after an opening quote.
  std::vector<GrammarStack> state = g->initial();
  for (char c : std::string("{\"")) state = g->advance(state, static_cast<uint8_t>(c));
  ASSERT_EQ(state.size(), 1u);
  EXPECT_NE(g->deterministic_step(state[0].back(), 'a'), Grammar::kNotDeterministic);
  EXPECT_EQ(g->deterministic_step(state[0].back(), 0x01), Grammar::kNoEdge);
}

// Issue 54: the process-wide registry of rule shapes was bounded by count only, and a large
// enum's rule is one shape holding every value, so each distinct schema stayed in memory (the
// soak's RSS grew by megabytes a schema). Its bytes are bounded now: 40 distinct enums whose
// shapes would hold more than the bound leave it within.
TEST(GrammarTest, DistinctLargeSchemasLeaveTheShapeRegistryBounded) {
  auto enum_schema = [](int i) {
    nlohmann::json values = nlohmann::json::array();
    for (int v = 0; v < 1000; ++v)
      values.push_back("schema " + std::to_string(i) + " value " + std::to_string(v) +
                       std::string(40, 'x'));
    return nlohmann::json{{"enum", values}};
  };
  const size_t before = shape_registry_bytes();
  json_schema_grammar(enum_schema(0));
  const size_t one = shape_registry_bytes() - before;  // the registry did not start over yet
  constexpr size_t kBound = size_t{32} << 20;
  ASSERT_GT(40 * one, kBound + before) << "one schema's shapes: " << one << " bytes";
  for (int i = 1; i < 40; ++i) json_schema_grammar(enum_schema(i));
  EXPECT_LE(shape_registry_bytes(), kBound);
}

TEST(GrammarTest, SchemaObjectsRequiredOptionalAndEnums) {
  auto g = json_schema_grammar(kPerson);
  EXPECT_TRUE(g->matches(R"({"age": 3, "name": "x"})"));
  EXPECT_TRUE(g->matches(
      R"({"active": true, "address": {"city": "Oslo"}, "age": -4, "name": "n", "role": null, "score": 1.5, "tags": ["a", "b"]})"));
  EXPECT_FALSE(g->matches(R"({"name": "x"})"));                            // age is required
  EXPECT_FALSE(g->matches(R"({"age": 3, "name": "x", "z": 1})"));          // no other keys
  EXPECT_FALSE(g->matches(R"({"age": 3.5, "name": "x"})"));                // integer
  EXPECT_FALSE(g->matches(R"({"age": 3, "name": "x", "role": "root"})"));  // enum
  EXPECT_FALSE(g->matches(R"({"age": 3, "name": "x", "tags": ["a", "b", "c", "d"]})"));
  EXPECT_FALSE(g->matches(R"({"address": {}, "age": 3, "name": "x"})"));  // city required
}

TEST(GrammarTest, SchemaArraysAnyOfRefsAndConst) {
  auto g = json_schema_grammar(json::parse(R"({
    "$defs": {"node": {"type": "object",
                       "properties": {"v": {"type": "integer"},
                                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["v"]}},
    "type": "array", "minItems": 2, "maxItems": 3,
    "items": {"anyOf": [{"$ref": "#/$defs/node"}, {"const": "leaf"}, {"type": ["null", "boolean"]}]}
  })"));
  EXPECT_TRUE(g->matches(R"([{"v": 1}, "leaf"])"));
  EXPECT_TRUE(g->matches(R"([{"kids": [{"kids": [], "v": 2}], "v": 1}, null, true])"));
  EXPECT_FALSE(g->matches(R"([{"v": 1}])"));  // minItems
  EXPECT_FALSE(g->matches(R"([1, 2, 3, 4])"));
  EXPECT_FALSE(g->matches(R"(["leaf", "tree"])"));  // const
}

TEST(GrammarTest, StringLengthsCountCharacters) {
  auto g =
      json_schema_grammar(json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  EXPECT_TRUE(g->matches(R"("ab")"));
  EXPECT_TRUE(g->matches("\"\\n\xc3\xa9\u00e9\""));  // an escape and UTF-8: one character each
  EXPECT_FALSE(g->matches(R"("a")"));
  EXPECT_FALSE(g->matches(R"("abcd")"));
}

TEST(GrammarTest, UnsupportedKeywordsAreRefusedByName) {
  for (const char* kw :
       {R"({"type": "string", "pattern": "a+"})", R"({"type": "string", "maxLength": 65})",
        R"({"type": "integer", "minimum": 0})", R"({"oneOf": [{"type": "string"}]})",
        R"({"type": "array", "uniqueItems": true})", R"({"type": "string", "format": "date"})"}) {
    const json s = json::parse(kw);
    std::string name;
    for (const auto& [k, v] : s.items())
      if (k != "type") name = k;
    try {
      json_schema_grammar(s);
      ADD_FAILURE() << kw << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(json_schema_grammar(json::parse(R"({"$ref": "#/$defs/missing"})")), Error);
  EXPECT_THROW(json_schema_grammar(json(false)), Error);
  EXPECT_NO_THROW(json_schema_grammar(json::parse(R"({"type": "string", "title": "t"})")));
}

// The message of the blend::Error that compiling `schema` throws ("" when it compiles).
std::string schema_error(const json& schema, const GrammarBudget& budget = {}) {
  try {
    json_schema_grammar(schema, budget);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Schemas that no finite JSON text satisfies compiled to a grammar whose matcher got stuck at
// once (an empty mask: "!" reported as a complete answer, issue 54); now they are refused, and
// a branch that can never end is cut out of a schema that has others.
TEST(GrammarTest, SchemasThatMatchNothingFiniteAreRefused) {
  for (
      const char* s : {
          R"({"$ref": "#"})",
          R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
          R"({"anyOf": [{"$ref": "#"}]})",
          R"({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})",
          R"({"type": "array", "minItems": 1, "items": {"$ref": "#"}})",
      }) {
    const std::string e = schema_error(json::parse(s));
    EXPECT_NE(e.find("matches no finite text"), std::string::npos) << s << ": " << e;
  }
  // An anyOf that refers back before any value starts adds nothing: refused by name.
  const std::string left =
      schema_error(json::parse(R"({"anyOf": [{"$ref": "#"}, {"type": "string"}]})"));
  EXPECT_NE(left.find("left recursion"), std::string::npos) << left;
  EXPECT_NE(left.find("$ref #"), std::string::npos) << left;
  // An optional property whose value never ends is never started; the rest stays.
  auto g = json_schema_grammar(json::parse(R"({"$defs": {"loop": {"type": "object",
      "properties": {"next": {"$ref": "#/$defs/loop"}}, "required": ["next"]}},
      "type": "object", "properties": {"a": {"$ref": "#/$defs/loop"}, "b": {"type": "integer"}}})"));
  EXPECT_TRUE(g->matches("{}"));
  EXPECT_TRUE(g->matches(R"({"b": 1})"));
  EXPECT_TRUE(g->matches_prefix(R"({"b)"));
  EXPECT_FALSE(g->matches_prefix(R"({"a)"));
  // Recursion that can end is fine (the tree of SchemaArraysAnyOfRefsAndConst, and this list).
  EXPECT_EQ(
      schema_error(json::parse(
          R"({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
                    "required": ["next"]})")),
      "");
}

// An object's optional properties are a chain of rules that match nothing, one per property:
// with 60 of them, "{}" and an object holding only the last one did not match (the matcher's
// call budget, 64, ran out first). Up to the 256 a schema may list, every one is reachable.
TEST(GrammarTest, ManyOptionalPropertiesCanAllBeLeftOut) {
  for (int k : {60, 256}) {
    json props = json::object();
    for (int i = 0; i < k; ++i) props["p" + std::to_string(i)] = {{"type", "integer"}};
    auto g = json_schema_grammar(json{{"type", "object"}, {"properties", props}});
    EXPECT_TRUE(g->matches("{}")) << k;
    EXPECT_TRUE(g->matches("{\"p" + std::to_string(k - 1) + "\": 1}")) << k;
    EXPECT_TRUE(g->matches("{\"p0\": 1, \"p" + std::to_string(k - 1) + "\": 2}")) << k;
  }
  json props = json::object();
  for (int i = 0; i < 257; ++i) props["p" + std::to_string(i)] = true;
  EXPECT_NE(schema_error(json{{"properties", props}}).find("more than 256 properties"),
            std::string::npos);
}

// Compiling has a node cap, a work budget and a cancel hook, each a clear error; the grammars
// of real schemas (tests/grammar/data) stay far below the defaults, which the header states.
TEST(GrammarTest, CompilationIsBoundedAndCancellable) {
  GrammarBudget few_nodes;
  few_nodes.max_nodes = 50;
  EXPECT_NE(schema_error(kPerson, few_nodes).find("more than 50 automaton nodes"),
            std::string::npos)
      << schema_error(kPerson, few_nodes);
  GrammarBudget little_work;
  little_work.max_work = 1000;
  EXPECT_NE(schema_error(kPerson, little_work).find("more than 1000 steps"), std::string::npos)
      << schema_error(kPerson, little_work);
  int polls = 0;
  GrammarBudget cancelled;
  cancelled.cancelled = [&] { return ++polls >= 2; };
  // An enum of 4,000 values polls often enough to be stopped on its second poll.
  json big = json::array();
  for (int i = 0; i < 4000; ++i) big.push_back("value-" + std::to_string(i));
  const std::string stopped = schema_error(json{{"enum", big}}, cancelled);
  EXPECT_NE(stopped.find("cancelled"), std::string::npos) << stopped;
  EXPECT_EQ(polls, 2);
  // Enum and const values past 128 KB are refused before any node is built for them: a 3 MB
  // enum of long strings held a thread for 564 s in merge_equivalent_nodes (issue 54).
  json huge = json::array();
  for (int i = 0; i < 1000; ++i) huge.push_back(std::string(150, 'a' + i % 26) + std::to_string(i));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string refused = schema_error(json{{"enum", huge}});
  EXPECT_NE(refused.find("more than 131072 bytes"), std::string::npos) << refused;
  // Just under it (~120 KB, 4,096 values): within the default budget, in well under a second
  // of work (the epsilon closures used to clear a mark per state for every node: quadratic).
  json large = json::array();
  for (int i = 0; i < 4096; ++i) large.push_back(std::string(24, 'a' + i % 26) + std::to_string(i));
  auto g = json_schema_grammar(json{{"enum", large}});
  EXPECT_TRUE(g->matches(large[4000].dump()));
  EXPECT_FALSE(g->matches("\"b\""));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 20.0);
  std::printf("a 4,096-value enum of %zu bytes: %d nodes, %zu bytes, %.2f s with the refusal\n",
              large.dump().size(), g->num_nodes(), g->memory_bytes(), seconds);
  std::ifstream in(BLEND_SOURCE_DIR "/tests/grammar/data/schemas.json");
  const json schemas = json::parse(in);
  int most = 0;
  for (const json& schema : schemas) {
    GrammarBudget tight;  // a hundredth of the default work budget, a tenth of the nodes
    tight.max_work = GrammarBudget{}.max_work / 100;
    tight.max_nodes = GrammarBudget{}.max_nodes / 10;
    most = std::max(most, json_schema_grammar(schema, tight)->num_nodes());
  }
  std::printf("the benchmark's %zu schemas: %d nodes at most\n", schemas.size(), most);
}

// A small vocabulary whose tokens straddle every kind of boundary: structure and content in one
// token, escapes and UTF-8 characters split across tokens.
std::vector<std::string> small_vocab() {
  std::vector<std::string> v = {"<eos>"};
  for (int c = 0x20; c < 0x7f; ++c) v.push_back(std::string(1, static_cast<char>(c)));
  for (const char* t :
       {"\",",      "\":",    "{\"",      "\"}",      "\"]",         "[\"",
        "\": \"",   "\", \"", "}}",       "]}",       "},",          "],",
        "true",     "false",  "null",     "12",       "0.",          "e+",
        "-1",       "\\u",    "\\n",      "\\\"",     "d8",          "00e9",
        "\xc3",     "\xa9",   "\xc3\xa9", "\xe2\x82", "\xac",        "\xf0\x9f\x98\x80",
        "\n",       "\n  ",   " {",       "name",     "age",         "\"name",
        "\"age\":", "admin",  "\"user\"", "city",     "\"tags\": [", "\t"})
    v.push_back(t);
  return v;
}

// The same with tokens that leave a rule mid-token: whitespace then a word (refused after
// JSON whitespace by its follow set), the start of a literal that may follow it, or structure;
// a string closed and continued.
std::vector<std::string> small_vocab_with_words() {
  std::vector<std::string> v = small_vocab();
  for (const char* t : {" x", " the", " t", " tr", " true", " n", " null", " ,", " }", "\n\n}",
                        "  \"", " 1", " -", "x\"", "\" ,", "\"x", " :", "\n]"})
    v.push_back(t);
  return v;
}

void expect_masks_match_brute_force(const std::shared_ptr<Grammar>& g, uint64_t seed) {
  auto vocab = std::make_shared<TokenVocab>(small_vocab_with_words(), std::vector<TokenId>{0});
  auto cg = std::make_shared<CompiledGrammar>(g, vocab);
  std::mt19937_64 rng(seed);
  for (int walk = 0; walk < 20; ++walk) {
    std::vector<GrammarStack> state = g->initial();
    for (int step = 0; step < 60; ++step) {
      const TokenMask& fast = *cg->mask_for(state);
      const TokenMask slow = cg->brute_force_mask(state);
      ASSERT_EQ(fast.words, slow.words) << "walk " << walk << " step " << step;
      std::vector<TokenId> allowed;
      for (TokenId t = 0; t < vocab->vocab_size(); ++t)
        if (slow.allows(t)) allowed.push_back(t);
      ASSERT_FALSE(allowed.empty());
      const TokenId t = allowed[rng() % allowed.size()];
      if (t == 0) break;  // EOS: the value is complete
      for (char c : vocab->bytes(t)) state = g->advance(state, static_cast<uint8_t>(c));
      ASSERT_FALSE(state.empty());
    }
  }
}

// A run of sorted tokens sharing a prefix ends where a scan of the common prefix lengths says,
// for every position and every prefix length (run_end jumps over runs rather than scanning).
TEST(TokenMaskTest, PrefixRunsEndWhereAScanEndsThem) {
  std::mt19937 rng(7);
  std::vector<std::string> bytes{""};  // token 0: the end of sequence
  for (int t = 1; t < 3000; ++t) {
    std::string b;
    // Few distinct bytes (long runs; 0 and 0xff at the ends of the order), up to 12 of them
    // (the sort orders on the first 8 first).
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) b.push_back(std::string("ab c\0\xff", 6)[rng() % 6]);
    bytes.push_back(b);
  }
  const TokenVocab vocab(bytes, {0});
  const std::vector<TokenId>& sorted = vocab.sorted();
  ASSERT_EQ(sorted.size(), bytes.size() - 1);
  for (size_t i = 1; i < sorted.size(); ++i)
    ASSERT_LE(vocab.bytes(sorted[i - 1]), vocab.bytes(sorted[i])) << "position " << i;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& b = vocab.bytes(sorted[i]);
    for (size_t len = 1; len <= b.size(); ++len) {
      size_t end = i + 1;
      while (end < sorted.size() && vocab.bytes(sorted[end]).compare(0, len, b, 0, len) == 0) ++end;
      ASSERT_EQ(vocab.run_end(i, len), end) << "position " << i << ", " << len << " bytes";
    }
  }
}

TEST(TokenMaskTest, MasksEqualBruteForceOnASmallVocabulary) {
  expect_masks_match_brute_force(json_object_grammar(), 1);
  expect_masks_match_brute_force(json_schema_grammar(kPerson), 2);
}

// Bounded strings: their positions' tables are derived from the unbounded string's by counting
// characters (escapes and UTF-8 sequences are one each, a partial one counts), so walks go
// through every length up to and at the bounds, minimum lengths, an empty-only string, strings
// in arrays and behind a recursive $ref.
const json kBounded = json::parse(R"({
  "$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "string", "minLength": 1, "maxLength": 2},
    "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
    "required": ["v", "next"], "additionalProperties": false}},
  "type": "object",
  "properties": {
    "a": {"type": "string", "maxLength": 3},
    "b": {"type": "string", "minLength": 2, "maxLength": 5},
    "c": {"type": "string", "minLength": 2},
    "d": {"type": "string", "maxLength": 0},
    "e": {"type": "array", "items": {"type": "string", "maxLength": 1}, "maxItems": 3},
    "n": {"$ref": "#/$defs/node"}
  },
  "required": ["a", "b", "c", "n"],
  "additionalProperties": false
})");

TEST(TokenMaskTest, BoundedStringMasksEqualBruteForce) {
  for (uint64_t seed = 3; seed < 6; ++seed)
    expect_masks_match_brute_force(json_schema_grammar(kBounded), seed);
}

// Tables are shared by rule shape: a second grammar compiled from the same (non-recursive:
// rules that call themselves are not shared) schema builds no node table of its own, and one
// from another schema reuses the common ones and still masks exactly.
TEST(TokenMaskTest, GrammarsShareTablesByRuleShape) {
  auto vocab = std::make_shared<TokenVocab>(small_vocab(), std::vector<TokenId>{0});
  auto walk = [&](const std::shared_ptr<Grammar>& g, const std::string& text) {
    auto cg = std::make_shared<CompiledGrammar>(g, vocab);
    std::vector<GrammarStack> state = g->initial();
    for (char c : text) {
      ASSERT_EQ(cg->mask_for(state)->words, cg->brute_force_mask(state).words) << text;
      state = g->advance(state, static_cast<uint8_t>(c));
      ASSERT_FALSE(state.empty()) << text;
    }
  };
  const std::string text =
      "{\"a\": \"x\\u00e9\", \"b\": \"\xc3\xa9z\", \"c\": \"ab\", "
      "\"n\": {\"next\": null, \"v\": \"q\"}}";
  walk(json_schema_grammar(kBounded), text);
  json flat = kBounded;
  flat["properties"].erase("n");
  flat["required"] = {"a", "b", "c"};
  const std::string flat_text = "{\"a\": \"x\\u00e9\", \"b\": \"\xc3\xa9z\", \"c\": \"ab\"}";
  walk(json_schema_grammar(flat), flat_text);
  const size_t tables = vocab->node_tables.size();
  EXPECT_GT(tables, 10u);
  walk(json_schema_grammar(flat), flat_text);
  EXPECT_EQ(vocab->node_tables.size(), tables);
  walk(json_schema_grammar(json::parse(
           R"({"type": "object", "properties": {"b": {"type": "string", "maxLength": 5},
               "a": {"type": "string", "maxLength": 3}}})")),
       "{\"a\": \"x\\u00e9\", \"b\": \"\xc3\xa9z\"}");
}

// Generates with random allowed tokens until the matcher says the value is complete; every
// output must be a valid JSON text (the schema check proper runs in the engine and server tests
// with python3-jsonschema).
TEST(TokenMaskTest, MatcherRandomOutputsAreCompleteJson) {
  auto vocab = std::make_shared<TokenVocab>(small_vocab(), std::vector<TokenId>{0});
  auto cg = std::make_shared<CompiledGrammar>(json_schema_grammar(kPerson), vocab);
  std::mt19937_64 rng(7);
  int complete = 0;
  for (int i = 0; i < 50; ++i) {
    auto m = cg->start();
    std::string out;
    for (int step = 0; step < 400 && !m->finished(); ++step) {
      auto mask = m->mask();
      std::vector<TokenId> allowed;
      for (TokenId t = 0; t < vocab->vocab_size(); ++t)
        if (mask->allows(t)) allowed.push_back(t);
      // Prefer closing tokens sometimes so that walks end.
      const TokenId t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m->accept(t));
      if (t == 0) break;
      out += vocab->bytes(t);
    }
    if (!m->finished()) continue;
    ++complete;
    const json v = json::parse(out);  // throws if not JSON
    EXPECT_TRUE(v.contains("name") && v["name"].is_string()) << out;
    EXPECT_TRUE(v.contains("age") && v["age"].is_number_integer()) << out;
  }
  EXPECT_GT(complete, 10);
  // A token the mask refuses is refused by accept() too, and changes nothing.
  auto m = cg->start();
  EXPECT_FALSE(m->accept(static_cast<TokenId>(1 + ('a' - 0x20))));
  EXPECT_TRUE(m->accept(static_cast<TokenId>(1 + ('{' - 0x20))));
  EXPECT_FALSE(m->accept(0));  // EOS before the value is complete
}

// The compiler's cache is bounded by bytes, not only by count: distinct large schemas (a
// 60 KB enum each) grew the server by ~14 MB a request once 64 were cached (issue 54).
TEST(TokenMaskTest, GrammarCacheIsBoundedByBytes) {
  auto vocab = std::make_shared<TokenVocab>(small_vocab_with_words(), std::vector<TokenId>{0});
  GrammarCompiler grammars(vocab);
  auto schema = [](int k) {
    json values = json::array();
    for (int i = 0; i < 1500; ++i)
      values.push_back("v" + std::to_string(k) + "-" + std::to_string(i));
    return json{{"enum", values}};
  };
  const auto first =
      std::dynamic_pointer_cast<const CompiledGrammar>(grammars.json_schema(schema(0)));
  ASSERT_NE(first, nullptr);
  const size_t one = first->memory_bytes();
  ASSERT_GT(one, size_t{100000});  // a grammar of this size is worth bounding
  const size_t bound = 4 * one;
  grammars.set_max_cache_bytes(bound);
  for (int k = 1; k < 30; ++k) {
    auto c = grammars.json_schema(schema(k));
    c->start()->mask();  // using a grammar grows it (its tables and masks): counted too
    EXPECT_LE(grammars.cached_bytes(), bound + 2 * one) << k;
  }
  EXPECT_LT(grammars.cached_grammars(), size_t{8});
  EXPECT_GE(grammars.cached_grammars(), size_t{1});
  // The same schema again is still shared while it is cached.
  EXPECT_EQ(grammars.json_schema(schema(29)), grammars.json_schema(schema(29)));
}

TEST(TokenMaskTest, Llama3VocabularyMasksEqualBruteForce) {
  const Tokenizer tok = Tokenizer::from_dir(BLEND_TEST_TOKENIZER_DIR);
  const TokenId eos = *tok.token_id("<|eot_id|>");
  auto vocab = std::make_shared<TokenVocab>(tok, tok.vocab_size(), std::vector<TokenId>{eos});
  auto g = json_schema_grammar(kPerson);
  auto cg = std::make_shared<CompiledGrammar>(g, vocab);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<GrammarStack> state = g->initial();
  for (const char* piece : {"{", "\"", "ag", "e\": ", "1", "2", ", \"name\": \"", "ab\\", "u00",
                            "e9 x\xc3", "\xa9", "\""}) {
    const TokenMask& fast = *cg->mask_for(state);
    const TokenMask slow = cg->brute_force_mask(state);
    ASSERT_EQ(fast.words, slow.words) << "before " << piece;
    for (const char* c = piece; *c; ++c) state = g->advance(state, static_cast<uint8_t>(*c));
    ASSERT_FALSE(state.empty()) << piece;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("12 Llama-3 masks with brute-force checks: %.2f s\n", seconds);
  // A bounded string on the real vocabulary, at every kind of place: before its minimum,
  // inside an escape and a UTF-8 sequence, one short of and at its maximum.
  auto gb = json_schema_grammar(json::parse(
      R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 2,
          "maxLength": 5}}, "required": ["s"], "additionalProperties": false})"));
  auto cgb = std::make_shared<CompiledGrammar>(gb, vocab);
  state = gb->initial();
  for (const char* piece :
       {"{\"s\": \"", "a", "\\", "u00", "e9", "\xc3", "\xa9", "x", "y", "\"", "}"}) {
    ASSERT_EQ(cgb->mask_for(state)->words, cgb->brute_force_mask(state).words)
        << "before " << piece;
    for (const char* c = piece; *c; ++c) state = gb->advance(state, static_cast<uint8_t>(*c));
    ASSERT_FALSE(state.empty()) << piece;
  }
  // Random walks over the benchmark's schemas (tests/grammar/data/schemas.json: nested objects,
  // enums, bounded strings, anyOf, a recursive $ref) on the real vocabulary, where tens of
  // thousands of " word" tokens leave whitespace and strings close mid-token.
  std::ifstream in(BLEND_SOURCE_DIR "/tests/grammar/data/schemas.json");
  const json schemas = json::parse(in);
  std::mt19937_64 rng(11);
  for (size_t i = 0; i < schemas.size(); ++i) {
    auto gs = json_schema_grammar(schemas[i]);
    auto cgs = std::make_shared<CompiledGrammar>(gs, vocab);
    state = gs->initial();
    for (int step = 0; step < 6; ++step) {
      const TokenMask slow = cgs->brute_force_mask(state);
      ASSERT_EQ(cgs->mask_for(state)->words, slow.words) << "schema " << i << " step " << step;
      std::vector<TokenId> allowed;
      for (TokenId t = 0; t < vocab->vocab_size(); ++t)
        if (slow.allows(t) && t != eos) allowed.push_back(t);
      if (allowed.empty()) break;
      for (char c : vocab->bytes(allowed[rng() % allowed.size()]))
        state = gs->advance(state, static_cast<uint8_t>(c));
      ASSERT_FALSE(state.empty());
    }
  }
  // The finished value allows nothing but EOS.
  auto m = cg->start();
  for (TokenId t : tok.encode("{\"age\": 1, \"name\": \"a\"}", false)) ASSERT_TRUE(m->accept(t));
  EXPECT_TRUE(m->finished());
  auto mask = m->mask();
  int allowed = 0;
  for (TokenId t = 0; t < vocab->vocab_size(); ++t) allowed += mask->allows(t);
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(mask->allows(eos));
}

}  // namespace
}  // namespace blend
