#include "grammar/json_schema.h"

#include <malloc.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/error.h"

namespace blend {
namespace {

using nlohmann::json;

// Bounds on what a schema may ask for, so that one request cannot make a huge grammar.
constexpr int kMaxSchemaDepth = 64;
constexpr int64_t kMaxItemsBound = 1024;
constexpr size_t kMaxEnumValues = 4096;
// An object's optional properties are a chain of rules that may match nothing, one per
// property, which a byte may have to descend whole (Grammar's call budget: 1,024); a state's
// stacks grow with the square of its length.
constexpr size_t kMaxProperties = 256;
// Every character position of a bounded string is its own automaton node; their token tables
// are derived from the unbounded string's (cheap), but the automaton grows with the bound.
constexpr int64_t kMaxStringLength = 64;
// Every byte of an enum or const value is an automaton node: a schema whose values alone pass
// the node budget (GrammarBudget::max_nodes) is refused before anything is built for them.
constexpr size_t kMaxLiteralBytes = size_t{1} << 17;

const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "examples", "default", "$schema", "$id", "$comment"};
const std::set<std::string, std::less<>> kSupported = {
    "type",        "properties", "required", "additionalProperties",
    "items",       "minItems",   "maxItems", "enum",
    "const",       "anyOf",      "$ref",     "$defs",
    "definitions", "minLength",  "maxLength"};

ByteSet bytes_of(std::string_view chars) {
  ByteSet s;
  for (char c : chars) s.add(static_cast<uint8_t>(c));
  return s;
}

// Rules shared by every JSON grammar: whitespace, strings, numbers, and any value.
class JsonRules {
 public:
  explicit JsonRules(Grammar& g) : g_(g) {
    // Whitespace is a rule of its own: written into every rule that allows it, its bounded
    // repeat would give each of them 21 more nodes whose token tables must be built.
    const int32_t ws_rule = g.add_rule("ws");
    g.define(ws_rule,
             g_opt(g_alt(
                 {g_lit(" "), g_seq({g_lit("\n"), g_repeat(g_bytes(bytes_of(" \t")), 0, 20)})})));
    ws = g_rule(ws_rule);
    string = g.add_rule("string");
    g.define(string, g_seq({g_lit("\""), g_star(string_char()), g_lit("\"")}));
    const GExpr digit = g_range('0', '9');
    const GExpr int_part =
        g_seq({g_opt(g_lit("-")),
               g_alt({g_lit("0"), g_seq({g_range('1', '9'), g_repeat(digit, 0, 15)})})});
    integer = g.add_rule("integer");
    g.define(integer, int_part);
    number = g.add_rule("number");
    g.define(number, g_seq({int_part, g_opt(g_seq({g_lit("."), g_repeat(digit, 1, 16)})),
                            g_opt(g_seq({g_bytes(bytes_of("eE")), g_opt(g_bytes(bytes_of("+-"))),
                                         g_repeat(digit, 1, 3)}))}));
    boolean = g.add_rule("boolean");
    g.define(boolean, g_alt({g_lit("true"), g_lit("false")}));
    null = g.add_rule("null");
    g.define(null, g_lit("null"));
  }

  // Any JSON value (made on first use: schemas that never need it do not carry it).
  int32_t value() {
    if (value_ >= 0) return value_;
    value_ = g_.add_rule("value");
    const int32_t obj = g_.add_rule("object"), arr = g_.add_rule("array");
    g_.define(obj, object_of(g_rule(string), g_rule(value_)));
    g_.define(arr, array_of(g_rule(value_), 0, -1));
    g_.define(value_, g_alt({g_rule(obj), g_rule(arr), g_rule(string), g_rule(number),
                             g_rule(boolean), g_rule(null)}));
    return value_;
  }
  int32_t object() {
    value();
    return value_ + 1;
  }

  // "{" ws (key ws ":" ws value ws ("," ws key ws ":" ws value ws)*)? "}"
  GExpr object_of(const GExpr& key, const GExpr& val) const {
    const GExpr member = g_seq({key, ws, g_lit(":"), ws, val, ws});
    return g_seq({g_lit("{"), ws, g_opt(g_seq({member, g_star(g_seq({g_lit(","), ws, member}))})),
                  g_lit("}")});
  }
  // "[" ws (item ws ("," ws item ws){min-1, max-1})? "]"
  GExpr array_of(const GExpr& item, int64_t min, int64_t max) const {
    const GExpr first = g_seq({item, ws});
    const GExpr more = g_seq({g_lit(","), ws, item, ws});
    GExpr body;
    if (max == 0) {
      return g_seq({g_lit("["), ws, g_lit("]")});
    }
    const int32_t rest_min = static_cast<int32_t>(std::max<int64_t>(0, min - 1));
    const int32_t rest_max = max < 0 ? -1 : static_cast<int32_t>(max - 1);
    body = g_seq({first, g_repeat(more, rest_min, rest_max)});
    if (min == 0) body = g_opt(body);
    return g_seq({g_lit("["), ws, body, g_lit("]")});
  }

  // A string of min to max characters (code points: an escape or a UTF-8 sequence is one).
  // One rule per bound, shared by every property that uses it: each character position is a
  // node whose token table is built once.
  GExpr bounded_string(int32_t min, int32_t max) {
    auto [it, added] = bounded_.emplace(std::pair{min, max}, -1);
    if (added) {
      it->second = g_.add_rule("bounded_string");
      g_.define(it->second, g_seq({g_lit("\""), g_repeat(string_char(), min, max), g_lit("\"")}));
      // Same characters as `string`: its positions' tables come from string's (token_mask).
      g_.set_counted_string(it->second, {string, min, max});
    }
    return g_rule(it->second);
  }

  GExpr ws;
  int32_t string = -1, integer = -1, number = -1, boolean = -1, null = -1;

 private:
  // One JSON string character: printable ASCII but '"' and '\\', an escape (no lone
  // surrogates), or a well-formed multi-byte UTF-8 sequence (RFC 3629's table).
  static GExpr string_char() {
    ByteSet plain;
    plain.add_range(0x20, 0x7f);
    plain.bits['"' >> 6] &= ~(uint64_t{1} << ('"' & 63));
    plain.bits['\\' >> 6] &= ~(uint64_t{1} << ('\\' & 63));
    ByteSet hex = bytes_of("0123456789abcdefABCDEF");
    const GExpr h = g_bytes(hex);
    const GExpr u_escape =
        g_seq({g_lit("u"), g_alt({g_seq({g_bytes(bytes_of("0123456789abcABCefEF")), h, h, h}),
                                  g_seq({g_bytes(bytes_of("dD")), g_range('0', '7'), h, h})})});
    const GExpr escape = g_seq({g_lit("\\"), g_alt({g_bytes(bytes_of("\"\\/bfnrt")), u_escape})});
    const GExpr cont = g_range(0x80, 0xbf);
    ByteSet e1 = ByteSet{};
    e1.add_range(0xe1, 0xec);
    e1.add(0xee);
    e1.add(0xef);
    const GExpr utf8 = g_alt({
        g_seq({g_range(0xc2, 0xdf), cont}),
        g_seq({g_range(0xe0, 0xe0), g_range(0xa0, 0xbf), cont}),
        g_seq({g_bytes(e1), cont, cont}),
        g_seq({g_range(0xed, 0xed), g_range(0x80, 0x9f), cont}),
        g_seq({g_range(0xf0, 0xf0), g_range(0x90, 0xbf), cont, cont}),
        g_seq({g_range(0xf1, 0xf3), cont, cont, cont}),
        g_seq({g_range(0xf4, 0xf4), g_range(0x80, 0x8f), cont, cont}),
    });
    return g_alt({g_bytes(plain), escape, utf8});
  }

  Grammar& g_;
  int32_t value_ = -1;
  std::map<std::pair<int32_t, int32_t>, int32_t> bounded_;
};

bool has_type(const json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer() || v.is_number_unsigned();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

class SchemaCompiler {
 public:
  SchemaCompiler(Grammar& g, const json& root) : g_(g), root_(root), rules_(g) {}

  GExpr compile(const json& s, const std::string& path, int depth) {
    if (depth > kMaxSchemaDepth)
      throw Error("the schema nests deeper than " + std::to_string(kMaxSchemaDepth) + " levels");
    if (s.is_boolean()) {
      if (s.get<bool>()) return g_rule(rules_.value());
      throw Error(path + ": the schema 'false' matches nothing");
    }
    if (!s.is_object()) throw Error(path + ": a schema must be an object or a boolean");
    std::set<std::string> keys;
    for (const auto& [k, v] : s.items()) {
      if (kAnnotations.count(k)) continue;
      if (!kSupported.count(k))
        throw Error(path + ": the JSON schema keyword '" + k + "' is not supported");
      keys.insert(k);
    }
    auto only = [&](const std::string& kw, std::initializer_list<const char*> with) {
      for (const std::string& k : keys) {
        if (k == kw || k == "$defs" || k == "definitions") continue;
        if (std::find_if(with.begin(), with.end(), [&](const char* w) { return k == w; }) ==
            with.end())
          throw Error(path + ": '" + k + "' beside '" + kw + "' is not supported");
      }
    };
    if (keys.count("$ref")) {
      only("$ref", {});
      return g_rule(ref(s["$ref"], path));
    }
    if (keys.count("anyOf")) {
      only("anyOf", {});
      const json& any = s["anyOf"];
      if (!any.is_array() || any.empty()) throw Error(path + ".anyOf must be a non-empty array");
      std::vector<GExpr> alts;
      for (size_t i = 0; i < any.size(); ++i)
        alts.push_back(compile(any[i], path + ".anyOf[" + std::to_string(i) + "]", depth + 1));
      return g_alt(std::move(alts));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) throw Error(path + ".type must hold strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        throw Error(path + ".type must be a string or a non-empty array of strings");
      }
      for (const std::string& t1 : types)
        if (t1 != "string" && t1 != "integer" && t1 != "number" && t1 != "boolean" &&
            t1 != "null" && t1 != "object" && t1 != "array")
          throw Error(path + ".type '" + t1 + "' is not a JSON schema type");
    }
    if (keys.count("enum") || keys.count("const")) {
      const bool is_enum = keys.count("enum");
      only(is_enum ? "enum" : "const", {"type"});
      std::vector<json> values;
      if (is_enum) {
        const json& e = s["enum"];
        if (!e.is_array() || e.empty()) throw Error(path + ".enum must be a non-empty array");
        if (e.size() > kMaxEnumValues)
          throw Error(path + ".enum has more than " + std::to_string(kMaxEnumValues) + " values");
        values.assign(e.begin(), e.end());
      } else {
        values.push_back(s["const"]);
      }
      std::vector<GExpr> alts;
      std::set<std::string> seen;
      for (const json& v : values) {
        if (!types.empty() &&
            std::none_of(types.begin(), types.end(), [&](const auto& t) { return has_type(v, t); }))
          continue;
        const std::string text = v.dump();
        literal_bytes_ += text.size();
        if (literal_bytes_ > kMaxLiteralBytes)
          throw Error(path + ": the schema's enum and const values total more than " +
                      std::to_string(kMaxLiteralBytes) + " bytes (the limit)");
        if (seen.insert(text).second) alts.push_back(g_lit(text));
      }
      if (alts.empty()) throw Error(path + ": no enum/const value has the schema's type");
      return g_alt(std::move(alts));
    }
    if (types.empty()) {
      // Object keywords constrain objects only, and array keywords arrays: generating the
      // type they describe is one valid choice; with none of them, any value is.
      const bool object_kw =
          keys.count("properties") || keys.count("required") || keys.count("additionalProperties");
      const bool array_kw = keys.count("items") || keys.count("minItems") || keys.count("maxItems");
      if (object_kw && array_kw)
        throw Error(path + ": object and array keywords without a 'type' are not supported");
      if (object_kw)
        types.push_back("object");
      else if (array_kw)
        types.push_back("array");
      else
        return g_rule(rules_.value());
    }
    std::vector<GExpr> alts;
    for (const std::string& t : types) alts.push_back(compile_type(s, t, path, depth));
    return g_alt(std::move(alts));
  }

 private:
  GExpr compile_type(const json& s, const std::string& type, const std::string& path, int depth) {
    if (type == "string") return compile_string(s, path);
    if (type == "integer") return g_rule(rules_.integer);
    if (type == "number") return g_rule(rules_.number);
    if (type == "boolean") return g_rule(rules_.boolean);
    if (type == "null") return g_rule(rules_.null);
    if (type == "array") return compile_array(s, path, depth);
    return compile_object(s, path, depth);
  }

  static int64_t count(const json& s, const std::string& path, const char* kw, int64_t dflt) {
    if (!s.contains(kw)) return dflt;
    const json& v = s[kw];
    if (!v.is_number_integer() && !v.is_number_unsigned())
      throw Error(path + "." + kw + " must be a non-negative integer");
    const int64_t n = v.get<int64_t>();
    if (n < 0) throw Error(path + "." + kw + " must be a non-negative integer");
    return n;
  }

  GExpr compile_string(const json& s, const std::string& path) {
    if (!s.contains("minLength") && !s.contains("maxLength")) return g_rule(rules_.string);
    const int64_t min = count(s, path, "minLength", 0), max = count(s, path, "maxLength", -1);
    if (min > kMaxStringLength || max > kMaxStringLength)
      throw Error(path + ": 'minLength'/'maxLength' above " + std::to_string(kMaxStringLength) +
                  " are not supported");
    if (max >= 0 && max < min) throw Error(path + ": maxLength is below minLength");
    return rules_.bounded_string(static_cast<int32_t>(min), static_cast<int32_t>(max));
  }

  GExpr compile_array(const json& s, const std::string& path, int depth) {
    auto count = [&](const char* kw, int64_t dflt) {
      return SchemaCompiler::count(s, path, kw, dflt);
    };
    const int64_t min = count("minItems", 0), max = count("maxItems", -1);
    if (min > kMaxItemsBound || max > kMaxItemsBound)
      throw Error(path + ": minItems/maxItems above " + std::to_string(kMaxItemsBound) +
                  " are not supported");
    if (max >= 0 && max < min) throw Error(path + ": maxItems is below minItems");
    GExpr item;
    if (!s.contains("items")) {
      item = g_rule(rules_.value());
    } else {
      if (s["items"].is_array())
        throw Error(path + ".items as an array (tuple validation) is not supported");
      const int32_t r = g_.add_rule("items");
      g_.define(r, compile(s["items"], path + ".items", depth + 1));
      item = g_rule(r);
    }
    return rules_.array_of(item, min, max);
  }

  GExpr compile_object(const json& s, const std::string& path, int depth) {
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) throw Error(path + ".properties must be an object");
    if (props.size() > kMaxProperties)
      throw Error(path + ".properties has more than " + std::to_string(kMaxProperties) +
                  " properties (the limit)");
    std::set<std::string> required;
    if (s.contains("required")) {
      const json& r = s["required"];
      if (!r.is_array()) throw Error(path + ".required must be an array of strings");
      for (const json& x : r) {
        if (!x.is_string()) throw Error(path + ".required must be an array of strings");
        if (!props.contains(x.get<std::string>()))
          throw Error(path + ".required names '" + x.get<std::string>() +
                      "', which is not in properties (not supported)");
        required.insert(x.get<std::string>());
      }
    }
    const json additional = s.contains("additionalProperties") ? s["additionalProperties"] : json();
    if (!additional.is_null() && !additional.is_boolean() && !additional.is_object())
      throw Error(path + ".additionalProperties must be a boolean or a schema");
    if (props.empty()) {
      // Only additional properties: keys are any strings.
      if (additional == false) return g_lit("{}");
      GExpr val;
      if (additional.is_object()) {
        const int32_t r = g_.add_rule("additional");
        g_.define(r, compile(additional, path + ".additionalProperties", depth + 1));
        val = g_rule(r);
      } else {
        val = g_rule(rules_.value());
      }
      return rules_.object_of(g_rule(rules_.string), val);
    }
    // Listed properties only, in key order, each optional one present or not: rule
    // rest[i][first] matches the members from property i on, `first` = no comma yet.
    std::vector<std::pair<std::string, GExpr>> members;
    for (const auto& [name, sub] : props.items()) {
      const int32_t r = g_.add_rule("property");
      g_.define(r, compile(sub, path + ".properties." + name, depth + 1));
      members.push_back({name, g_seq({g_lit(json(name).dump()), rules_.ws, g_lit(":"), rules_.ws,
                                      g_rule(r), rules_.ws})});
    }
    const size_t k = members.size();
    std::vector<std::array<int32_t, 2>> rest(k + 1);
    for (size_t i = 0; i <= k; ++i)
      for (int first = 0; first < 2; ++first) rest[i][first] = g_.add_rule("members");
    for (size_t i = k + 1; i-- > 0;) {
      for (int first = 0; first < 2; ++first) {
        if (i == k) {
          g_.define(rest[i][first], g_seq({}));
          continue;
        }
        const GExpr sep = first ? g_seq({}) : g_seq({g_lit(","), rules_.ws});
        const GExpr with = g_seq({sep, members[i].second, g_rule(rest[i + 1][0])});
        if (required.count(members[i].first))
          g_.define(rest[i][first], with);
        else
          g_.define(rest[i][first], g_alt({with, g_rule(rest[i + 1][first])}));
      }
    }
    return g_seq({g_lit("{"), rules_.ws, g_rule(rest[0][1]), g_lit("}")});
  }

  int32_t ref(const json& r, const std::string& path) {
    if (!r.is_string()) throw Error(path + ".$ref must be a string");
    const std::string target = r.get<std::string>();
    auto it = refs_.find(target);
    if (it != refs_.end()) return it->second;
    const json* def = nullptr;
    if (target == "#") {
      def = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (target.rfind(p, 0) != 0) continue;
        const std::string name = target.substr(p.size());
        auto defs = root_.find(p.substr(2, p.size() - 3));
        if (defs == root_.end() || !defs->is_object()) continue;
        if (auto d = defs->find(name); d != defs->end()) def = &*d;
      }
    }
    if (!def)
      throw Error(path + ".$ref '" + target +
                  "' is not supported (only '#', '#/$defs/NAME' and '#/definitions/NAME' that "
                  "exist)");
    const int32_t rule = g_.add_rule("$ref " + target);  // named in the grammar's errors
    refs_[target] = rule;  // before compiling: the definition may refer to itself
    g_.define(rule, compile(*def, target, 1));
    return rule;
  }

  Grammar& g_;
  const json& root_;
  JsonRules rules_;
  std::map<std::string, int32_t> refs_;
  size_t literal_bytes_ = 0;  // of enum and const values so far
};

}  // namespace

std::shared_ptr<Grammar> json_object_grammar() {
  auto g = std::make_shared<Grammar>();
  JsonRules rules(*g);
  const int32_t root = g->add_rule("root");
  g->define(root, g_rule(rules.object()));
  g->compile(root);
  return g;
}

std::shared_ptr<Grammar> json_schema_grammar(const json& schema, const GrammarBudget& budget) {
  auto g = std::make_shared<Grammar>();
  SchemaCompiler c(*g, schema);
  const int32_t root = g->add_rule("schema");
  g->define(root, c.compile(schema, "schema", 0));
  g->compile(root, budget);
  return g;
}

GExpr json_schema_expr(Grammar& g, const json& schema, const std::string& path) {
  // The compiler only builds rules; once compile() returns, g holds all it made.
  SchemaCompiler c(g, schema);
  return c.compile(schema, path, 0);
}

std::shared_ptr<const TokenConstraint> GrammarCompiler::cached(
    const std::string& key, const std::function<std::shared_ptr<Grammar>()>& make) {
  {
    std::lock_guard lock(mu_);
    auto it = grammars_.find(key);
    if (it != grammars_.end()) {
      lru_.remove(key);
      lru_.push_front(key);
      std::shared_ptr<const CompiledGrammar> hit = it->second;
      evict_locked();  // the grammars grow as they are used (tables, masks)
      return hit;
    }
  }
  auto compiled = std::make_shared<const CompiledGrammar>(make(), vocab());
  std::lock_guard lock(mu_);
  auto [it, added] = grammars_.emplace(key, compiled);
  if (added) lru_.push_front(key);
  std::shared_ptr<const CompiledGrammar> kept = it->second;
  evict_locked();
  return kept;
}

void GrammarCompiler::evict_locked() {
  constexpr size_t kMaxGrammars = 64;
  size_t total = 0;
  for (const auto& [key, g] : grammars_) total += g->memory_bytes();
  // The most recent one stays whatever its size: its request holds it anyway.
  size_t evicted = 0;
  while (lru_.size() > 1 && (lru_.size() > kMaxGrammars || total > max_cache_bytes_)) {
    auto it = grammars_.find(lru_.back());
    total -= it->second->memory_bytes();
    evicted += it->second->memory_bytes();
    grammars_.erase(it);
    lru_.pop_back();
  }
  // glibc keeps freed memory in its arenas: without this, 40 distinct 60 KB enum schemas left
  // the server's RSS 560 MB above what it held (measured with malloc_trim called from gdb).
  if (evicted >= (size_t{16} << 20)) ::malloc_trim(0);
}

size_t GrammarCompiler::cached_bytes() const {
  std::lock_guard lock(mu_);
  size_t total = 0;
  for (const auto& [key, g] : grammars_) total += g->memory_bytes();
  return total;
}

size_t GrammarCompiler::cached_grammars() const {
  std::lock_guard lock(mu_);
  return grammars_.size();
}

std::shared_ptr<const TokenVocab> GrammarCompiler::vocab() {
  std::lock_guard lock(mu_);
  if (!vocab_) vocab_ = std::make_shared<TokenVocab>(*tokenizer_, model_vocab_size_, eos_ids_);
  return vocab_;
}

std::shared_ptr<const TokenConstraint> GrammarCompiler::json_object() {
  return cached("json_object", [] { return json_object_grammar(); });
}

std::shared_ptr<const TokenConstraint> GrammarCompiler::json_schema(
    const json& schema, std::function<bool()> cancelled) {
  return cached("schema:" + schema.dump(), [&] {
    GrammarBudget budget;
    budget.cancelled = std::move(cancelled);
    return json_schema_grammar(schema, budget);
  });
}

}  // namespace blend
