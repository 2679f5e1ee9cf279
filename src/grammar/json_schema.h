// JSON schema -> grammar: what OpenAI's response_format asks for ({"type": "json_object"} and
// {"type": "json_schema", "json_schema": {"schema": ..., "strict": ...}}), compiled to a
// Grammar whose every complete match is a JSON text valid against the schema.
//
// Supported (the output always satisfies them): type (one or a list), properties (up to 256 an
// object), required,
// additionalProperties (false, true, or a schema when there are no properties), items,
// minItems, maxItems, minLength, maxLength (up to 64), enum, const, anyOf, $ref to "#/$defs/..." /
// "#/definitions/..." (recursion allowed), nested schemas, boolean schema true; annotations (title,
// description, examples, default, $schema, $id, $comment) are ignored, as they change nothing. Any
// other keyword (pattern, format, minimum, oneOf, allOf, uniqueItems, ...) is refused with an error
// naming it, whatever `strict` says: ignoring it could produce output the schema rejects. With
// strict false the output is constrained all the same (as vLLM does); `strict` changes nothing
// else, since unlisted properties are never generated either way.
//
// What the output looks like (each a subset of what the schema allows, so always valid):
//  * properties come in the schema's key order (sorted: JSON objects are unordered) and
//    optional ones may be left out; properties not listed are never generated, unless the
//    object lists none and allows others (then keys are any strings);
//  * whitespace between tokens is at most one space, or a newline and up to 20 spaces/tabs
//    (llama.cpp's bound), so a model cannot pad forever; none before or after the value;
//  * integers have at most 16 digits, fractions at most 16 and exponents at most 3 (llama.cpp
//    bounds the integral part the same way);
//  * strings are valid UTF-8 (no lone surrogate escapes, no control characters).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/constraint.h"
#include "grammar/grammar.h"
#include "grammar/token_mask.h"

namespace blend {

// The grammar of any JSON object (response_format json_object).
std::shared_ptr<Grammar> json_object_grammar();
// The grammar of the JSON texts valid against `schema`. Throws blend::Error naming the
// unsupported keyword or the malformed part, for a schema that no finite JSON text satisfies
// ({"$ref": "#"}, $defs that only refer to each other, required properties that nest without
// end), for an anyOf/$ref loop that refers back before any value starts, for enum and const
// values over 128 KB in all, or past `budget` (Grammar::compile).
std::shared_ptr<Grammar> json_schema_grammar(const nlohmann::json& schema,
                                             const GrammarBudget& budget = {});
// For grammars that embed JSON in other text (grammar/tool_call_grammar.h): adds to `g` the
// rules of the JSON texts valid against `schema` and returns the expression matching one. `$ref`
// "#..." resolves within `schema`; `path` names it in errors. Throws as json_schema_grammar.
GExpr json_schema_expr(Grammar& g, const nlohmann::json& schema, const std::string& path);

// Compiles response formats for one model's vocabulary, and keeps the recent ones: requests
// that bring the same schema share one CompiledGrammar (its node tables and cached masks).
// The cache is bounded by bytes as well as by count (64 grammars): a grammar's nodes, the
// token tables it holds and its cached masks (CompiledGrammar::memory_bytes), counted again
// on each use since they grow with it; past the bound the least recent ones are dropped (their
// memory freed once no running request holds them). Clients that each bring a distinct large
// schema grew the process by ~14 MB a request before (issue 54). Thread-safe.
class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenVocab> vocab) : vocab_(std::move(vocab)) {}
  // The vocabulary is indexed on the first request that needs it (a server that never sees a
  // response_format does not pay for it). The tokenizer must outlive the compiler.
  GrammarCompiler(const Tokenizer& tokenizer, int32_t model_vocab_size,
                  std::vector<TokenId> eos_ids)
      : tokenizer_(&tokenizer), model_vocab_size_(model_vocab_size), eos_ids_(std::move(eos_ids)) {}
  std::shared_ptr<const TokenConstraint> json_object();
  // Throws as json_schema_grammar; `cancelled` is polled while compiling (the client left).
  std::shared_ptr<const TokenConstraint> json_schema(const nlohmann::json& schema,
                                                     std::function<bool()> cancelled = {});
  // Any other grammar (tool calls: grammar/tool_call_grammar.h), compiled by `make` on a cache
  // miss. `key` must identify everything make() depends on, and not start with "schema:" or
  // "json_object" (the keys above).
  std::shared_ptr<const TokenConstraint> grammar(
      const std::string& key, const std::function<std::shared_ptr<Grammar>()>& make) {
    return cached(key, make);
  }
  // The cache's bound in bytes (kDefaultCacheBytes unless set), and what it holds now.
  // 128 MB: what memory_bytes() counts is about half of what the grammars hold (measured: 500 MB
  // live beside a 256 MB bound after 40 distinct 60 KB enum schemas).
  static constexpr size_t kDefaultCacheBytes = size_t{128} << 20;
  void set_max_cache_bytes(size_t bytes) {
    std::lock_guard lock(mu_);
    max_cache_bytes_ = bytes;
  }
  size_t cached_bytes() const;
  size_t cached_grammars() const;

 private:
  std::shared_ptr<const TokenConstraint> cached(
      const std::string& key, const std::function<std::shared_ptr<Grammar>()>& make);
  std::shared_ptr<const TokenVocab> vocab();
  // Drops the least recent grammars past the count or the byte bound; mu_ held.
  void evict_locked();
  std::shared_ptr<const TokenVocab> vocab_;
  const Tokenizer* tokenizer_ = nullptr;
  int32_t model_vocab_size_ = 0;
  std::vector<TokenId> eos_ids_;
  mutable std::mutex mu_;
  size_t max_cache_bytes_ = kDefaultCacheBytes;
  std::list<std::string> lru_;  // most recent first
  std::unordered_map<std::string, std::shared_ptr<const CompiledGrammar>> grammars_;
};

}  // namespace blend
