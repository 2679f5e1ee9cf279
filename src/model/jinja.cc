// The Jinja engine in four parts, in this order: Python values (and how Python prints, compares
// and serialises them), the lexer (template text -> one token stream, whitespace control
// applied), the parser (one recursive-descent parser, tokens -> syntax tree, following Jinja2's
// grammar) and the renderer (syntax tree + variables -> text). Where Jinja2's behaviour is
// surprising (scoping, precedence, generators), the comment says so; the parity tests hold the
// two engines to the same output.
#include "model/jinja.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/error.h"

namespace blend::jinja {
namespace {

using ojson = nlohmann::ordered_json;

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error("template line " + std::to_string(line) + ": " + what);
}

// ---------------------------------------------------------------------------------------------
// Values: Python's object model, as far as a template can see it.

struct Value;
using List = std::vector<Value>;
struct Dict;

struct Value {
  enum Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };
  Kind kind = kUndefined;
  bool b = false;
  bool tuple = false;  // kList: a Python tuple (prints with parentheses, never equals a list)
  int64_t i = 0;
  double f = 0;
  // kString: the text. kUndefined: what was looked up, for error messages. kFunction: the
  // name. kList: non-empty for Python objects that iterate like a list but are not one
  // ("range(0, 3)", "dict_items"); they print as Python prints them and are not JSON.
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;   // shared: a namespace() changed through one copy is changed
  const Node* macro = nullptr;  // kFunction: the macro, or null for a global function
  std::shared_ptr<bool> spent;  // a generator: iterated already (shared by all copies)

  static Value undefined(std::string what) {
    Value v;
    v.s = std::move(what);
    return v;
  }
  static Value none() { return make(kNone); }
  static Value boolean(bool x) {
    Value v = make(kBool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(kInt);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = make(kFloat);
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v = make(kString);
    v.s = std::move(x);
    return v;
  }
  static Value of_list(List items, bool is_tuple = false) {
    Value v = make(kList);
    v.list = std::make_shared<List>(std::move(items));
    v.tuple = is_tuple;
    return v;
  }
  static Value function(std::string name, const Node* m) {
    Value v = make(kFunction);
    v.s = std::move(name);
    v.macro = m;
    return v;
  }
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
  bool is_undefined() const { return kind == kUndefined; }
  bool is_number() const { return kind == kInt || kind == kFloat || kind == kBool; }
  bool is_integral() const { return kind == kInt || kind == kBool; }  // Python: bool is an int
  int64_t integral() const { return kind == kInt ? i : static_cast<int64_t>(b); }
  double number() const { return kind == kFloat ? f : static_cast<double>(integral()); }
};

struct Dict {
  // A plain dict, a namespace() (the only object `set ns.attr` may change) or a for loop's
  // `loop` object; they differ in how they print, test and serialise.
  enum Type { kPlain, kNamespace, kLoop } type = kPlain;
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python keeps it
  // kLoop: the sequence and the current position, for loop.previtem and loop.nextitem.
  std::shared_ptr<const List> seq;
  size_t at = 0;

  const Value* find(const std::string& key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(key, std::move(v));
  }
};

// What map, select, reject, items, unique and reverse return: in Jinja2 a generator, which
// is always true, has no length and no stable text, and is used up by one iteration. It is
// modelled as a list marked so; iterating it a second time is an error (Python would see it
// empty, or half used), never a second, different rendering.
const char* const kGenerator = "<generator>";

Value generator(List items) {
  Value v = Value::of_list(std::move(items));
  v.s = kGenerator;
  v.spent = std::make_shared<bool>(false);
  return v;
}

// Marks a generator used; throws if it was already.
void consume(const Value& v, int line) {
  if (v.s != kGenerator) return;
  if (*v.spent)
    fail(line,
         "a generator (what map, select, items, ... return) is iterated a second time; "
         "add '| list' where it is made");
  *v.spent = true;
}

Value of_dict(Dict d) {
  Value v = Value::make(Value::kDict);
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}

// How deeply values may nest (template input, and values printed or serialised): deeper is an
// error rather than a stack overflow.
constexpr int kMaxNesting = 512;

Value from_json(const ojson& j, int depth = 0) {
  if (depth > kMaxNesting) throw Error("template input is nested too deeply");
  switch (j.type()) {
    case ojson::value_t::null:
      return Value::none();
    case ojson::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case ojson::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case ojson::value_t::number_unsigned:
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        throw Error("template input: integer " + j.dump() + " is too large");
      return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case ojson::value_t::number_float:
      return Value::real(j.get<double>());
    case ojson::value_t::string:
      return Value::string(j.get<std::string>());
    case ojson::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value::of_list(std::move(items));
    }
    case ojson::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, v] : j.items()) d.items.emplace_back(k, from_json(v, depth + 1));
      return of_dict(std::move(d));
    }
    default:
      throw Error("template input: unsupported JSON value " + j.dump());
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
    case Value::kNone:
      return false;
    case Value::kBool:
      return v.b;
    case Value::kInt:
      return v.i != 0;
    case Value::kFloat:
      return v.f != 0;
    case Value::kString:
      return !v.s.empty();
    case Value::kList:
      return v.s == kGenerator || !v.list->empty();
    case Value::kDict:
      return v.dict->type != Dict::kPlain || !v.dict->items.empty();
    case Value::kFunction:
      return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
      return "Undefined";
    case Value::kNone:
      return "NoneType";
    case Value::kBool:
      return "bool";
    case Value::kInt:
      return "int";
    case Value::kFloat:
      return "float";
    case Value::kString:
      return "str";
    case Value::kList:
      if (v.s == kGenerator) return "generator";
      if (v.s.rfind("range(", 0) == 0) return "range";
      if (!v.s.empty()) return v.s;  // dict_items, dict_keys, dict_values
      return v.tuple ? "tuple" : "list";
    case Value::kDict:
      return v.dict->type == Dict::kNamespace ? "Namespace"
             : v.dict->type == Dict::kLoop    ? "LoopContext"
                                              : "dict";
    case Value::kFunction:
      return v.macro ? "Macro" : "function";
  }
  return "object";
}

// ---------------------------------------------------------------------------------------------
// Text as Python sees it: a sequence of code points. Invalid UTF-8 bytes decode to
// kRawByte + byte and encode back unchanged, so no byte is ever lost.

constexpr uint32_t kRawByte = 0x110000;
using Cps = std::vector<uint32_t>;

uint32_t next_cp(std::string_view s, size_t& k) {
  const auto c = static_cast<unsigned char>(s[k]);
  const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 1) {
    ++k;
    return c;
  }
  if (n == 0 || k + static_cast<size_t>(n) > s.size()) {
    ++k;
    return kRawByte + c;
  }
  uint32_t cp = c & (0x7Fu >> n);
  for (int j = 1; j < n; ++j) {
    const auto cc = static_cast<unsigned char>(s[k + static_cast<size_t>(j)]);
    if ((cc & 0xC0) != 0x80) {
      ++k;
      return kRawByte + c;
    }
    cp = (cp << 6) | (cc & 0x3Fu);
  }
  k += static_cast<size_t>(n);
  return cp;
}

void put_cp(std::string& out, uint32_t cp) {
  if (cp >= kRawByte) {
    out += static_cast<char>(cp - kRawByte);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

Cps to_cps(std::string_view s) {
  Cps out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) out.push_back(next_cp(s, k));
  return out;
}

std::string from_cps(const Cps& cps, size_t b, size_t e) {
  std::string out;
  for (size_t k = b; k < e; ++k) put_cp(out, cps[k]);
  return out;
}

size_t cp_count(std::string_view s) {
  size_t n = 0;
  for (size_t k = 0; k < s.size(); ++n) next_cp(s, k);
  return n;
}

// str.isspace(), which is also what str.strip()/split() and the regex \s use.
bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Simple case mapping for the scripts chat text commonly uses: ASCII, Latin-1, Latin
// Extended-A/B and Extended Additional (Vietnamese), Greek (not polytonic), Cyrillic, Armenian,
// Cherokee and fullwidth Latin. Characters of other scripts are left as they are.
uint32_t map_case(uint32_t c, bool to_upper) {
  struct Offset {
    uint32_t lo, hi;  // upper-case letters in [lo, hi] have their lower case at + delta
    int32_t delta;
  };
  static constexpr Offset kOffsets[] = {
      {'A', 'Z', 32},       {0xC0, 0xD6, 32},   {0xD8, 0xDE, 32},         {0x178, 0x178, -121},
      {0x386, 0x386, 38},   {0x388, 0x38A, 37}, {0x38C, 0x38C, 64},       {0x38E, 0x38F, 63},
      {0x391, 0x3A1, 32},   {0x3A3, 0x3AB, 32}, {0x400, 0x40F, 80},       {0x410, 0x42F, 32},
      {0x4C0, 0x4C0, 15},   {0x531, 0x556, 48}, {0x13A0, 0x13EF, 0x97D0}, {0x13F0, 0x13F5, 8},
      {0xFF21, 0xFF3A, 32},
  };
  struct Pairs {
    uint32_t lo, hi;  // alternating upper (at lo, lo + 2, ...) and lower case letters
  };
  static constexpr Pairs kPairs[] = {
      {0x100, 0x12F}, {0x132, 0x137},   {0x139, 0x148},   {0x14A, 0x177}, {0x179, 0x17E},
      {0x1CD, 0x1DC}, {0x1DE, 0x1EF},   {0x1F4, 0x1F5},   {0x1F8, 0x21F}, {0x222, 0x233},
      {0x246, 0x24F}, {0x3D8, 0x3EF},   {0x460, 0x481},   {0x48A, 0x4BF}, {0x4C1, 0x4CE},
      {0x4D0, 0x52F}, {0x1E00, 0x1E95}, {0x1EA0, 0x1EFF},
  };
  if (c < 0x80) {
    if (to_upper) return c >= 'a' && c <= 'z' ? c - 32 : c;
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
  }
  // The digraphs DŽ Dž dž, LJ Lj lj, NJ Nj nj, DZ Dz dz: upper, title and lower case forms.
  for (uint32_t base : {0x1C4u, 0x1C7u, 0x1CAu, 0x1F1u})
    if (c >= base && c < base + 3) return to_upper ? base : base + 2;
  for (const auto& o : kOffsets) {
    if (to_upper) {
      const auto lo = static_cast<uint32_t>(static_cast<int64_t>(o.lo) + o.delta);
      const auto hi = static_cast<uint32_t>(static_cast<int64_t>(o.hi) + o.delta);
      if (c >= lo && c <= hi) return static_cast<uint32_t>(static_cast<int64_t>(c) - o.delta);
    } else if (c >= o.lo && c <= o.hi) {
      return static_cast<uint32_t>(static_cast<int64_t>(c) + o.delta);
    }
  }
  for (const auto& p : kPairs) {
    if (c < p.lo || c > p.hi) continue;
    const bool is_upper = (c - p.lo) % 2 == 0;
    if (to_upper) return is_upper ? c : c - 1;
    return is_upper && c < p.hi ? c + 1 : c;
  }
  if (to_upper) {
    if (c == 0xB5) return 0x39C;   // micro sign
    if (c == 0x3C2) return 0x3A3;  // final sigma
    if (c == 0x131) return 'I';    // dotless i
    if (c == 0x17F) return 'S';    // long s
  } else if (c == 0x1E9E) {
    return 0xDF;  // capital sharp s
  }
  return c;
}

bool is_upper_cp(uint32_t c) {
  return map_case(c, false) != c || c == 0x130;
}
bool is_lower_cp(uint32_t c) {
  return map_case(c, true) != c || c == 0xDF || c == 0x149;
}
bool is_cased_cp(uint32_t c) {
  return is_upper_cp(c) || is_lower_cp(c);
}

void put_upper(std::string& out, uint32_t c, bool title) {
  if (c == 0xDF) {  // sharp s has no one-letter upper case
    out += title ? "Ss" : "SS";
  } else if (c == 0x149) {
    put_cp(out, 0x2BC);
    out += 'N';
  } else if (title && ((c >= 0x1C4 && c <= 0x1CC) || (c >= 0x1F1 && c <= 0x1F3))) {
    put_cp(out, map_case(c, true) + 1);  // the digraph's title-case form, as Dž
  } else {
    put_cp(out, map_case(c, true));
  }
}

// Lower-cases cps[b, e); Python lower-cases a capital sigma that ends a word (judged within
// all of cps) to final sigma.
void put_lower(std::string& out, const Cps& cps, size_t b, size_t e) {
  for (size_t k = b; k < e; ++k) {
    const uint32_t c = cps[k];
    if (c == 0x130) {
      out += "i\xCC\x87";  // i + combining dot above
    } else if (c == 0x3A3 && k > 0 && is_cased_cp(cps[k - 1]) &&
               (k + 1 >= cps.size() || !is_cased_cp(cps[k + 1]))) {
      put_cp(out, 0x3C2);
    } else {
      put_cp(out, map_case(c, false));
    }
  }
}

std::string py_upper(const std::string& s) {
  std::string out;
  for (uint32_t c : to_cps(s)) put_upper(out, c, false);
  return out;
}

std::string py_lower(const std::string& s) {
  const Cps cps = to_cps(s);
  std::string out;
  put_lower(out, cps, 0, cps.size());
  return out;
}

std::string py_capitalize(const std::string& s) {  // str.capitalize()
  const Cps cps = to_cps(s);
  std::string out;
  if (cps.empty()) return out;
  put_upper(out, cps[0], true);
  put_lower(out, cps, 1, cps.size());
  return out;
}

std::string py_title(const std::string& s) {  // str.title()
  const Cps cps = to_cps(s);
  std::string out;
  bool prev_cased = false;
  for (size_t k = 0; k < cps.size(); ++k) {
    if (prev_cased) {
      put_lower(out, cps, k, k + 1);
    } else {
      put_upper(out, cps[k], true);
    }
    prev_cased = is_cased_cp(cps[k]);
  }
  return out;
}

// Jinja2's `title` filter (not str.title()): words start after runs of whitespace, '-', '(',
// '{', '[' or '<'; each word's first letter is upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s) {
  const Cps cps = to_cps(s);
  auto is_sep = [](uint32_t c) {
    return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  for (size_t k = 0; k < cps.size();) {
    if (is_sep(cps[k])) {
      put_cp(out, cps[k++]);
      continue;
    }
    size_t e = k;
    while (e < cps.size() && !is_sep(cps[e])) ++e;
    put_upper(out, cps[k], false);
    const Cps rest(cps.begin() + static_cast<std::ptrdiff_t>(k + 1),
                   cps.begin() + static_cast<std::ptrdiff_t>(e));
    put_lower(out, rest, 0, rest.size());  // Jinja2 lower-cases word[1:] on its own
    k = e;
  }
  return out;
}

bool py_islower(const std::string& s) {
  bool cased = false;
  for (uint32_t c : to_cps(s)) {
    if (is_upper_cp(c)) return false;
    cased |= is_lower_cp(c);
  }
  return cased;
}

bool py_isupper(const std::string& s) {
  bool cased = false;
  for (uint32_t c : to_cps(s)) {
    if (is_lower_cp(c)) return false;
    cased |= is_upper_cp(c);
  }
  return cased;
}

// str.strip(chars) / lstrip / rstrip; chars == nullptr strips whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const Cps cps = to_cps(s);
  const Cps set = chars ? to_cps(*chars) : Cps();
  auto strip = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return from_cps(cps, b, e);
}

// str.splitlines(): the line boundaries Python knows, \r\n counting as one.
std::vector<std::string> py_splitlines(const std::string& s) {
  const Cps cps = to_cps(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      lines.push_back(from_cps(cps, start, k));
      if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
      start = k + 1;
    }
  }
  if (start < cps.size()) lines.push_back(from_cps(cps, start, cps.size()));
  return lines;
}

// ---------------------------------------------------------------------------------------------
// str(), repr() and json.dumps() of values, byte for byte as Python writes them.

// repr(float): the shortest text that reads back as the same double; exponent form outside
// [1e-4, 1e16).
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find('e') != std::string::npos) {
    const double a = std::fabs(d);
    if (a >= 1e-4 && a < 1e16) {  // printf chose exponent form where Python does not
      for (int prec = 1; prec <= 20; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*f", prec, d);
        if (std::strtod(buf, nullptr) == d) break;
      }
      s = buf;
    }
    return s;
  }
  if (s.find('.') == std::string::npos) s += ".0";
  return s;
}

// str.isprintable(), which decides what repr() escapes. Exact for ASCII and Latin-1; above
// that the common non-printable ranges (separators, format characters, private use).
bool py_isprintable(uint32_t c) {
  if (c >= kRawByte || c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  return !(c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200F) ||
           (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F) || c == 0x3000 ||
           (c >= 0xD800 && c <= 0xF8FF) || c == 0xFEFF || (c >= 0xFFF0 && c <= 0xFFFB) ||
           c >= 0xE0000);
}

std::string str_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t c : to_cps(s)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<uint32_t>(q)) {
      out += '\\';
      out += q;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!py_isprintable(c)) {
      char buf[16];
      const uint32_t v = c >= kRawByte ? c - kRawByte : c;
      std::snprintf(buf, sizeof buf,
                    v < 0x100     ? "\\x%02x"
                    : v < 0x10000 ? "\\u%04x"
                                  : "\\U%08x",
                    v);
      out += buf;
    } else {
      put_cp(out, c);
    }
  }
  return out + q;
}

std::string py_repr(const Value& v, int depth = 0);

std::string py_str(const Value& v) {  // str(v); what {{ v }} prints
  switch (v.kind) {
    case Value::kUndefined:
      return "";
    case Value::kString:
      return v.s;
    default:
      return py_repr(v);
  }
}

std::string py_repr(const Value& v, int depth) {
  if (depth > kMaxNesting) throw Error("a value to print is nested too deeply");
  switch (v.kind) {
    case Value::kUndefined:
      return "Undefined";
    case Value::kNone:
      return "None";
    case Value::kBool:
      return v.b ? "True" : "False";
    case Value::kInt:
      return std::to_string(v.i);
    case Value::kFloat:
      return float_repr(v.f);
    case Value::kString:
      return str_repr(v.s);
    case Value::kList: {
      if (v.s == kGenerator)
        throw Error(
            "printing a generator (what map, select, items, ... return) is not "
            "supported; add '| list'");
      if (v.s.rfind("range(", 0) == 0) return v.s;
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k)
        out += (k ? ", " : "") + py_repr((*v.list)[k], depth + 1);
      if (v.tuple && v.list->size() == 1) out += ",";
      out += v.tuple ? ")" : "]";
      return v.s.empty() ? out : v.s + "(" + out + ")";  // dict_items([...])
    }
    case Value::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, val] : v.dict->items) {
        out += (first ? "" : ", ") + str_repr(key) + ": " + py_repr(val, depth + 1);
        first = false;
      }
      out += "}";
      if (v.dict->type == Dict::kNamespace) return "<Namespace " + out + ">";
      if (v.dict->type == Dict::kLoop)
        return "<LoopContext " + py_repr(*v.dict->find("index"), depth + 1) + "/" +
               py_repr(*v.dict->find("length"), depth + 1) + ">";
      return out;
    }
    case Value::kFunction:
      if (v.macro) return "<Macro '" + v.s + "'>";
      // Python prints a function or a bound method with its address: there is no stable text.
      throw Error("printing the function '" + v.s + "' is not supported");
  }
  return "";
}

// How transformers' tojson filter calls json.dumps: ensure_ascii, indent, separators, sort_keys.
struct JsonStyle {
  bool ensure_ascii = false;
  bool pretty = false;
  std::string indent;           // one level, when pretty
  std::string item_sep = ", ";  // json.dumps uses "," when indenting
  std::string key_sep = ": ";
  bool sort_keys = false;
};

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (uint32_t c : to_cps(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c > 0x7E && c < kRawByte)) {
          if (c >= 0x10000) {
            const uint32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
          }
          out += buf;
        } else {
          put_cp(out, c);
        }
      }
    }
  }
  out += '"';
}

void to_json(const Value& v, const JsonStyle& st, int level, int line, std::string& out) {
  if (level > kMaxNesting) fail(line, "tojson: the value is nested too deeply");
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += st.indent;
  };
  switch (v.kind) {
    case Value::kNone:
      out += "null";
      return;
    case Value::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::kInt:
      out += std::to_string(v.i);
      return;
    case Value::kFloat:
      out += std::isnan(v.f)   ? "NaN"
             : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                               : float_repr(v.f);
      return;
    case Value::kString:
      json_string(v.s, st.ensure_ascii, out);
      return;
    case Value::kList:
      if (!v.s.empty()) break;  // range, dict views: not JSON serializable
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        if (st.pretty) newline(level + 1);
        to_json((*v.list)[k], st, level + 1, line, out);
      }
      if (st.pretty) newline(level);
      out += ']';
      return;
    case Value::kDict: {
      if (v.dict->type != Dict::kPlain) break;
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (st.sort_keys)  // UTF-8 byte order is code point order, as Python sorts
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        if (st.pretty) newline(level + 1);
        json_string(items[k]->first, st.ensure_ascii, out);
        out += st.key_sep;
        to_json(items[k]->second, st, level + 1, line, out);
      }
      if (st.pretty) newline(level);
      out += '}';
      return;
    }
    case Value::kUndefined:
    case Value::kFunction:
      break;
  }
  fail(line, "tojson: Object of type " + type_name(v) + " is not JSON serializable");
}

// Python ==.
bool py_eq(const Value& a, const Value& b, int depth = 0) {
  if (depth > kMaxNesting) throw Error("values to compare are nested too deeply");
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.integral() == b.integral();
    return a.number() == b.number();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::kUndefined:
    case Value::kNone:
      return true;
    case Value::kString:
      return a.s == b.s;
    case Value::kList:
      if (a.s == kGenerator || b.s == kGenerator) return a.list == b.list;  // identity
      if (a.tuple != b.tuple || a.s != b.s || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!py_eq((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    case Value::kDict:
      if (a.dict->type != Dict::kPlain || b.dict->type != Dict::kPlain) return a.dict == b.dict;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, val] : a.dict->items) {
        const Value* o = b.dict->find(key);
        if (!o || !py_eq(val, *o, depth + 1)) return false;
      }
      return true;
    case Value::kFunction:
      return a.s == b.s && a.macro == b.macro;
    default:
      return false;
  }
}

// Python <, as -1/0/1; throws where Python raises TypeError.
int py_cmp(const Value& a, const Value& b, int line, int depth = 0) {
  if (depth > kMaxNesting) fail(line, "values to compare are nested too deeply");
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral())
      return a.integral() < b.integral() ? -1 : a.integral() > b.integral() ? 1 : 0;
    return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
  }
  if (a.kind == Value::kString && b.kind == Value::kString) {
    const int c = a.s.compare(b.s);  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Value::kList && b.kind == Value::kList && a.tuple == b.tuple) {
    for (size_t k = 0; k < a.list->size() && k < b.list->size(); ++k) {
      if (py_eq((*a.list)[k], (*b.list)[k])) continue;
      return py_cmp((*a.list)[k], (*b.list)[k], line, depth + 1);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(line, "cannot compare " + type_name(a) + " with " + type_name(b));
}

// ---------------------------------------------------------------------------------------------
// Lexing: the template into one token stream, as Jinja2's lexer does it: text between tags
// (with trim_blocks, lstrip_blocks and `-`/`+` applied), and the tokens inside {{ }} / {% %}.
// Comments vanish here.

struct Token {
  enum Kind {
    kData,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Kind kind = kEof;
  std::string text;  // kData: the text; kName, kOp: as written; kString: the decoded value
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

std::string describe(const Token& t) {
  switch (t.kind) {
    case Token::kData:
      return "template text";
    case Token::kVarBegin:
      return "'{{'";
    case Token::kVarEnd:
      return "end of print statement '}}'";
    case Token::kBlockBegin:
      return "'{%'";
    case Token::kBlockEnd:
      return "end of statement block '%}'";
    case Token::kString:
      return "string " + str_repr(t.text);
    case Token::kEof:
      return "end of template";
    default:
      return "'" + t.text + "'";
  }
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize(source)) {}

  std::vector<Token> run() {
    bool line_starting = true;  // the last tag ended a line: lstrip_blocks applies at pos 0
    while (pos_ < src_.size()) {
      const size_t open = find_tag(pos_);
      const size_t text_end = open == std::string::npos ? src_.size() : open;
      std::string text = src_.substr(pos_, text_end - pos_);
      const int text_line = line_;
      advance(text_end);
      if (open == std::string::npos) {
        emit_data(std::move(text), text_line);
        break;
      }
      const char kind = src_[open + 1];
      const char sign = open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+')
                            ? src_[open + 2]
                            : 0;
      if (sign == '-') {
        text = py_strip(text, nullptr, false, true);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag preceded on its line by whitespace only takes
        // that whitespace away.
        const size_t nl = text.rfind('\n');
        const size_t start = nl == std::string::npos ? 0 : nl + 1;
        if ((nl != std::string::npos || line_starting) && start < text.size() &&
            py_strip(text.substr(start), nullptr, true, false).empty())
          text.resize(start);
      }
      emit_data(std::move(text), text_line);
      pos_ = open + 2 + (sign ? 1 : 0);
      line_starting = kind == '#' ? lex_comment() : lex_tag(kind);
    }
    out_.push_back(Token{Token::kEof, "", 0, 0, line_});
    return std::move(out_);
  }

 private:
  // Jinja2 reads \r\n and \r as \n and drops one trailing newline (keep_trailing_newline off).
  static std::string normalize(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '\r') {
        out += '\n';
        if (k + 1 < s.size() && s[k + 1] == '\n') ++k;
      } else {
        out += s[k];
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  size_t find_tag(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string::npos; k = src_.find('{', k + 1))
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#'))
        return k;
    return std::string::npos;
  }

  void advance(size_t to) {  // moves pos_ to `to`, counting lines
    for (; pos_ < to; ++pos_) line_ += src_[pos_] == '\n';
  }

  bool at(const char* s) const { return src_.compare(pos_, std::strlen(s), s) == 0; }

  void emit_data(std::string text, int line) {
    if (!text.empty()) out_.push_back(Token{Token::kData, std::move(text), 0, 0, line});
  }

  // After a tag's closing marker: `-` eats all whitespace, trim_blocks one newline, `+` and
  // `}}` nothing. Returns whether what was eaten ends a line (Jinja2's line_starting).
  bool finish(char mode) {
    const size_t start = pos_;
    if (mode == '-') {
      skip_space();
    } else if (mode == 't' && pos_ < src_.size() && src_[pos_] == '\n') {
      advance(pos_ + 1);
    }
    return pos_ > start && src_[pos_ - 1] == '\n';
  }

  void skip_space() {  // inside a tag; Unicode whitespace too, as Jinja2's \s
    while (pos_ < src_.size()) {
      size_t next = pos_;
      if (!py_isspace(next_cp(src_, next))) return;
      advance(next);
    }
  }

  bool lex_comment() {
    const int line = line_;
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail(line, "unclosed comment '{#'");
    const char sign = close > pos_ ? src_[close - 1] : 0;
    advance(close + 2);
    return finish(sign == '-' ? '-' : sign == '+' ? '+' : 't');
  }

  bool lex_tag(char kind) {
    const int open_line = line_;
    out_.push_back(Token{kind == '%' ? Token::kBlockBegin : Token::kVarBegin, "", 0, 0, line_});
    std::vector<char> brackets;  // the end marker only counts outside brackets
    for (;;) {
      skip_space();
      if (pos_ >= src_.size())
        fail(open_line, kind == '%' ? "unclosed '{%' tag" : "unclosed '{{' tag");
      if (brackets.empty()) {
        const char* marker = nullptr;
        char mode = 0;
        if (kind == '%') {
          marker = at("-%}") ? "-%}" : at("+%}") ? "+%}" : at("%}") ? "%}" : nullptr;
          mode = marker ? (marker[0] == '%' ? 't' : marker[0]) : 0;
        } else {
          marker = at("-}}") ? "-}}" : at("}}") ? "}}" : nullptr;
          mode = marker && marker[0] == '-' ? '-' : 0;
        }
        if (marker) {
          out_.push_back(Token{kind == '%' ? Token::kBlockEnd : Token::kVarEnd, "", 0, 0, line_});
          advance(pos_ + std::strlen(marker));
          return finish(mode);
        }
      }
      lex_token(brackets);
    }
  }

  void lex_token(std::vector<char>& brackets) {
    Token t;
    t.line = line_;
    const char c = src_[pos_];
    if (c == '\'' || c == '"') {
      lex_string(t);
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number(t);
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
        ++e;
      t.kind = Token::kName;
      t.text = src_.substr(pos_, e - pos_);
      advance(e);
    } else {
      static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                         "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                         ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
      for (const char* op : kOps) {
        if (at(op)) {
          t.kind = Token::kOp;
          t.text = op;
          break;
        }
      }
      if (t.kind != Token::kOp) {
        size_t k = pos_;
        std::string ch;
        put_cp(ch, next_cp(src_, k));
        fail(line_, "unexpected character '" + ch + "'");
      }
      const char o = t.text[0];
      if (t.text.size() == 1 && (o == '(' || o == '[' || o == '{')) {
        brackets.push_back(o == '(' ? ')' : o == '[' ? ']' : '}');
      } else if (t.text.size() == 1 && (o == ')' || o == ']' || o == '}')) {
        if (brackets.empty() || brackets.back() != o) fail(line_, "unexpected '" + t.text + "'");
        brackets.pop_back();
      }
      advance(pos_ + t.text.size());
    }
    out_.push_back(std::move(t));
  }

  // A string literal, decoded as Jinja2 decodes it (Python's unicode-escape).
  void lex_string(Token& t) {
    const char quote = src_[pos_];
    size_t e = pos_ + 1;
    while (e < src_.size() && src_[e] != quote) e += src_[e] == '\\' ? 2 : 1;
    if (e >= src_.size()) fail(line_, "unterminated string literal");
    const std::string body = src_.substr(pos_ + 1, e - pos_ - 1);
    std::string v;
    for (size_t k = 0; k < body.size(); ++k) {
      if (body[k] != '\\') {
        v += body[k];
        continue;
      }
      const char n = body[++k];
      auto hex = [&](size_t digits) {
        uint32_t cp = 0;
        for (size_t d = 1; d <= digits; ++d) {
          const char h = k + d < body.size() ? body[k + d] : 0;
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail(line_, "truncated \\" + std::string(1, n) + " escape");
          cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                   ? h - '0'
                                                   : std::tolower(h) - 'a' + 10);
        }
        k += digits;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
          fail(line_, "unsupported code point in \\" + std::string(1, n) + " escape");
        put_cp(v, cp);
      };
      switch (n) {
        case '\n':  // a backslash at the end of a line continues the string
          break;
        case '\\':
        case '\'':
        case '"':
          v += n;
          break;
        case 'a':
          v += '\a';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'n':
          v += '\n';
          break;
        case 'r':
          v += '\r';
          break;
        case 't':
          v += '\t';
          break;
        case 'v':
          v += '\v';
          break;
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        case 'N':
          fail(line_, "\\N{...} escapes are not supported");
        default:
          if (n >= '0' && n <= '7') {  // up to three octal digits
            uint32_t cp = static_cast<uint32_t>(n - '0');
            for (int d = 0;
                 d < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; ++d)
              cp = cp * 8 + static_cast<uint32_t>(body[++k] - '0');
            put_cp(v, cp);
          } else if (static_cast<unsigned char>(n) >= 0x80) {
            fail(line_, "unsupported escape of a non-ASCII character");
          } else {  // unknown escapes stay as written
            v += '\\';
            v += n;
          }
      }
    }
    t.kind = Token::kString;
    t.text = std::move(v);
    advance(e + 1);
  }

  // Integers (1_000 too) and floats (1.5, 1e3, 2.5e-3), as Jinja2's number rules read them.
  void lex_number(Token& t) {
    auto digits = [&](size_t k) {  // end of a run of digits with single underscores between
      while (k < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[k])) ||
                                 (src_[k] == '_' && k + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[k + 1])))))
        ++k;
      return k;
    };
    size_t e = digits(pos_);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      e = digits(e + 1);
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        is_float = true;
        e = digits(x);
      }
    }
    std::string num = src_.substr(pos_, e - pos_);
    num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
    if (is_float) {
      t.kind = Token::kFloat;
      t.f = std::strtod(num.c_str(), nullptr);
    } else {
      if (num.size() > 1 && num[0] == '0' && num.find_first_not_of('0') != std::string::npos)
        fail(line_, "invalid integer literal '" + num + "'");
      errno = 0;
      t.kind = Token::kInt;
      t.i = std::strtoll(num.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(line_, "integer literal '" + num + "' is too large");
    }
    t.text = num;
    advance(e);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

// The filters, tests, globals and methods the renderer implements; anything else is refused
// when the template is parsed.
const std::unordered_set<std::string> kFilters = {
    "abs",    "capitalize", "count",   "d",       "default", "first", "float",  "indent",
    "int",    "items",      "join",    "last",    "length",  "list",  "lower",  "map",
    "reject", "rejectattr", "replace", "reverse", "round",   "safe",  "select", "selectattr",
    "string", "title",      "tojson",  "trim",    "unique",  "upper"};
const std::unordered_set<std::string> kTests = {
    "defined", "undefined", "none",   "boolean",     "false",       "true",     "integer",
    "float",   "number",    "string", "mapping",     "iterable",    "sequence", "callable",
    "lower",   "upper",     "odd",    "even",        "divisibleby", "in",       "eq",
    "equalto", "==",        "ne",     "!=",          "lt",          "lessthan", "<",
    "le",      "<=",        "gt",     "greaterthan", ">",           "ge",       ">="};
const std::unordered_set<std::string> kGlobals = {"range", "namespace", "dict", "raise_exception",
                                                  "strftime_now"};
const std::unordered_set<std::string> kMethods = {
    "strip", "lstrip", "rstrip", "split",      "rsplit",  "startswith", "endswith",
    "upper", "lower",  "title",  "capitalize", "replace", "find",       "rfind",
    "count", "join",   "get",    "items",      "keys",    "values"};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The syntax tree. One node type; which fields a kind uses is listed next to it.

struct Node {
  enum Kind {
    // Statements.
    kBody,    // kids: statements
    kText,    // value: the text
    kOutput,  // kids[0]: the expression printed
    kFor,     // targets (flag: a tuple to unpack), iter, cond (the `if` filter), body, else_body
    kIf,      // branches: (condition, body) for if and each elif; else_body
    kSet,     // targets = kids[0] (flag: a tuple to unpack); or, with `attr`, targets[0].attr = ...
    kSetBlock,  // targets[0] = the text rendered by body
    kMacro,     // name, params (name, default or null), body
    kBreak,
    kContinue,
    // Expressions.
    kLiteral,  // value
    kName,     // name
    kGetattr,  // kids[0].name
    kGetitem,  // kids[0][kids[1]]
    kSlice,    // kids[0][kids[1]:kids[2]:kids[3]], missing parts null
    kCall,     // iter(kids..., kwargs...)
    kFilter,   // kids[0] | name(kids[1:]..., kwargs...)
    kTest,     // kids[0] is [not] name(kids[1:]...) (flag: negated)
    kUnary,    // name kids[0]: "not", "-", "+"
    kBinary,   // kids[0] name kids[1]
    kCompare,  // kids[0] ops[0] kids[1] ops[1] kids[2] ...: a chained comparison
    kCond,     // kids[0] if cond else kids[1] (kids[1] may be missing)
    kList,     // kids (flag: a tuple)
    kDict,     // kids: key, value, key, value...
  };
  Kind kind = kBody;
  int line = 0;
  std::string name;
  std::string attr;
  Value value;
  std::vector<std::shared_ptr<Node>> kids;
  std::vector<std::pair<std::string, std::shared_ptr<Node>>> kwargs;  // kCall/kFilter; kMacro
  std::vector<std::string> targets;
  std::vector<std::string> ops;
  std::vector<std::pair<std::shared_ptr<Node>, std::shared_ptr<Node>>> branches;
  std::shared_ptr<Node> iter, cond, body, else_body;
  bool flag = false;
};

namespace {

using NodeP = std::shared_ptr<Node>;

NodeP make_node(Node::Kind kind, int line) {
  auto n = std::make_shared<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

// One recursive-descent parser over the token stream, following Jinja2's grammar and so its
// precedence: a filter or test applies to the whole unary expression before it (`-x|abs` is
// abs(-x)), `~` binds between + and *, and ** is left-associative.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  NodeP parse_template() {
    NodeP root = subparse({}, 0, "");
    for (const auto& [name, line] : calls_)
      if (!kGlobals.count(name) && !macros_.count(name))
        fail(line, "unknown function '" + name + "()'");
    return root;
  }

 private:
  // --- tokens
  const Token& cur() const { return t_[p_]; }
  const Token& look() const { return t_[std::min(p_ + 1, t_.size() - 1)]; }
  void next() {
    if (p_ + 1 < t_.size()) ++p_;
  }
  bool at_op(const char* op) const { return cur().kind == Token::kOp && cur().text == op; }
  bool at_name(const char* name) const { return cur().kind == Token::kName && cur().text == name; }
  bool skip_op(const char* op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void unexpected(const std::string& wanted) const {
    fail(cur().line, "expected " + wanted + ", got " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) unexpected(std::string("'") + op + "'");
  }
  std::string expect_name() {
    if (cur().kind != Token::kName) unexpected("a name");
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().kind != Token::kBlockEnd) unexpected("end of statement block '%}'");
    next();
  }

  // --- statements

  // Template text and tags up to a `{% end... %}` named in `ends` (left as the current token,
  // its `{%` consumed), or to the end of the template when `ends` is empty.
  NodeP subparse(std::initializer_list<const char*> ends, int open_line, const char* opener) {
    NodeP body = make_node(Node::kBody, cur().line);
    for (;;) {
      const Token& t = cur();
      if (t.kind == Token::kData) {
        NodeP text = make_node(Node::kText, t.line);
        text->value = Value::string(t.text);
        body->kids.push_back(text);
        next();
      } else if (t.kind == Token::kVarBegin) {
        next();
        NodeP out = make_node(Node::kOutput, t.line);
        out->kids.push_back(parse_tuple(true, false));
        if (cur().kind != Token::kVarEnd) unexpected("end of print statement '}}'");
        next();
        body->kids.push_back(out);
      } else if (t.kind == Token::kBlockBegin) {
        next();
        for (const char* e : ends)
          if (at_name(e)) return body;
        body->kids.push_back(parse_statement());
      } else if (t.kind == Token::kEof) {
        if (ends.size() == 0) return body;
        std::string want;
        for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
        fail(open_line, std::string("'{% ") + opener + " %}' is never closed (expected " + want +
                            " before the end of the template)");
      } else {
        unexpected("template text or a tag");
      }
    }
  }

  // Nesting of expressions and blocks is bounded, so a pathological template is an error, not
  // a stack overflow.
  class Nest {
   public:
    Nest(int& depth, int line) : depth_(depth) {
      if (++depth_ > kMaxNesting / 2) fail(line, "the template nests too deeply");
    }
    ~Nest() { --depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    int& depth_;
  };

  NodeP parse_statement() {
    const Nest nest(nesting_, cur().line);
    if (cur().kind != Token::kName) unexpected("a statement name");
    const std::string kw = cur().text;
    const int line = cur().line;
    if (kw == "for") return parse_for();
    if (kw == "if") return parse_if();
    if (kw == "set") return parse_set();
    if (kw == "macro") return parse_macro();
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) fail(line, "'" + kw + "' outside a for loop");
      next();
      expect_block_end();
      return make_node(kw == "break" ? Node::kBreak : Node::kContinue, line);
    }
    static const std::unordered_set<std::string> kKnown = {
        "endfor",   "else",      "elif",    "endif",   "endset",     "endmacro",      "block",
        "endblock", "extends",   "include", "import",  "from",       "with",          "endwith",
        "filter",   "endfilter", "call",    "endcall", "autoescape", "endautoescape", "raw",
        "endraw",   "do",        "print",   "trans",   "pluralize",  "endtrans"};
    if (kw.rfind("end", 0) == 0 || kw == "else" || kw == "elif")
      fail(line, "unexpected '{% " + kw + " %}' (nothing open that it closes)");
    if (kKnown.count(kw)) fail(line, "unsupported tag '{% " + kw + " %}'");
    fail(line, "unknown tag '{% " + kw + " %}'");
  }

  // Names assigned by `for` and `set`: `a`, or a tuple to unpack: `a, b`, `(a, b)`, `(a,)`.
  void parse_targets(Node& n) {
    const bool paren = skip_op("(");
    n.targets.push_back(expect_target());
    while (skip_op(",")) {
      n.flag = true;
      if (paren && at_op(")")) break;
      n.targets.push_back(expect_target());
    }
    if (paren) expect_op(")");
  }

  std::string expect_target() {
    static const std::unordered_set<std::string> kConstants = {"true", "false", "none",
                                                               "True", "False", "None"};
    if (cur().kind == Token::kName && kConstants.count(cur().text))
      fail(cur().line, "cannot assign to '" + cur().text + "'");
    return expect_name();
  }

  NodeP parse_for() {
    NodeP n = make_node(Node::kFor, cur().line);
    next();
    parse_targets(*n);
    if (!skip_name("in")) unexpected("'in'");
    n->iter = parse_tuple(false, false, "recursive");
    if (skip_name("if")) n->cond = parse_expression(true);
    if (at_name("recursive")) fail(cur().line, "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    n->body = subparse({"endfor", "else"}, n->line, "for");
    --loop_depth_;
    if (skip_name("else")) {
      expect_block_end();
      n->else_body = subparse({"endfor"}, n->line, "for");
    }
    next();  // endfor
    expect_block_end();
    return n;
  }

  NodeP parse_if() {
    NodeP n = make_node(Node::kIf, cur().line);
    next();
    for (;;) {
      NodeP cond = parse_tuple(false, false);
      expect_block_end();
      NodeP body = subparse({"elif", "else", "endif"}, n->line, "if");
      n->branches.emplace_back(cond, body);
      if (skip_name("elif")) continue;
      if (skip_name("else")) {
        expect_block_end();
        n->else_body = subparse({"endif"}, n->line, "if");
      }
      next();  // endif
      expect_block_end();
      return n;
    }
  }

  NodeP parse_set() {
    NodeP n = make_node(Node::kSet, cur().line);
    next();
    if (cur().kind == Token::kName && look().kind == Token::kOp && look().text == ".") {
      n->targets.push_back(expect_target());
      next();
      n->attr = expect_name();
    } else {
      parse_targets(*n);
    }
    if (skip_op("=")) {
      n->kids.push_back(parse_tuple(true, false));
      expect_block_end();
      return n;
    }
    if (at_op("|")) fail(cur().line, "filters on a '{% set %}' block are not supported");
    if (n->flag || !n->attr.empty()) unexpected("'='");
    expect_block_end();
    n->kind = Node::kSetBlock;
    n->body = subparse({"endset"}, n->line, "set");
    next();  // endset
    expect_block_end();
    return n;
  }

  NodeP parse_macro() {
    NodeP n = make_node(Node::kMacro, cur().line);
    next();
    n->name = expect_name();
    expect_op("(");
    while (!skip_op(")")) {
      if (!n->kwargs.empty()) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      std::string param = expect_name();
      NodeP dflt = skip_op("=") ? parse_expression(true) : nullptr;
      n->kwargs.emplace_back(std::move(param), dflt);
    }
    expect_block_end();
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;
    n->body = subparse({"endmacro"}, n->line, "macro");
    loop_depth_ = saved_depth;
    next();  // endmacro
    expect_block_end();
    macros_.insert(n->name);
    return n;
  }

  // --- expressions

  // Comma-separated expressions: one is itself, several (or a trailing comma) a tuple.
  NodeP parse_tuple(bool with_condexpr, bool explicit_parens, const char* extra_end = nullptr) {
    const int line = cur().line;
    std::vector<NodeP> items;
    bool is_tuple = false;
    for (;;) {
      if (!items.empty()) expect_op(",");
      if (cur().kind == Token::kVarEnd || cur().kind == Token::kBlockEnd || at_op(")") ||
          (extra_end && at_name(extra_end)))
        break;
      items.push_back(parse_expression(with_condexpr));
      if (!at_op(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!items.empty()) return items[0];
      if (!explicit_parens) unexpected("an expression");
    }
    NodeP t = make_node(Node::kList, line);
    t->kids = std::move(items);
    t->flag = true;
    return t;
  }

  NodeP parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  NodeP parse_condexpr() {
    const Nest nest(nesting_, cur().line);
    NodeP e = parse_or();
    while (at_name("if")) {
      NodeP c = make_node(Node::kCond, cur().line);
      next();
      c->cond = parse_or();
      c->kids.push_back(e);
      if (skip_name("else")) c->kids.push_back(parse_condexpr());
      e = c;
    }
    return e;
  }

  NodeP binary(const std::string& op, NodeP l, NodeP r, int line) {
    NodeP n = make_node(Node::kBinary, line);
    n->name = op;
    n->kids = {std::move(l), std::move(r)};
    return n;
  }

  NodeP parse_or() {
    NodeP l = parse_and();
    while (at_name("or")) {
      const int line = cur().line;
      next();
      l = binary("or", l, parse_and(), line);
    }
    return l;
  }

  NodeP parse_and() {
    NodeP l = parse_not();
    while (at_name("and")) {
      const int line = cur().line;
      next();
      l = binary("and", l, parse_not(), line);
    }
    return l;
  }

  NodeP parse_not() {
    const Nest nest(nesting_, cur().line);
    if (at_name("not")) {
      NodeP n = make_node(Node::kUnary, cur().line);
      next();
      n->name = "not";
      n->kids.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  NodeP parse_compare() {
    const int line = cur().line;
    NodeP first = parse_math1();
    NodeP n;
    for (;;) {
      std::string op;
      if (cur().kind == Token::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (skip_name("in")) {
        op = "in";
      } else if (at_name("not") && look().kind == Token::kName && look().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!n) {
        n = make_node(Node::kCompare, line);
        n->kids.push_back(first);
      }
      n->ops.push_back(op);
      n->kids.push_back(parse_math1());
    }
    return n ? n : first;
  }

  NodeP parse_math1() {
    NodeP l = parse_concat();
    while (at_op("+") || at_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      l = binary(op, l, parse_concat(), line);
    }
    return l;
  }

  NodeP parse_concat() {
    NodeP l = parse_math2();
    while (at_op("~")) {
      const int line = cur().line;
      next();
      l = binary("~", l, parse_math2(), line);
    }
    return l;
  }

  NodeP parse_math2() {
    NodeP l = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      next();
      l = binary(op, l, parse_pow(), line);
    }
    return l;
  }

  NodeP parse_pow() {  // left-associative in Jinja2, unlike Python
    NodeP l = parse_unary(true);
    while (at_op("**")) {
      const int line = cur().line;
      next();
      l = binary("**", l, parse_unary(true), line);
    }
    return l;
  }

  NodeP parse_unary(bool with_filter) {
    const Nest nest(nesting_, cur().line);
    NodeP n;
    if (at_op("-") || at_op("+")) {
      n = make_node(Node::kUnary, cur().line);
      n->name = cur().text;
      next();
      n->kids.push_back(parse_unary(false));
    } else {
      n = parse_primary();
    }
    n = parse_postfix(n);
    return with_filter ? parse_filter_expr(n) : n;
  }

  NodeP parse_primary() {
    const Token& t = cur();
    NodeP n = make_node(Node::kLiteral, t.line);
    switch (t.kind) {
      case Token::kName:
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          n->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
        } else if (t.text == "none" || t.text == "None") {
          n->value = Value::none();
        } else {
          n->kind = Node::kName;
          n->name = t.text;
        }
        next();
        return n;
      case Token::kString: {
        std::string s;
        while (cur().kind == Token::kString) {  // adjacent literals concatenate
          s += cur().text;
          next();
        }
        n->value = Value::string(std::move(s));
        return n;
      }
      case Token::kInt:
        n->value = Value::integer(t.i);
        next();
        return n;
      case Token::kFloat:
        n->value = Value::real(t.f);
        next();
        return n;
      default:
        break;
    }
    if (skip_op("(")) {
      NodeP e = parse_tuple(true, true);
      expect_op(")");
      return e;
    }
    if (at_op("[")) {
      n->kind = Node::kList;
      next();
      while (!skip_op("]")) {
        if (!n->kids.empty()) {
          expect_op(",");
          if (skip_op("]")) break;
        }
        n->kids.push_back(parse_expression(true));
      }
      return n;
    }
    if (at_op("{")) {
      n->kind = Node::kDict;
      next();
      while (!skip_op("}")) {
        if (!n->kids.empty()) {
          expect_op(",");
          if (skip_op("}")) break;
        }
        n->kids.push_back(parse_expression(true));
        expect_op(":");
        n->kids.push_back(parse_expression(true));
      }
      return n;
    }
    unexpected("an expression");
  }

  // Attribute access, subscripts and calls.
  NodeP parse_postfix(NodeP n) {
    for (;;) {
      if (at_op(".")) {
        const int line = cur().line;
        next();
        if (cur().kind == Token::kName) {
          NodeP g = make_node(Node::kGetattr, line);
          g->name = expect_name();
          g->kids.push_back(n);
          n = g;
        } else if (cur().kind == Token::kInt) {  // x.0 is x[0]
          NodeP g = make_node(Node::kGetitem, line);
          NodeP key = make_node(Node::kLiteral, line);
          key->value = Value::integer(cur().i);
          next();
          g->kids = {n, key};
          n = g;
        } else {
          unexpected("a name or number after '.'");
        }
      } else if (at_op("[")) {
        n = parse_subscript(n);
      } else if (at_op("(")) {
        n = parse_call(n);
      } else {
        return n;
      }
    }
  }

  NodeP parse_subscript(NodeP obj) {
    const int line = cur().line;
    next();  // [
    std::array<NodeP, 3> parts;
    bool slice = false;
    if (!at_op(":")) parts[0] = parse_expression(true);
    if (skip_op(":")) {
      slice = true;
      if (!at_op("]") && !at_op(":")) parts[1] = parse_expression(true);
      if (skip_op(":") && !at_op("]")) parts[2] = parse_expression(true);
    }
    if (at_op(",")) fail(cur().line, "tuple subscripts are not supported");
    expect_op("]");
    NodeP n = make_node(slice ? Node::kSlice : Node::kGetitem, line);
    n->kids = {obj, parts[0]};
    if (slice) {
      n->kids.push_back(parts[1]);
      n->kids.push_back(parts[2]);
    }
    return n;
  }

  void parse_call_args(Node& n) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      first = false;
      if (at_op("*") || at_op("**")) fail(cur().line, "*args and **kwargs are not supported");
      if (cur().kind == Token::kName && look().kind == Token::kOp && look().text == "=") {
        std::string key = expect_name();
        next();  // =
        n.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!n.kwargs.empty()) fail(cur().line, "positional argument after keyword argument");
        n.kids.push_back(parse_expression(true));
      }
    }
  }

  NodeP parse_call(NodeP callee) {
    NodeP n = make_node(Node::kCall, cur().line);
    if (callee->kind == Node::kName) {
      calls_.emplace_back(callee->name, n->line);  // checked once all macros are known
    } else if (callee->kind == Node::kGetattr) {
      if (!kMethods.count(callee->name))
        fail(n->line, "unsupported method '." + callee->name + "()'");
    } else {
      fail(n->line, "only functions, macros and methods can be called");
    }
    n->iter = callee;
    parse_call_args(*n);
    return n;
  }

  // Filters and tests, which in Jinja2 bind to the whole unary expression before them.
  NodeP parse_filter_expr(NodeP n) {
    for (;;) {
      if (at_op("|")) {
        n = parse_filter(n);
      } else if (at_name("is")) {
        n = parse_test(n);
      } else if (at_op("(")) {
        n = parse_call(n);
      } else {
        return n;
      }
    }
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    return name;
  }

  static const std::string* literal_string(const NodeP& n) {
    return n && n->kind == Node::kLiteral && n->value.kind == Value::kString ? &n->value.s
                                                                             : nullptr;
  }

  NodeP parse_filter(NodeP input) {
    NodeP n = make_node(Node::kFilter, cur().line);
    next();  // |
    n->name = dotted_name();
    if (!kFilters.count(n->name)) fail(n->line, "unsupported filter '" + n->name + "'");
    n->kids.push_back(input);
    if (at_op("(")) parse_call_args(*n);
    // Filter and test names given as strings (map('upper'), select('odd')) are checked now too.
    const bool by_attr = n->name == "selectattr" || n->name == "rejectattr";
    const bool takes_test = by_attr || n->name == "select" || n->name == "reject";
    const size_t arg = by_attr ? 2 : 1;
    const std::string* s = arg < n->kids.size() ? literal_string(n->kids[arg]) : nullptr;
    if (s && n->name == "map" && !kFilters.count(*s))
      fail(n->line, "unsupported filter '" + *s + "'");
    if (s && takes_test && !kTests.count(*s)) fail(n->line, "unsupported test '" + *s + "'");
    return n;
  }

  NodeP parse_test(NodeP input) {
    NodeP n = make_node(Node::kTest, cur().line);
    next();  // is
    n->flag = skip_name("not");
    n->name = dotted_name();
    if (!kTests.count(n->name)) fail(n->line, "unsupported test '" + n->name + "'");
    n->kids.push_back(input);
    if (at_op("(")) {
      parse_call_args(*n);
      if (!n->kwargs.empty()) fail(n->line, "keyword arguments to tests are not supported");
    } else if ((cur().kind == Token::kName || cur().kind == Token::kString ||
                cur().kind == Token::kInt || cur().kind == Token::kFloat || at_op("[") ||
                at_op("{")) &&
               !at_name("else") && !at_name("or") && !at_name("and")) {
      if (at_name("is")) fail(cur().line, "tests cannot be chained with 'is'");
      n->kids.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
    }
    return n;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
  std::vector<std::pair<std::string, int>> calls_;
  std::unordered_set<std::string> macros_;
};

// ---------------------------------------------------------------------------------------------
// Rendering: statements write to a string, expressions evaluate to Values.

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Bound = std::vector<std::optional<Value>>;

// Binds call arguments to parameter names as Python does: positional ones first, then keywords.
Bound bind(int line, const std::string& what, std::initializer_list<const char*> params, Args& args,
           Kwargs& kwargs) {
  const std::vector<const char*> names(params);
  if (args.size() > names.size())
    fail(line, what + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
                   std::to_string(args.size()) + " given)");
  Bound out(names.size());
  for (size_t k = 0; k < args.size(); ++k) out[k] = std::move(args[k]);
  for (auto& [key, v] : kwargs) {
    size_t k = 0;
    while (k < names.size() && key != names[k]) ++k;
    if (k == names.size()) fail(line, what + "() got an unexpected keyword argument '" + key + "'");
    if (out[k]) fail(line, what + "() got multiple values for argument '" + key + "'");
    out[k] = std::move(v);
  }
  return out;
}

bool given(const std::optional<Value>& v) {
  return v && v->kind != Value::kNone;
}

int64_t to_index(const Value& v, int line, const std::string& what) {
  if (!v.is_integral()) fail(line, what + " must be an integer, not " + type_name(v));
  return v.integral();
}

const std::string& to_text(const Value& v, int line, const std::string& what) {
  if (v.kind != Value::kString) fail(line, what + " must be a string, not " + type_name(v));
  return v.s;
}

// Bounds on what a template can build, so a runaway one is an error instead of exhausting
// memory: the length of one string or list, and of an indentation.
constexpr size_t kMaxSize = size_t{1} << 28;
constexpr int64_t kMaxIndent = 1 << 12;

std::string spaces(const Value& width, int line, const std::string& what) {
  const int64_t n = to_index(width, line, what);
  if (n > kMaxIndent) fail(line, what + " " + std::to_string(n) + " is too large");
  return std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
}

Value joined(std::string a, const std::string& b, int line) {
  if (a.size() + b.size() > kMaxSize) fail(line, "the string would be too large");
  return Value::string(a += b);
}

// int(text) as Python reads it: surrounding whitespace, a sign, digits with single underscores.
std::optional<int64_t> parse_py_int(const std::string& text, int64_t base) {
  const std::string s = py_strip(text, nullptr, true, true);
  size_t k = 0;
  bool neg = false;
  if (k < s.size() && (s[k] == '+' || s[k] == '-')) neg = s[k++] == '-';
  if (k >= s.size()) return std::nullopt;
  int64_t v = 0;
  bool prev_digit = false;
  for (; k < s.size(); ++k) {
    const char c = s[k];
    if (c == '_' && prev_digit && k + 1 < s.size() && s[k + 1] != '_') {
      prev_digit = false;
      continue;
    }
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : std::isalpha(static_cast<unsigned char>(c))
                      ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                      : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v))
      return std::nullopt;
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  return neg ? -v : v;
}

// float(text) as Python reads it (no hexadecimal floats).
std::optional<double> parse_py_float(const std::string& text) {
  std::string s = py_strip(text, nullptr, true, true);
  if (s.empty() || s.find_first_of("xX(") != std::string::npos) return std::nullopt;
  for (size_t k = 1; k + 1 < s.size(); ++k)
    if (s[k] == '_' && std::isdigit(static_cast<unsigned char>(s[k - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[k + 1])))
      s.erase(k--, 1);
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

class Renderer {
 public:
  explicit Renderer(const Template::Variables& variables) {
    scopes_.emplace_back();
    for (const auto& [name, value] : variables) scopes_[0][name] = from_json(*value);
  }

  void render(const Node& root, std::string& out) { exec(root, out); }

 private:
  enum class Flow { kNext, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;
  static constexpr int kMaxMacroDepth = 200;
  static constexpr int64_t kMaxRange = 100000;  // the sandbox's MAX_RANGE

  // --- statements

  Flow exec(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::kBody:
        for (const auto& k : n.kids) {
          const Flow f = exec(*k, out);
          if (f != Flow::kNext) return f;
        }
        return Flow::kNext;
      case Node::kText:
        out += n.value.s;
        return Flow::kNext;
      case Node::kOutput: {
        const Value v = eval(*n.kids[0]);
        out += v.kind == Value::kString ? v.s : py_str(v);
        if (out.size() > kMaxSize) fail(n.line, "the output would be too large");
        return Flow::kNext;
      }
      case Node::kIf:
        for (const auto& [cond, body] : n.branches)
          if (truthy(eval(*cond))) return exec(*body, out);
        return n.else_body ? exec(*n.else_body, out) : Flow::kNext;
      case Node::kFor:
        exec_for(n, out);
        return Flow::kNext;
      case Node::kSet:
        assign(n, eval(*n.kids[0]));
        return Flow::kNext;
      case Node::kSetBlock: {
        std::string text;
        exec(*n.body, text);
        assign(n, Value::string(std::move(text)));
        return Flow::kNext;
      }
      case Node::kMacro:
        scopes_.back()[n.name] = Value::function(n.name, &n);
        return Flow::kNext;
      case Node::kBreak:
        return Flow::kBreak;
      case Node::kContinue:
        return Flow::kContinue;
      default:
        fail(n.line, "internal error: an expression used as a statement");
    }
  }

  // Each iteration runs in a fresh scope: a `set` inside the body is gone at the next
  // iteration and after the loop, as in Jinja2.
  void exec_for(const Node& n, std::string& out) {
    const Value seq = eval(*n.iter);
    // A list is iterated in place (lists are immutable here); other iterables become one.
    if (seq.kind == Value::kList) consume(seq, n.line);
    std::shared_ptr<const List> items =
        seq.kind == Value::kList ? seq.list : std::make_shared<const List>(iterate(seq, n.line));
    if (n.cond) {  // the `if` filter sees the loop variables, not `loop`
      List kept;
      for (const auto& item : *items) {
        scopes_.emplace_back();
        bind_targets(n, item);
        const bool keep = truthy(eval(*n.cond));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::make_shared<const List>(std::move(kept));
    }
    if (items->empty()) {
      if (n.else_body) {
        scopes_.emplace_back();
        exec(*n.else_body, out);
        scopes_.pop_back();
      }
      return;
    }
    const auto len = static_cast<int64_t>(items->size());
    for (int64_t k = 0; k < len; ++k) {
      const auto at = static_cast<size_t>(k);
      Dict loop;
      loop.type = Dict::kLoop;
      loop.items = {
          {"index", Value::integer(k + 1)},      {"index0", Value::integer(k)},
          {"revindex", Value::integer(len - k)}, {"revindex0", Value::integer(len - k - 1)},
          {"first", Value::boolean(k == 0)},     {"last", Value::boolean(k == len - 1)},
          {"length", Value::integer(len)},       {"depth", Value::integer(1)},
          {"depth0", Value::integer(0)},
      };
      loop.seq = items;
      loop.at = at;
      scopes_.emplace_back();
      bind_targets(n, (*items)[at]);
      scopes_.back()["loop"] = of_dict(std::move(loop));
      const Flow f = exec(*n.body, out);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
  }

  static List unpack(const Value& v, size_t count, int line) {
    if (v.kind != Value::kList)
      fail(line, "cannot unpack a " + type_name(v) + " into " + std::to_string(count) + " names");
    consume(v, line);
    if (v.list->size() != count)
      fail(line, "expected " + std::to_string(count) + " values to unpack, got " +
                     std::to_string(v.list->size()));
    return *v.list;
  }

  void bind_targets(const Node& n, const Value& item) {
    if (!n.flag) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    const List parts = unpack(item, n.targets.size(), n.line);
    for (size_t k = 0; k < parts.size(); ++k) scopes_.back()[n.targets[k]] = parts[k];
  }

  void assign(const Node& n, Value v) {
    if (!n.attr.empty()) {
      const Value target = lookup(n.targets[0]);
      if (target.kind != Value::kDict || target.dict->type != Dict::kNamespace)
        fail(n.line, "cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
      target.dict->set(n.attr, std::move(v));
      return;
    }
    bind_targets(n, v);
  }

  Value lookup(const std::string& name) const {
    for (size_t k = scopes_.size(); k-- > frame_;) {
      auto it = scopes_[k].find(name);
      if (it != scopes_[k].end()) return it->second;
    }
    if (frame_ > 0) {  // inside a macro: its own scopes, then the template's top level
      auto it = scopes_[0].find(name);
      if (it != scopes_[0].end()) return it->second;
    }
    if (kGlobals.count(name)) return Value::function(name, nullptr);
    return Value::undefined("'" + name + "' is undefined");
  }

  static List iterate(const Value& v, int line) {
    switch (v.kind) {
      case Value::kList:
        consume(v, line);
        return *v.list;
      case Value::kDict: {
        if (v.dict->type == Dict::kNamespace) break;
        List keys;
        for (const auto& item : v.dict->items) keys.push_back(Value::string(item.first));
        return keys;
      }
      case Value::kString: {
        List chars;
        for (size_t k = 0; k < v.s.size();) {
          std::string c;
          put_cp(c, next_cp(v.s, k));
          chars.push_back(Value::string(std::move(c)));
        }
        return chars;
      }
      case Value::kUndefined:
        return {};
      default:
        break;
    }
    fail(line, "'" + type_name(v) + "' object is not iterable");
  }

  // --- expressions

  Value eval(const Node& n) {
    switch (n.kind) {
      case Node::kLiteral:
        return n.value;
      case Node::kName:
        return lookup(n.name);
      case Node::kList: {
        List items;
        for (const auto& k : n.kids) items.push_back(eval(*k));
        return Value::of_list(std::move(items), n.flag);
      }
      case Node::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < n.kids.size(); k += 2) {
          const Value key = eval(*n.kids[k]);
          if (key.kind != Value::kString)
            fail(n.line, "dict keys other than strings are not supported");
          d.set(key.s, eval(*n.kids[k + 1]));
        }
        return of_dict(std::move(d));
      }
      case Node::kGetattr:
        return getattr(eval(*n.kids[0]), n.name, n.line);
      case Node::kGetitem: {
        const Value obj = eval(*n.kids[0]);
        return getitem(obj, eval(*n.kids[1]), n.line);
      }
      case Node::kSlice:
        return slice(n);
      case Node::kUnary:
        return unary(n);
      case Node::kBinary:
        return binary(n);
      case Node::kCompare: {
        Value l = eval(*n.kids[0]);
        for (size_t k = 0; k < n.ops.size(); ++k) {
          Value r = eval(*n.kids[k + 1]);
          if (!compare(n.ops[k], l, r, n.line)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case Node::kCond:
        if (truthy(eval(*n.cond))) return eval(*n.kids[0]);
        if (n.kids.size() > 1) return eval(*n.kids[1]);
        return Value::undefined("the conditional expression had no else branch");
      case Node::kCall:
        return call(n);
      case Node::kFilter: {
        Value v = eval(*n.kids[0]);
        Args args = eval_args(n);
        Kwargs kwargs = eval_kwargs(n);
        return filter(n.line, n.name, std::move(v), args, kwargs);
      }
      case Node::kTest: {
        const Value v = eval(*n.kids[0]);
        Args args = eval_args(n);
        return Value::boolean(test(n.line, n.name, v, args) != n.flag);
      }
      default:
        fail(n.line, "internal error: a statement used as an expression");
    }
  }

  Args eval_args(const Node& n) {  // a filter's or test's kids[1:]; a call's kids
    Args args;
    for (size_t k = n.kind == Node::kCall ? 0 : 1; k < n.kids.size(); ++k)
      args.push_back(eval(*n.kids[k]));
    return args;
  }

  Kwargs eval_kwargs(const Node& n) {
    Kwargs kwargs;
    for (const auto& [k, e] : n.kwargs) kwargs.emplace_back(k, eval(*e));
    return kwargs;
  }

  static Value getattr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) fail(line, obj.s);
    if (obj.kind == Value::kDict && obj.dict->type == Dict::kLoop &&
        (name == "previtem" || name == "nextitem")) {
      const Dict& loop = *obj.dict;
      if (name == "previtem" && loop.at > 0) return (*loop.seq)[loop.at - 1];
      if (name == "nextitem" && loop.at + 1 < loop.seq->size()) return (*loop.seq)[loop.at + 1];
      return Value::undefined(std::string("there is no ") +
                              (name == "previtem" ? "previous" : "next") + " item");
    }
    if (const Value m = method_attribute(obj, name); m.kind == Value::kFunction || !m.s.empty())
      return m;
    if (obj.kind == Value::kDict)
      if (const Value* v = obj.dict->find(name)) return *v;
    return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
  }

  // An attribute that is a Python method, read without calling it (`{% if s.strip %}`): the
  // sandbox gives the bound method (truthy, callable; printing it is refused), or undefined for
  // a method that would modify the object, and never a dict key of the same name. Returns a
  // plain Value (kind undefined, empty text) when `name` is no such method.
  static Value method_attribute(const Value& obj, const std::string& name) {
    static const std::unordered_set<std::string> kStr = {
        "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
        "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
        "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
        "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
        "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
        "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
        "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
        "swapcase",     "title",       "translate", "upper",      "zfill"};
    static const std::unordered_set<std::string> kDict = {"copy",  "fromkeys", "get",
                                                          "items", "keys",     "values"};
    static const std::unordered_set<std::string> kDictModifying = {"clear", "pop", "popitem",
                                                                   "setdefault", "update"};
    static const std::unordered_set<std::string> kList = {"copy", "count", "index"};
    static const std::unordered_set<std::string> kListModifying = {
        "append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
    const std::string bound = type_name(obj) + "." + name;
    const Value unsafe = Value::undefined("access to attribute '" + name + "' of '" +
                                          type_name(obj) + "' object is unsafe");
    switch (obj.kind) {
      case Value::kString:
        if (kStr.count(name)) return Value::function(bound, nullptr);
        break;
      case Value::kDict:
        if (obj.dict->type == Dict::kLoop && (name == "cycle" || name == "changed"))
          return Value::function(bound, nullptr);
        if (obj.dict->type != Dict::kPlain) break;
        if (kDict.count(name)) return Value::function(bound, nullptr);
        if (kDictModifying.count(name)) return unsafe;
        break;
      case Value::kList:
        if (obj.tuple ? name == "count" || name == "index" : kList.count(name) > 0)
          return Value::function(bound, nullptr);
        if (!obj.tuple && kListModifying.count(name)) return unsafe;
        break;
      default:
        break;
    }
    return Value();
  }

  static Value getitem(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) fail(line, obj.s);
    if (obj.kind == Value::kDict && key.kind == Value::kString) {  // the key, then attributes
      if (obj.dict->type == Dict::kPlain)
        if (const Value* v = obj.dict->find(key.s)) return *v;
      return getattr(obj, key.s, line);
    }
    const bool indexable =
        obj.kind == Value::kString ||
        (obj.kind == Value::kList && (obj.s.empty() || type_name(obj) == "range"));
    if (indexable && key.is_integral()) {
      const List chars = obj.kind == Value::kString ? iterate(obj, line) : List();
      const List& seq = obj.kind == Value::kList ? *obj.list : chars;
      const auto size = static_cast<int64_t>(seq.size());
      int64_t k = key.integral();
      if (k < 0) k += size;
      if (k >= 0 && k < size) return seq[static_cast<size_t>(k)];
    }
    return Value::undefined(type_name(obj) + " object has no element " + py_repr(key));
  }

  Value slice(const Node& n) {
    const Value obj = eval(*n.kids[0]);
    if (obj.is_undefined()) fail(n.line, obj.s);
    auto bound = [&](const NodeP& e) -> std::optional<int64_t> {
      if (!e) return std::nullopt;
      const Value v = eval(*e);
      if (v.kind == Value::kNone) return std::nullopt;
      return to_index(v, n.line, "slice indices");
    };
    const std::optional<int64_t> start = bound(n.kids[1]), stop = bound(n.kids[2]),
                                 step_arg = bound(n.kids[3]);
    if ((obj.kind != Value::kList || !obj.s.empty()) &&
        obj.kind != Value::kString)  // Jinja2 slices with plain []
      fail(n.line, "'" + type_name(obj) + "' object cannot be sliced");
    const int64_t step = step_arg.value_or(1);
    if (step == 0) fail(n.line, "slice step cannot be zero");
    const List chars = obj.kind == Value::kString ? iterate(obj, n.line) : List();
    const List& seq = obj.kind == Value::kList ? *obj.list : chars;
    const auto size = static_cast<int64_t>(seq.size());
    auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {  // PySlice_AdjustIndices
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + size : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, size);
      return std::clamp<int64_t>(x, -1, size - 1);
    };
    const int64_t b = adjust(start, step > 0 ? 0 : size - 1);
    const int64_t e = adjust(stop, step > 0 ? size : -1);
    List picked;
    for (int64_t k = b; step > 0 ? k < e : k > e; k += step)
      picked.push_back(seq[static_cast<size_t>(k)]);
    if (obj.kind == Value::kList) return Value::of_list(std::move(picked), obj.tuple);
    std::string s;
    for (const auto& c : picked) s += c.s;
    return Value::string(std::move(s));
  }

  Value unary(const Node& n) {
    const Value v = eval(*n.kids[0]);
    if (n.name == "not") return Value::boolean(!truthy(v));
    if (v.is_undefined()) fail(n.line, v.s);
    if (!v.is_number())
      fail(n.line, "bad operand type for unary " + n.name + ": '" + type_name(v) + "'");
    if (v.kind == Value::kFloat) return Value::real(n.name == "-" ? -v.f : v.f);
    if (n.name == "+") return Value::integer(v.integral());
    if (v.integral() == INT64_MIN) fail(n.line, "integer overflow");
    return Value::integer(-v.integral());
  }

  static Value repeat(const Value& seq, int64_t times, int line) {
    const size_t unit = seq.kind == Value::kString ? seq.s.size() : seq.list->size();
    if (times > 0 && unit > 0 && static_cast<uint64_t>(times) > kMaxSize / unit)
      fail(line, "the repeated sequence would be too large");
    if (seq.kind == Value::kString) {
      std::string out;
      for (int64_t k = 0; k < times; ++k) out += seq.s;
      return Value::string(std::move(out));
    }
    List out;
    for (int64_t k = 0; k < times; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
    return Value::of_list(std::move(out), seq.tuple);
  }

  Value binary(const Node& n) {
    const std::string& op = n.name;
    if (op == "and" || op == "or") {  // the deciding operand itself, as Python returns it
      Value l = eval(*n.kids[0]);
      if (truthy(l) == (op == "or")) return l;
      return eval(*n.kids[1]);
    }
    const Value l = eval(*n.kids[0]);
    const Value r = eval(*n.kids[1]);
    if (op == "~") return joined(py_str(l), py_str(r), n.line);
    if (l.is_undefined()) fail(n.line, l.s);
    if (r.is_undefined()) fail(n.line, r.s);
    if (l.is_number() && r.is_number()) return arith(op, l, r, n.line);
    if (op == "+" && l.kind == Value::kString && r.kind == Value::kString)
      return joined(l.s, r.s, n.line);
    const bool l_list = l.kind == Value::kList && l.s.empty();  // not range, generator, ...
    const bool r_list = r.kind == Value::kList && r.s.empty();
    if (op == "+" && l_list && r_list && l.tuple == r.tuple) {
      if (l.list->size() + r.list->size() > kMaxSize / sizeof(Value))
        fail(n.line, "the list would be too large");
      List out = *l.list;
      out.insert(out.end(), r.list->begin(), r.list->end());
      return Value::of_list(std::move(out), l.tuple);
    }
    if (op == "*" && (l.kind == Value::kString || l_list) && r.is_integral())
      return repeat(l, r.integral(), n.line);
    if (op == "*" && (r.kind == Value::kString || r_list) && l.is_integral())
      return repeat(r, l.integral(), n.line);
    if (op == "%" && l.kind == Value::kString)
      fail(n.line, "printf-style string formatting with '%' is not supported");
    fail(n.line, "unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" +
                     type_name(r) + "'");
  }

  static Value arith(const std::string& op, const Value& a, const Value& b, int line) {
    if (a.is_integral() && b.is_integral() && op != "/") {
      const int64_t x = a.integral(), y = b.integral();
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") {
        overflow = __builtin_add_overflow(x, y, &r);
      } else if (op == "-") {
        overflow = __builtin_sub_overflow(x, y, &r);
      } else if (op == "*") {
        overflow = __builtin_mul_overflow(x, y, &r);
      } else if (op == "//" || op == "%") {
        if (y == 0) fail(line, "integer division or modulo by zero");
        if (y == -1) {  // x // -1 can overflow; x % -1 is 0
          if (op == "%") {
            r = 0;
          } else if (x == INT64_MIN) {
            overflow = true;
          } else {
            r = -x;
          }
        } else if (op == "//") {
          r = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
        } else {
          r = x % y;
          if (r != 0 && ((r < 0) != (y < 0))) r += y;
        }
      } else if (op == "**") {
        if (y < 0) {
          if (x == 0) fail(line, "0.0 cannot be raised to a negative power");
          return Value::real(std::pow(static_cast<double>(x), static_cast<double>(y)));
        }
        r = 1;
        for (int64_t k = 0; k < y && !overflow; ++k) overflow = __builtin_mul_overflow(r, x, &r);
      }
      if (overflow) fail(line, "integer overflow (the result does not fit in 64 bits)");
      return Value::integer(r);
    }
    const double x = a.number(), y = b.number();
    double r = 0;
    if (op == "+") {
      r = x + y;
    } else if (op == "-") {
      r = x - y;
    } else if (op == "*") {
      r = x * y;
    } else if (op == "/" || op == "//" || op == "%") {
      if (y == 0) fail(line, "division by zero");
      if (op == "/") {
        r = x / y;
      } else {  // Python's float_divmod
        double mod = std::fmod(x, y);
        double div = (x - mod) / y;
        if (mod != 0 && ((y < 0) != (mod < 0))) {
          mod += y;
          div -= 1.0;
        }
        if (op == "%") {
          r = mod != 0 ? mod : std::copysign(0.0, y);
        } else if (div != 0) {
          r = std::floor(div);
          if (div - r > 0.5) r += 1.0;
        } else {
          r = std::copysign(0.0, x / y);
        }
      }
    } else if (op == "**") {
      if (x == 0 && y < 0) fail(line, "0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) fail(line, "a negative number to a fractional power");
      r = std::pow(x, y);
    }
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y))
      fail(line, "numerical result out of range");
    return Value::real(r);
  }

  static bool contains(const Value& container, const Value& item, int line) {
    switch (container.kind) {
      case Value::kString:
        if (item.kind != Value::kString)
          fail(line, "'in <string>' requires string as left operand, not " + type_name(item));
        return container.s.find(item.s) != std::string::npos;
      case Value::kList:
        consume(container, line);
        for (const auto& e : *container.list)
          if (py_eq(e, item)) return true;
        return false;
      case Value::kDict:
        if (container.dict->type != Dict::kPlain) break;
        if (item.kind == Value::kList || item.kind == Value::kDict)
          fail(line, "unhashable type: '" + type_name(item) + "'");
        return item.kind == Value::kString && container.dict->find(item.s);
      case Value::kUndefined:
        return false;  // Undefined iterates as empty
      default:
        break;
    }
    fail(line, "argument of type '" + type_name(container) + "' is not iterable");
  }

  static bool compare(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "==") return py_eq(l, r);
    if (op == "!=") return !py_eq(l, r);
    if (op == "in") return contains(r, l, line);
    if (op == "not in") return !contains(r, l, line);
    if (l.is_undefined()) fail(line, l.s);
    if (r.is_undefined()) fail(line, r.s);
    const int c = py_cmp(l, r, line);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  // --- calls

  Value call(const Node& n) {
    if (n.iter->kind == Node::kGetattr) {
      const Value obj = eval(*n.iter->kids[0]);
      Args args = eval_args(n);
      Kwargs kwargs = eval_kwargs(n);
      return method(n.line, obj, n.iter->name, args, kwargs);
    }
    const Value f = lookup(n.iter->name);
    Args args = eval_args(n);
    Kwargs kwargs = eval_kwargs(n);
    if (f.is_undefined()) fail(n.line, f.s);
    if (f.kind != Value::kFunction) fail(n.line, "'" + type_name(f) + "' object is not callable");
    if (f.macro) return call_macro(*f.macro, n.line, args, kwargs);
    return call_global(n.line, f.s, args, kwargs);
  }

  // A macro runs in its own scope that sees its arguments and the template's top level, not
  // the caller's loop variables; it returns what it printed.
  Value call_macro(const Node& m, int line, Args& args, Kwargs& kwargs) {
    if (depth_ >= kMaxMacroDepth) fail(line, "macro recursion is too deep");
    const auto& params = m.kwargs;
    if (args.size() > params.size())
      fail(line, "macro '" + m.name + "' takes not more than " + std::to_string(params.size()) +
                     " argument(s)");
    Scope frame;
    std::vector<bool> bound(params.size());
    for (size_t k = 0; k < args.size(); ++k) {
      frame[params[k].first] = std::move(args[k]);
      bound[k] = true;
    }
    for (auto& [key, v] : kwargs) {
      size_t k = 0;
      while (k < params.size() && params[k].first != key) ++k;
      if (k == params.size()) fail(line, "macro '" + m.name + "' has no argument '" + key + "'");
      if (bound[k]) fail(line, "macro '" + m.name + "' got multiple values for '" + key + "'");
      frame[key] = std::move(v);
      bound[k] = true;
    }
    scopes_.push_back(std::move(frame));
    const size_t saved_frame = frame_;
    frame_ = scopes_.size() - 1;
    ++depth_;
    for (size_t k = 0; k < params.size(); ++k) {
      if (bound[k]) continue;
      Value v = params[k].second ? eval(*params[k].second)
                                 : Value::undefined("'" + params[k].first + "' is undefined");
      scopes_[frame_][params[k].first] = std::move(v);
    }
    std::string out;
    exec(*m.body, out);
    --depth_;
    frame_ = saved_frame;
    scopes_.pop_back();
    return Value::string(std::move(out));
  }

  static Value call_global(int line, const std::string& name, Args& args, Kwargs& kwargs) {
    if (name == "raise_exception") {
      // The template's own message, as transformers surfaces it (no line prefix).
      throw Error(args.empty() ? std::string() : py_str(args[0]));
    }
    if (name == "range") {
      if (!kwargs.empty() || args.empty() || args.size() > 3)
        fail(line, "range() takes one to three integer arguments");
      int64_t start = 0, stop = 0, step = 1;
      if (args.size() == 1) {
        stop = to_index(args[0], line, "range() argument");
      } else {
        start = to_index(args[0], line, "range() argument");
        stop = to_index(args[1], line, "range() argument");
        if (args.size() == 3) step = to_index(args[2], line, "range() argument");
      }
      if (step == 0) fail(line, "range() arg 3 must not be zero");
      const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                     static_cast<double>(step));
      if (count > static_cast<double>(kMaxRange))
        fail(line, "range too big (the sandbox allows " + std::to_string(kMaxRange) + " items)");
      List items;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step)
        items.push_back(Value::integer(k));
      Value v = Value::of_list(std::move(items));
      v.s = "range(" + std::to_string(start) + ", " + std::to_string(stop) +
            (step != 1 ? ", " + std::to_string(step) : "") + ")";
      return v;
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      if (args.size() > 1) fail(line, name + "() takes at most one positional argument");
      if (!args.empty()) {
        if (args[0].kind != Value::kDict || args[0].dict->type != Dict::kPlain)
          fail(line, name + "() expects a dict as its positional argument");
        d.items = args[0].dict->items;
      }
      for (auto& [k, v] : kwargs) d.set(k, std::move(v));
      if (name == "namespace") d.type = Dict::kNamespace;
      return of_dict(std::move(d));
    }
    if (name == "strftime_now") {
      const Bound a = bind(line, name, {"format"}, args, kwargs);
      if (!a[0]) fail(line, "strftime_now() needs a format");
      const std::string& fmt = to_text(*a[0], line, "the strftime_now() format");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      std::string buf(fmt.size() * 4 + 64, '\0');
      const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
      buf.resize(n);
      return Value::string(std::move(buf));
    }
    fail(line, "unknown function '" + name + "()'");
  }

  static Value split(int line, const std::string& s, const Bound& a, bool from_right) {
    const int64_t max = given(a[1]) ? to_index(*a[1], line, "maxsplit") : -1;
    List parts;
    auto add = [&](std::string p) { parts.push_back(Value::string(std::move(p))); };
    auto room = [&] { return max < 0 || static_cast<int64_t>(parts.size()) < max; };
    if (!given(a[0])) {  // runs of whitespace, ignoring it at the ends
      const Cps c = to_cps(s);
      if (!from_right) {
        for (size_t k = 0;;) {
          while (k < c.size() && py_isspace(c[k])) ++k;
          if (k == c.size()) break;
          if (!room()) {
            add(from_cps(c, k, c.size()));
            break;
          }
          size_t e = k;
          while (e < c.size() && !py_isspace(c[e])) ++e;
          add(from_cps(c, k, e));
          k = e;
        }
      } else {
        for (size_t e = c.size();;) {
          while (e > 0 && py_isspace(c[e - 1])) --e;
          if (e == 0) break;
          if (!room()) {
            add(from_cps(c, 0, e));
            break;
          }
          size_t b = e;
          while (b > 0 && !py_isspace(c[b - 1])) --b;
          add(from_cps(c, b, e));
          e = b;
        }
        std::reverse(parts.begin(), parts.end());
      }
      return Value::of_list(std::move(parts));
    }
    const std::string& sep = to_text(*a[0], line, "the separator");
    if (sep.empty()) fail(line, "empty separator");
    if (!from_right) {
      size_t k = 0;
      for (size_t at; room() && (at = s.find(sep, k)) != std::string::npos; k = at + sep.size())
        add(s.substr(k, at - k));
      add(s.substr(k));
    } else {
      size_t e = s.size();
      while (room() && e >= sep.size()) {
        const size_t at = s.rfind(sep, e - sep.size());
        if (at == std::string::npos) break;
        add(s.substr(at + sep.size(), e - at - sep.size()));
        e = at;
      }
      add(s.substr(0, e));
      std::reverse(parts.begin(), parts.end());
    }
    return Value::of_list(std::move(parts));
  }

  static std::string replace(const std::string& s, const std::string& from, const std::string& to,
                             int64_t count) {
    std::string out;
    int64_t done = 0;
    auto more = [&] { return count < 0 || done < count; };
    if (from.empty()) {  // Python inserts `to` around every character
      for (size_t k = 0; k < s.size();) {
        if (more()) {
          out += to;
          ++done;
        }
        put_cp(out, next_cp(s, k));
      }
      if (more()) out += to;
      return out;
    }
    size_t k = 0;
    for (size_t at; more() && (at = s.find(from, k)) != std::string::npos; k = at + from.size()) {
      out.append(s, k, at - k);
      out += to;
      ++done;
    }
    out.append(s, k, std::string::npos);
    return out;
  }

  static bool affix_matches(const std::string& s, const Value& affix, bool prefix, int line) {
    if (affix.kind == Value::kList && affix.tuple) {
      for (const auto& a : *affix.list)
        if (affix_matches(s, a, prefix, line)) return true;
      return false;
    }
    const std::string& x =
        to_text(affix, line, prefix ? "startswith() prefix" : "endswith() suffix");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  }

  static Value method(int line, const Value& obj, const std::string& name, Args& args,
                      Kwargs& kwargs) {
    if (obj.is_undefined()) fail(line, obj.s);
    const std::string what = "." + name;
    if (obj.kind == Value::kString) {
      const std::string& s = obj.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Bound a = bind(line, what, {"chars"}, args, kwargs);
        const std::string* chars = given(a[0]) ? &to_text(*a[0], line, "strip chars") : nullptr;
        return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
      }
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
        bind(line, what, {}, args, kwargs);
        return Value::string(name == "upper"   ? py_upper(s)
                             : name == "lower" ? py_lower(s)
                             : name == "title" ? py_title(s)
                                               : py_capitalize(s));
      }
      if (name == "startswith" || name == "endswith") {
        const Bound a = bind(line, what, {"affix"}, args, kwargs);
        if (!a[0]) fail(line, what + "() needs an argument");
        return Value::boolean(affix_matches(s, *a[0], name == "startswith", line));
      }
      if (name == "replace") {
        const Bound a = bind(line, what, {"old", "new", "count"}, args, kwargs);
        if (!a[0] || !a[1]) fail(line, ".replace() needs two arguments");
        return Value::string(replace(s, to_text(*a[0], line, "replace() old"),
                                     to_text(*a[1], line, "replace() new"),
                                     given(a[2]) ? to_index(*a[2], line, "count") : -1));
      }
      if (name == "find" || name == "rfind" || name == "count") {
        const Bound a = bind(line, what, {"sub"}, args, kwargs);
        if (!a[0]) fail(line, what + "() needs an argument");
        const std::string& sub = to_text(*a[0], line, what + "() argument");
        if (name == "count") {
          if (sub.empty()) return Value::integer(static_cast<int64_t>(cp_count(s)) + 1);
          int64_t c = 0;
          for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
            ++c;
          return Value::integer(c);
        }
        const size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
        return Value::integer(
            at == std::string::npos ? -1 : static_cast<int64_t>(cp_count(s.substr(0, at))));
      }
      if (name == "split" || name == "rsplit") {
        const Bound a = bind(line, what, {"sep", "maxsplit"}, args, kwargs);
        return split(line, s, a, name == "rsplit");
      }
      if (name == "join") {
        const Bound a = bind(line, what, {"iterable"}, args, kwargs);
        if (!a[0]) fail(line, ".join() needs an argument");
        std::string out;
        const List items = iterate(*a[0], line);
        for (size_t k = 0; k < items.size(); ++k)
          out += (k ? s : "") + to_text(items[k], line, "sequence item " + std::to_string(k));
        return Value::string(std::move(out));
      }
    }
    if (obj.kind == Value::kDict && obj.dict->type == Dict::kPlain) {
      if (name == "get") {
        const Bound a = bind(line, what, {"key", "default"}, args, kwargs);
        if (!a[0]) fail(line, ".get() needs a key");
        if (a[0]->kind == Value::kString)
          if (const Value* v = obj.dict->find(a[0]->s)) return *v;
        return a[1] ? *a[1] : Value::none();
      }
      if (name == "items" || name == "keys" || name == "values") {
        bind(line, what, {}, args, kwargs);
        List out;
        for (const auto& [k, v] : obj.dict->items) {
          if (name == "items") {
            out.push_back(Value::of_list({Value::string(k), v}, true));
          } else {
            out.push_back(name == "keys" ? Value::string(k) : v);
          }
        }
        Value view = Value::of_list(std::move(out));
        view.s = "dict_" + name;
        return view;
      }
    }
    fail(line, "'" + type_name(obj) + "' object has no method '" + name + "'");
  }

  // --- filters and tests

  // An item's attribute for map/selectattr/join/unique: "a.b.0" follows a path.
  static Value attribute(const Value& item, const std::string& path, int line) {
    Value v = item;
    size_t k = 0;
    for (;;) {
      const size_t dot = path.find('.', k);
      const std::string part =
          path.substr(k, dot == std::string::npos ? std::string::npos : dot - k);
      const bool index = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      v = getitem(v, index ? Value::integer(std::stoll(part)) : Value::string(part), line);
      if (dot == std::string::npos) return v;
      k = dot + 1;
    }
  }

  static int64_t length(const Value& v, int line) {
    switch (v.kind) {
      case Value::kString:
        return static_cast<int64_t>(cp_count(v.s));
      case Value::kList:
        if (v.s == kGenerator) break;
        return static_cast<int64_t>(v.list->size());
      case Value::kDict:
        if (v.dict->type != Dict::kPlain) break;
        return static_cast<int64_t>(v.dict->items.size());
      case Value::kUndefined:
        return 0;
      default:
        break;
    }
    fail(line, "object of type '" + type_name(v) + "' has no len()");
  }

  static std::string indent(const std::string& s, const Value& width, bool first, bool blank,
                            int line) {
    const std::string pad =
        width.kind == Value::kString ? width.s : spaces(width, line, "indent width");
    std::vector<std::string> lines = py_splitlines(s + "\n");
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) out += "\n";
      if (k && (blank || !lines[k].empty())) out += pad;
      out += lines[k];
    }
    return first ? pad + out : out;
  }

  static JsonStyle json_style(int line, Bound& a) {
    JsonStyle st;
    st.ensure_ascii = a[0] && truthy(*a[0]);
    if (given(a[1])) {
      st.pretty = true;
      st.item_sep = ",";
      st.indent = a[1]->kind == Value::kString ? a[1]->s : spaces(*a[1], line, "tojson indent");
    }
    if (given(a[2])) {
      if (a[2]->kind != Value::kList || a[2]->list->size() != 2)
        fail(line, "tojson separators must be a pair of strings");
      st.item_sep = to_text((*a[2]->list)[0], line, "tojson separators");
      st.key_sep = to_text((*a[2]->list)[1], line, "tojson separators");
    }
    st.sort_keys = a[3] && truthy(*a[3]);
    return st;
  }

  Value filter(int line, const std::string& name, Value v, Args& args, Kwargs& kwargs) {
    if (!kFilters.count(name)) fail(line, "unsupported filter '" + name + "'");
    if (name == "default" || name == "d") {
      const Bound a = bind(line, name, {"default_value", "boolean"}, args, kwargs);
      const bool boolean = a[1] && truthy(*a[1]);
      if (v.is_undefined() || (boolean && !truthy(v))) return a[0] ? *a[0] : Value::string("");
      return v;
    }
    if (name == "trim") {
      const Bound a = bind(line, name, {"chars"}, args, kwargs);
      const std::string* chars = given(a[0]) ? &to_text(*a[0], line, "trim chars") : nullptr;
      return Value::string(py_strip(py_str(v), chars, true, true));
    }
    if (name == "upper" || name == "lower" || name == "capitalize" || name == "title" ||
        name == "string") {
      bind(line, name, {}, args, kwargs);
      const std::string s = py_str(v);
      return Value::string(name == "upper"        ? py_upper(s)
                           : name == "lower"      ? py_lower(s)
                           : name == "capitalize" ? py_capitalize(s)
                           : name == "title"      ? jinja_title(s)
                                                  : s);
    }
    if (name == "safe") {
      bind(line, name, {}, args, kwargs);
      return v;
    }
    if (name == "length" || name == "count") {
      bind(line, name, {}, args, kwargs);
      return Value::integer(length(v, line));
    }
    if (name == "first" || name == "last") {
      bind(line, name, {}, args, kwargs);
      if (name == "last" && v.s == kGenerator) fail(line, "a generator cannot be reversed");
      const List items = iterate(v, line);
      if (items.empty()) return Value::undefined("no " + name + " item, the sequence was empty");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list" || name == "reverse") {
      bind(line, name, {}, args, kwargs);
      if (name == "reverse" && v.kind == Value::kString) {
        const Cps c = to_cps(v.s);
        std::string out;
        for (size_t k = c.size(); k-- > 0;) put_cp(out, c[k]);
        return Value::string(std::move(out));
      }
      List items = iterate(v, line);
      if (name == "list") return Value::of_list(std::move(items));
      std::reverse(items.begin(), items.end());
      return generator(std::move(items));  // reversed(): an iterator
    }
    if (name == "join") {
      const Bound a = bind(line, name, {"d", "attribute"}, args, kwargs);
      const std::string sep = a[0] ? py_str(*a[0]) : "";
      std::string out;
      const List items = iterate(v, line);
      for (size_t k = 0; k < items.size(); ++k)
        out += (k ? sep : "") +
               py_str(given(a[1]) ? attribute(items[k], py_str(*a[1]), line) : items[k]);
      return Value::string(std::move(out));
    }
    if (name == "tojson") {
      Bound a =
          bind(line, name, {"ensure_ascii", "indent", "separators", "sort_keys"}, args, kwargs);
      std::string out;
      to_json(v, json_style(line, a), 0, line, out);
      return Value::string(std::move(out));
    }
    if (name == "int") {
      const Bound a = bind(line, name, {"default", "base"}, args, kwargs);
      const Value dflt = a[0] ? *a[0] : Value::integer(0);
      const int64_t base = a[1] ? to_index(*a[1], line, "int base") : 10;
      if (base < 2 || base > 36) fail(line, "int base must be between 2 and 36");
      if (v.is_integral()) return Value::integer(v.integral());
      if (v.kind == Value::kFloat) {
        if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18)
          fail(line, "cannot convert " + float_repr(v.f) + " to an integer");
        return Value::integer(static_cast<int64_t>(v.f));
      }
      if (v.kind == Value::kString) {
        if (auto i = parse_py_int(v.s, base)) return Value::integer(*i);
        if (auto d = parse_py_float(v.s); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
          return Value::integer(static_cast<int64_t>(*d));
      }
      return dflt;
    }
    if (name == "float") {
      const Bound a = bind(line, name, {"default"}, args, kwargs);
      if (v.is_number()) return Value::real(v.number());
      if (v.kind == Value::kString)
        if (auto d = parse_py_float(v.s)) return Value::real(*d);
      return a[0] ? *a[0] : Value::real(0);
    }
    if (name == "abs") {
      bind(line, name, {}, args, kwargs);
      if (v.kind == Value::kFloat) return Value::real(std::fabs(v.f));
      if (!v.is_integral()) fail(line, "bad operand type for abs(): '" + type_name(v) + "'");
      if (v.integral() == INT64_MIN) fail(line, "integer overflow");
      return Value::integer(std::llabs(v.integral()));
    }
    if (name == "round") {
      const Bound a = bind(line, name, {"precision", "method"}, args, kwargs);
      const int64_t prec = a[0] ? to_index(*a[0], line, "round precision") : 0;
      const std::string method = a[1] ? to_text(*a[1], line, "round method") : "common";
      if (method != "common" && method != "ceil" && method != "floor")
        fail(line, "round method must be common, ceil or floor");
      if (prec < 0 || prec > 30) fail(line, "round precision must be between 0 and 30");
      if (!v.is_number()) fail(line, "round needs a number, not " + type_name(v));
      if (method == "common") {
        if (v.is_integral()) return Value::integer(v.integral());
        char buf[512];  // printf rounds the exact binary value half-even, as Python's round
        std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), v.f);
        return Value::real(std::strtod(buf, nullptr));
      }
      const double scale = std::pow(10.0, static_cast<double>(prec));
      const double x = v.number() * scale;
      return Value::real((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
    }
    if (name == "replace") {
      const Bound a = bind(line, name, {"old", "new", "count"}, args, kwargs);
      if (!a[0] || !a[1]) fail(line, "replace needs two arguments");
      return Value::string(replace(py_str(v), py_str(*a[0]), py_str(*a[1]),
                                   given(a[2]) ? to_index(*a[2], line, "count") : -1));
    }
    if (name == "items") {
      bind(line, name, {}, args, kwargs);
      if (v.is_undefined()) return Value::of_list({});
      if (v.kind != Value::kDict || v.dict->type != Dict::kPlain)
        fail(line, "the items filter needs a mapping, not " + type_name(v));
      List out;
      for (const auto& [k, val] : v.dict->items)
        out.push_back(Value::of_list({Value::string(k), val}, true));
      return generator(std::move(out));
    }
    if (name == "unique") {
      const Bound a = bind(line, name, {"case_sensitive", "attribute"}, args, kwargs);
      const bool case_sensitive = a[0] && truthy(*a[0]);
      List out, seen;
      for (const auto& item : iterate(v, line)) {
        Value key = given(a[1]) ? attribute(item, py_str(*a[1]), line) : item;
        if (!case_sensitive && key.kind == Value::kString) key.s = py_lower(key.s);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_eq(s, key); })) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return generator(std::move(out));
    }
    if (name == "indent") {
      const Bound a = bind(line, name, {"width", "first", "blank"}, args, kwargs);
      return Value::string(indent(py_str(v), a[0] ? *a[0] : Value::integer(4),
                                  a[1] && truthy(*a[1]), a[2] && truthy(*a[2]), line));
    }
    if (name == "map") {
      List out;
      const List items = iterate(v, line);
      if (!args.empty()) {  // map('filter', args...)
        const std::string inner = py_str(args[0]);
        for (const auto& item : items) {
          Args rest(args.begin() + 1, args.end());
          Kwargs kw = kwargs;
          out.push_back(filter(line, inner, item, rest, kw));
        }
        return generator(std::move(out));
      }
      const Bound a = bind(line, name, {"attribute", "default"}, args, kwargs);
      if (!a[0]) fail(line, "map needs a filter name or attribute=");
      for (const auto& item : items) {
        Value x = attribute(item, py_str(*a[0]), line);
        out.push_back(x.is_undefined() && a[1] ? *a[1] : x);
      }
      return generator(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      if (!kwargs.empty()) fail(line, name + " takes no keyword arguments");
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      if (by_attr && args.empty()) fail(line, name + " needs an attribute name");
      const size_t test_at = by_attr ? 1 : 0;
      const std::string test_name = args.size() > test_at ? py_str(args[test_at]) : "";
      if (!test_name.empty() && !kTests.count(test_name))
        fail(line, "unsupported test '" + test_name + "'");
      const bool want = name == "select" || name == "selectattr";
      List out;
      for (const auto& item : iterate(v, line)) {
        const Value x = by_attr ? attribute(item, py_str(args[0]), line) : item;
        bool ok;
        if (test_name.empty()) {
          ok = truthy(x);
        } else {
          Args rest(args.begin() + static_cast<std::ptrdiff_t>(test_at + 1), args.end());
          ok = test(line, test_name, x, rest);
        }
        if (ok == want) out.push_back(item);
      }
      return generator(std::move(out));
    }
    fail(line, "unsupported filter '" + name + "'");
  }

  static bool test(int line, const std::string& name, const Value& v, Args& args) {
    static const std::unordered_set<std::string> kNoArgument = {
        "defined",  "undefined", "none",   "boolean", "true",    "false",
        "integer",  "float",     "number", "string",  "mapping", "callable",
        "iterable", "sequence",  "lower",  "upper",   "odd",     "even"};
    if (kNoArgument.count(name) && !args.empty())
      fail(line, "test '" + name + "' takes no argument");
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.kind == Value::kNone;
    if (name == "boolean") return v.kind == Value::kBool;
    if (name == "true") return v.kind == Value::kBool && v.b;
    if (name == "false") return v.kind == Value::kBool && !v.b;
    if (name == "integer") return v.kind == Value::kInt;
    if (name == "float") return v.kind == Value::kFloat;
    if (name == "number") return v.is_number();
    if (name == "string") return v.kind == Value::kString;
    if (name == "mapping") return v.kind == Value::kDict && v.dict->type == Dict::kPlain;
    if (name == "callable") return v.kind == Value::kFunction || v.is_undefined();
    if (name == "iterable" || name == "sequence") {
      if (v.kind == Value::kList && name == "sequence")  // needs len() and []
        return v.s.empty() || type_name(v) == "range";
      return v.kind == Value::kUndefined || v.kind == Value::kString || v.kind == Value::kList ||
             (v.kind == Value::kDict && v.dict->type != Dict::kNamespace);
    }
    if (name == "lower") return py_islower(py_str(v));
    if (name == "upper") return py_isupper(py_str(v));
    if (v.is_undefined() && name != "in" && name != "eq" && name != "equalto" && name != "==" &&
        name != "ne" && name != "!=")
      fail(line, v.s);
    if (name == "odd" || name == "even") {
      if (!v.is_number()) fail(line, "test '" + name + "' needs a number, not " + type_name(v));
      const Value m = arith("%", v, Value::integer(2), line);
      return py_eq(m, Value::integer(name == "odd" ? 1 : 0));
    }
    if (args.empty()) fail(line, "test '" + name + "' needs an argument");
    const Value& other = args[0];
    if (name == "divisibleby") {
      if (!v.is_number() || !other.is_number()) fail(line, "divisibleby needs numbers");
      return py_eq(arith("%", v, other, line), Value::integer(0));
    }
    if (name == "in") return contains(other, v, line);
    if (name == "eq" || name == "equalto" || name == "==") return py_eq(v, other);
    if (name == "ne" || name == "!=") return !py_eq(v, other);
    if (other.is_undefined()) fail(line, other.s);
    const int c = py_cmp(v, other, line);
    if (name == "lt" || name == "lessthan" || name == "<") return c < 0;
    if (name == "le" || name == "<=") return c <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return c > 0;
    if (name == "ge" || name == ">=") return c >= 0;
    fail(line, "unsupported test '" + name + "'");
  }

  std::vector<Scope> scopes_;  // [0]: the context and top-level sets; then loops and macros
  size_t frame_ = 0;           // the innermost macro call's scope (0: none)
  int depth_ = 0;              // macro call depth
};

}  // namespace

Template::Template(const std::string& source) {
  root_ = Parser(Lexer(source).run()).parse_template();
}
Template::~Template() = default;
Template::Template(const Template&) = default;
Template& Template::operator=(const Template&) = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const ojson& context) const {
  if (!context.is_object()) throw Error("template context must be a JSON object");
  Variables variables;
  for (const auto& [k, v] : context.items()) variables.emplace_back(k, &v);
  return render(variables);
}

std::string Template::render(const Variables& variables) const {
  std::string out;
  Renderer(variables).render(*root_, out);
  return out;
}

}  // namespace blend::jinja
