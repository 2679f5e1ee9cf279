#include "model/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/error.h"

namespace blend::jinja {
namespace {

using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Values: Python's object model, as far as templates can see it.

struct Value;
using List = std::vector<Value>;
struct Dict;
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(Args&, Kwargs&)>;

struct Value {
  enum Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kFunction
  } kind = kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // also namespaces: shared, mutable through `set ns.x`
  std::shared_ptr<Function> fn;

  static Value none() { return make(kNone); }
  static Value boolean(bool v) {
    Value x = make(kBool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = make(kInt);
    x.i = v;
    return x;
  }
  static Value real(double v) {
    Value x = make(kFloat);
    x.f = v;
    return x;
  }
  static Value string(std::string v) {
    Value x = make(kString);
    x.s = std::move(v);
    return x;
  }
  static Value of_list(List v) {
    Value x = make(kList);
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value function(Function f) {
    Value x = make(kFunction);
    x.fn = std::make_shared<Function>(std::move(f));
    return x;
  }
  static Value make(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
  bool is_number() const { return kind == kInt || kind == kFloat || kind == kBool; }
  double number() const { return kind == kFloat ? f : kind == kInt ? static_cast<double>(i) : b; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, like Python
  const Value* find(const std::string& key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items)
      if (k == key) {
        old = std::move(v);
        return;
      }
    items.emplace_back(key, std::move(v));
  }
};

Value of_dict(Dict d) {
  Value x = Value::make(Value::kDict);
  x.dict = std::make_shared<Dict>(std::move(d));
  return x;
}

Value from_json(const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null:
      return Value::none();
    case ojson::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned:
      return Value::integer(j.get<int64_t>());
    case ojson::value_t::number_float:
      return Value::real(j.get<double>());
    case ojson::value_t::string:
      return Value::string(j.get<std::string>());
    case ojson::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value::of_list(std::move(l));
    }
    case ojson::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.items.emplace_back(k, from_json(v));
      return of_dict(std::move(d));
    }
    default:
      return Value();
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
      return !v.list->empty();
    case Value::kDict:
      return !v.dict->items.empty();
    case Value::kFunction:
      return true;
  }
  return false;
}

// Python's repr(float): the shortest text that reads back as the same double.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  const size_t e = s.find('e');
  if (e != std::string::npos) {
    // Python writes 1e-05 / 1e+16 with at least two exponent digits, as printf does; but it
    // uses exponent form only outside [1e-4, 1e16).
    const double a = std::fabs(d);
    if (a >= 1e-4 && a < 1e16) {
      std::snprintf(buf, sizeof buf, "%.17f", d);
      s = buf;
      while (s.back() == '0') s.pop_back();
      if (s.back() == '.') s += "0";
      for (int prec = 1; prec <= 17; ++prec) {  // shortest fixed form
        std::snprintf(buf, sizeof buf, "%.*f", prec, d);
        if (std::strtod(buf, nullptr) == d) {
          s = buf;
          break;
        }
      }
    }
    return s;
  }
  if (s.find('.') == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
  return s;
}

std::string py_repr(const Value& v);

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Value::kUndefined:
      return "";
    case Value::kNone:
      return "None";
    case Value::kBool:
      return v.b ? "True" : "False";
    case Value::kInt:
      return std::to_string(v.i);
    case Value::kFloat:
      return float_repr(v.f);
    case Value::kString:
      return v.s;
    default:
      return py_repr(v);
  }
}

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Value::kString: {
      const bool dq = v.s.find('\'') != std::string::npos && v.s.find('"') == std::string::npos;
      const char q = dq ? '"' : '\'';
      std::string out(1, q);
      for (char c : v.s) {
        if (c == '\\') {
          out += "\\\\";
        } else if (c == q) {
          out += '\\';
          out += c;
        } else if (c == '\n') {
          out += "\\n";
        } else if (c == '\r') {
          out += "\\r";
        } else if (c == '\t') {
          out += "\\t";
        } else {
          out += c;
        }
      }
      return out + q;
    }
    case Value::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + py_repr((*v.list)[k]);
      return out + "]";
    }
    case Value::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, val] : v.dict->items) {
        out += (first ? "" : ", ") + py_repr(Value::string(key)) + ": " + py_repr(val);
        first = false;
      }
      return out + "}";
    }
    case Value::kFunction:
      return "<function>";
    default:
      return py_str(v);
  }
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
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
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// json.dumps(x, ensure_ascii=False, indent=indent) as transformers' tojson filter calls it.
void to_json(const Value& v, int indent, int level, std::string& out) {
  const bool pretty = indent >= 0;
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.kind) {
    case Value::kUndefined:
    case Value::kNone:
      out += "null";
      break;
    case Value::kBool:
      out += v.b ? "true" : "false";
      break;
    case Value::kInt:
      out += std::to_string(v.i);
      break;
    case Value::kFloat:
      out += std::isfinite(v.f) ? float_repr(v.f)
                                : (std::isnan(v.f) ? "NaN"
                                   : v.f > 0       ? "Infinity"
                                                   : "-Infinity");
      break;
    case Value::kString:
      json_string(v.s, out);
      break;
    case Value::kList:
      if (v.list->empty()) {
        out += "[]";
        break;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += pretty ? "," : ", ";
        if (pretty) newline(level + 1);
        to_json((*v.list)[k], indent, level + 1, out);
      }
      if (pretty) newline(level);
      out += ']';
      break;
    case Value::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        break;
      }
      out += '{';
      bool first = true;
      for (const auto& [key, val] : v.dict->items) {
        if (!first) out += pretty ? "," : ", ";
        first = false;
        if (pretty) newline(level + 1);
        json_string(key, out);
        out += ": ";
        to_json(val, indent, level + 1, out);
      }
      if (pretty) newline(level);
      out += '}';
      break;
    }
    case Value::kFunction:
      throw Error("tojson: cannot serialise a function");
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.kind != b.kind)
    return (a.kind == Value::kUndefined || a.kind == Value::kNone) && a.kind == b.kind;
  switch (a.kind) {
    case Value::kString:
      return a.s == b.s;
    case Value::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, val] : a.dict->items) {
        const Value* o = b.dict->find(key);
        if (!o || !equal(val, *o)) return false;
      }
      return true;
    case Value::kUndefined:
    case Value::kNone:
      return true;
    default:
      return a.fn == b.fn;
  }
}

// ---------------------------------------------------------------------------------------------
// Lexing: template text into text / {{ }} / {% %} pieces, then tag contents into tokens.

struct Tok {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind = kEnd;
  std::string text;
  int64_t i = 0;
  double f = 0;
};

struct Piece {
  enum Kind { kText, kOutput, kStatement } kind;
  std::string text;
  int line;
};

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error("chat template line " + std::to_string(line) + ": " + what);
}

std::vector<Piece> split_template(const std::string& src) {
  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false;    // a `-` closed the previous tag
  bool trim_newline = false;  // trim_blocks after %} or #}
  auto count_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) line += src[k] == '\n';
  };
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(pos, (open == std::string::npos ? src.size() : open) - pos);
    const int text_line = line;
    count_lines(pos, open == std::string::npos ? src.size() : open);
    bool line_start = pos == 0 || src[pos - 1] == '\n';
    if (trim_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      line_start = true;
    }
    if (strip_next) {
      const size_t keep = text.find_first_not_of(" \t\r\n");
      text.erase(0, keep == std::string::npos ? text.size() : keep);
    }
    strip_next = trim_newline = false;
    if (open == std::string::npos) {
      if (!text.empty()) pieces.push_back({Piece::kText, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    const bool minus = open + 2 < src.size() && src[open + 2] == '-';
    const bool plus = open + 2 < src.size() && src[open + 2] == '+';
    if (minus) {
      const size_t keep = text.find_last_not_of(" \t\r\n");
      text.resize(keep == std::string::npos ? 0 : keep + 1);
    } else if (kind != '{' && !plus) {
      // lstrip_blocks: a block or comment tag preceded on its line only by spaces and tabs
      // takes that indentation away.
      const size_t nl = text.find_last_of('\n');
      const size_t start = nl == std::string::npos ? 0 : nl + 1;
      if ((nl != std::string::npos || line_start) &&
          text.find_first_not_of(" \t", start) == std::string::npos)
        text.resize(start);
    }
    if (!text.empty()) pieces.push_back({Piece::kText, text, text_line});
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t body_start = open + 2 + (minus || plus ? 1 : 0);
    const size_t close_at = src.find(close, body_start);
    if (close_at == std::string::npos) fail(line, std::string("unclosed '{") + kind + "'");
    size_t body_end = close_at;
    bool close_minus = false, close_plus = false;
    if (body_end > body_start && src[body_end - 1] == '-') {
      close_minus = true;
      --body_end;
    } else if (body_end > body_start && src[body_end - 1] == '+') {
      close_plus = true;
      --body_end;
    }
    const std::string body = src.substr(body_start, body_end - body_start);
    const int tag_line = line;
    count_lines(open, close_at + 2);
    if (kind == '{') pieces.push_back({Piece::kOutput, body, tag_line});
    if (kind == '%') pieces.push_back({Piece::kStatement, body, tag_line});
    strip_next = close_minus;
    trim_newline = kind != '{' && !close_minus && !close_plus;
    pos = close_at + 2;
  }
  return pieces;
}

std::vector<Tok> tokenize_expr(const std::string& s, int line) {
  std::vector<Tok> out;
  size_t k = 0;
  static const std::vector<std::string> ops = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                               "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                               "{",  "}",  ",",  ".",  ":",  "|",  "="};
  while (k < s.size()) {
    const char c = s[k];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++k;
      continue;
    }
    Tok t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      t.kind = Tok::kName;
      t.text = s.substr(k, e - k);
      k = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      bool is_float = false;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        is_float = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      std::string num = s.substr(k, e - k);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      t.kind = is_float ? Tok::kFloat : Tok::kInt;
      if (is_float) {
        t.f = std::stod(num);
      } else {
        t.i = std::stoll(num);
      }
      k = e;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t e = k + 1;
      while (e < s.size() && s[e] != c) {
        if (s[e] == '\\' && e + 1 < s.size()) {
          const char n = s[++e];
          switch (n) {
            case 'n':
              v += '\n';
              break;
            case 't':
              v += '\t';
              break;
            case 'r':
              v += '\r';
              break;
            case '\\':
            case '\'':
            case '"':
              v += n;
              break;
            default:
              v += '\\';
              v += n;
          }
        } else {
          v += s[e];
        }
        ++e;
      }
      if (e >= s.size()) fail(line, "unterminated string literal");
      t.kind = Tok::kString;
      t.text = v;
      k = e + 1;
    } else {
      bool matched = false;
      for (const auto& op : ops) {
        if (s.compare(k, op.size(), op) == 0) {
          t.kind = Tok::kOp;
          t.text = op;
          k += op.size();
          matched = true;
          break;
        }
      }
      if (!matched) fail(line, std::string("unexpected character '") + c + "'");
    }
    out.push_back(t);
  }
  out.push_back(Tok{});
  return out;
}

// ---------------------------------------------------------------------------------------------
// The AST.

}  // namespace

struct Node {
  enum Kind {
    // statements
    kBody,
    kText,
    kOutput,
    kFor,
    kIf,
    kSet,
    kSetBlock,
    kBreak,
    kContinue,
    // expressions
    kLiteral,
    kName,
    kGetattr,
    kGetitem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kBinary,
    kUnary,
    kCond,
    kListLit,
    kDictLit
  } kind;
  int line = 0;
  std::string name;  // variable, attribute, filter, test, operator, set target
  std::string attr;  // `set ns.attr`
  Value value;       // literal
  std::vector<std::shared_ptr<Node>> kids;  // operands / body statements
  std::vector<std::pair<std::string, std::shared_ptr<Node>>> kwargs;
  std::vector<std::string> targets;  // for-loop names
  std::shared_ptr<Node> cond, iter, else_body, body;
  std::vector<std::pair<std::shared_ptr<Node>, std::shared_ptr<Node>>> branches;  // if/elif
  bool negated = false;
};

namespace {

using NodeP = std::shared_ptr<Node>;

NodeP node(Node::Kind k, int line) {
  auto n = std::make_shared<Node>();
  n->kind = k;
  n->line = line;
  return n;
}

const std::set<std::string> kFilters = {
    "trim",   "length",  "count",   "upper",  "lower",  "capitalize", "title",      "first",
    "last",   "join",    "default", "d",      "tojson", "string",     "int",        "float",
    "list",   "replace", "items",   "safe",   "abs",    "selectattr", "rejectattr", "select",
    "reject", "map",     "reverse", "unique", "round",  "e",          "escape",     "indent"};
const std::set<std::string> kTests = {
    "defined",  "undefined",   "none",    "string",   "number", "integer", "float", "mapping",
    "iterable", "sequence",    "boolean", "true",     "false",  "equalto", "eq",    "odd",
    "even",     "divisibleby", "in",      "callable", "lower",  "upper"};
const std::set<std::string> kGlobals = {"raise_exception", "range", "namespace", "strftime_now",
                                        "dict"};
const std::set<std::string> kMethods = {
    "strip", "lstrip",     "rstrip", "split", "startswith", "endswith", "upper", "lower", "replace",
    "title", "capitalize", "get",    "items", "keys",       "values",   "find",  "count", "join"};

class ExprParser {
 public:
  ExprParser(std::vector<Tok> toks, int line) : t_(std::move(toks)), line_(line) {}

  NodeP parse_expression() { return parse_cond(); }
  NodeP parse_or_expression() { return parse_or(); }  // no ternary: `for x in xs if c`
  bool at_end() const { return peek().kind == Tok::kEnd; }
  const Tok& peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* n, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::kName && peek(ahead).text == n;
  }
  Tok next() { return t_[std::min(p_++, t_.size() - 1)]; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(line_, std::string("expected '") + op + "'");
    ++p_;
  }
  std::string expect_name() {
    if (peek().kind != Tok::kName) fail(line_, "expected a name");
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(line_, "unexpected '" + peek().text + "'");
  }

  // cond := or ['if' or ['else' cond]]
  NodeP parse_cond() {
    NodeP e = parse_or();
    if (is_name("if")) {
      ++p_;
      NodeP n = node(Node::kCond, line_);
      n->cond = parse_or();
      n->kids = {e};
      if (is_name("else")) {
        ++p_;
        n->kids.push_back(parse_cond());
      }
      return n;
    }
    return e;
  }

 private:
  NodeP binary(const std::string& op, NodeP l, NodeP r) {
    NodeP n = node(Node::kBinary, line_);
    n->name = op;
    n->kids = {std::move(l), std::move(r)};
    return n;
  }
  NodeP parse_or() {
    NodeP l = parse_and();
    while (is_name("or")) {
      ++p_;
      l = binary("or", l, parse_and());
    }
    return l;
  }
  NodeP parse_and() {
    NodeP l = parse_not();
    while (is_name("and")) {
      ++p_;
      l = binary("and", l, parse_not());
    }
    return l;
  }
  NodeP parse_not() {
    if (is_name("not")) {
      ++p_;
      NodeP n = node(Node::kUnary, line_);
      n->name = "not";
      n->kids = {parse_not()};
      return n;
    }
    return parse_compare();
  }
  NodeP parse_compare() {
    NodeP l = parse_math1();
    for (;;) {
      if (peek().kind == Tok::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        const std::string op = next().text;
        l = binary(op, l, parse_math1());
      } else if (is_name("in")) {
        ++p_;
        l = binary("in", l, parse_math1());
      } else if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        l = binary("not in", l, parse_math1());
      } else {
        return l;
      }
    }
  }
  NodeP parse_math1() {
    NodeP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      l = binary(op, l, parse_concat());
    }
    return l;
  }
  NodeP parse_concat() {
    NodeP l = parse_math2();
    while (is_op("~")) {
      ++p_;
      l = binary("~", l, parse_math2());
    }
    return l;
  }
  NodeP parse_math2() {
    NodeP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      l = binary(op, l, parse_pow());
    }
    return l;
  }
  NodeP parse_pow() {
    NodeP l = parse_unary();
    while (is_op("**")) {
      ++p_;
      l = binary("**", l, parse_unary());
    }
    return l;
  }
  NodeP parse_unary() {
    if (is_op("-") || is_op("+")) {
      const std::string op = next().text;
      NodeP n = node(Node::kUnary, line_);
      n->name = op;
      n->kids = {parse_unary()};
      return n;
    }
    return parse_postfix(parse_primary());
  }
  void parse_call_args(NodeP& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Tok::kName && is_op("=", 1)) {
        std::string key = next().text;
        ++p_;
        call->kwargs.emplace_back(key, parse_expression());
      } else {
        call->kids.push_back(parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
    expect_op(")");
  }
  NodeP parse_postfix(NodeP e) {
    for (;;) {
      if (is_op(".")) {
        ++p_;
        NodeP n = node(Node::kGetattr, line_);
        n->name = expect_name();
        n->kids = {e};
        e = n;
      } else if (is_op("[")) {
        ++p_;
        NodeP a, b, c;
        bool slice = false;
        if (!is_op(":")) a = parse_expression();
        if (is_op(":")) {
          slice = true;
          ++p_;
          if (!is_op("]") && !is_op(":")) b = parse_expression();
          if (is_op(":")) {
            ++p_;
            if (!is_op("]")) c = parse_expression();
          }
        }
        expect_op("]");
        NodeP n = node(slice ? Node::kSlice : Node::kGetitem, line_);
        n->kids = {e, a, b, c};
        e = n;
      } else if (is_op("(")) {
        NodeP n = node(Node::kCall, line_);
        n->iter = e;
        if (e->kind == Node::kName && !kGlobals.count(e->name))
          fail(line_, "unknown function '" + e->name + "' (macros are not supported)");
        if (e->kind == Node::kGetattr && !kMethods.count(e->name))
          fail(line_, "unsupported method '." + e->name + "()'");
        parse_call_args(n);
        e = n;
      } else if (is_op("|")) {
        ++p_;
        NodeP n = node(Node::kFilter, line_);
        n->name = expect_name();
        if (!kFilters.count(n->name)) fail(line_, "unsupported filter '" + n->name + "'");
        n->kids = {e};
        if (is_op("(")) {
          NodeP args = node(Node::kCall, line_);
          parse_call_args(args);
          for (auto& k : args->kids) n->kids.push_back(k);
          n->kwargs = args->kwargs;
        }
        e = n;
      } else if (is_name("is")) {
        ++p_;
        NodeP n = node(Node::kTest, line_);
        if (is_name("not")) {
          ++p_;
          n->negated = true;
        }
        if (peek().kind == Tok::kName) {
          n->name = next().text;
        } else if (is_op("==")) {
          ++p_;
          n->name = "eq";
        } else {
          fail(line_, "expected a test name after 'is'");
        }
        if (!kTests.count(n->name)) fail(line_, "unsupported test '" + n->name + "'");
        n->kids = {e};
        if (is_op("(")) {
          NodeP args = node(Node::kCall, line_);
          parse_call_args(args);
          for (auto& k : args->kids) n->kids.push_back(k);
        } else if (peek().kind != Tok::kEnd && peek().kind != Tok::kOp && !is_name("and") &&
                   !is_name("or") && !is_name("else") && !is_name("if")) {
          n->kids.push_back(parse_primary());  // `x is divisibleby 3`, `x is eq y`
        } else if (peek().kind == Tok::kString || peek().kind == Tok::kInt) {
          n->kids.push_back(parse_primary());
        }
        e = n;
      } else {
        return e;
      }
    }
  }
  NodeP parse_primary() {
    const Tok t = next();
    NodeP n = node(Node::kLiteral, line_);
    switch (t.kind) {
      case Tok::kString: {
        std::string s = t.text;
        while (peek().kind == Tok::kString) s += next().text;  // adjacent literals concatenate
        n->value = Value::string(s);
        return n;
      }
      case Tok::kInt:
        n->value = Value::integer(t.i);
        return n;
      case Tok::kFloat:
        n->value = Value::real(t.f);
        return n;
      case Tok::kName:
        if (t.text == "true" || t.text == "True") {
          n->value = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          n->value = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          n->value = Value::none();
        } else {
          n->kind = Node::kName;
          n->name = t.text;
        }
        return n;
      case Tok::kOp:
        if (t.text == "(") {
          NodeP e = parse_expression();
          if (is_op(",")) {  // a tuple: treat as a list
            NodeP l = node(Node::kListLit, line_);
            l->kids.push_back(e);
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              l->kids.push_back(parse_expression());
            }
            e = l;
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          NodeP l = node(Node::kListLit, line_);
          while (!is_op("]")) {
            l->kids.push_back(parse_expression());
            if (!is_op("]")) expect_op(",");
          }
          expect_op("]");
          return l;
        }
        if (t.text == "{") {
          NodeP d = node(Node::kDictLit, line_);
          while (!is_op("}")) {
            d->kids.push_back(parse_expression());
            expect_op(":");
            d->kids.push_back(parse_expression());
            if (!is_op("}")) expect_op(",");
          }
          expect_op("}");
          return d;
        }
        break;
      case Tok::kEnd:
        fail(line_, "unexpected end of expression");
    }
    fail(line_, "unexpected '" + t.text + "'");
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  int line_;
};

// Statements: a recursive-descent parser over the pieces.
class StatementParser {
 public:
  explicit StatementParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  NodeP parse_all() {
    NodeP body = parse_body({});
    if (pos_ < pieces_.size())
      fail(pieces_[pos_].line, "unexpected '" + keyword_of(pieces_[pos_]) + "'");
    return body;
  }

 private:
  static std::string keyword_of(const Piece& p) {
    const size_t b = p.text.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    size_t e = b;
    while (e < p.text.size() &&
           (std::isalnum(static_cast<unsigned char>(p.text[e])) || p.text[e] == '_'))
      ++e;
    return p.text.substr(b, e - b);
  }

  // Parses statements until one of `stops` (a block keyword) is reached; leaves it unconsumed.
  NodeP parse_body(const std::set<std::string>& stops) {
    NodeP body = node(Node::kBody, pos_ < pieces_.size() ? pieces_[pos_].line : 0);
    while (pos_ < pieces_.size()) {
      const Piece& p = pieces_[pos_];
      if (p.kind == Piece::kText) {
        NodeP t = node(Node::kText, p.line);
        t->value = Value::string(p.text);
        body->kids.push_back(t);
        ++pos_;
        continue;
      }
      if (p.kind == Piece::kOutput) {
        ExprParser ep(tokenize_expr(p.text, p.line), p.line);
        NodeP o = node(Node::kOutput, p.line);
        o->kids = {ep.parse_expression()};
        ep.expect_end();
        body->kids.push_back(o);
        ++pos_;
        continue;
      }
      const std::string kw = keyword_of(p);
      if (stops.count(kw)) return body;
      body->kids.push_back(parse_statement(kw));
    }
    if (!stops.empty()) {
      std::string want;
      for (const auto& s : stops) want += (want.empty() ? "" : " or ") + s;
      fail(pieces_.empty() ? 0 : pieces_.back().line, "missing '" + want + "'");
    }
    return body;
  }

  ExprParser tag_parser(const Piece& p) {
    ExprParser ep(tokenize_expr(p.text, p.line), p.line);
    ep.next();  // the keyword
    return ep;
  }

  NodeP parse_statement(const std::string& kw) {
    const Piece& p = pieces_[pos_];
    const int line = p.line;
    if (kw == "for") {
      ExprParser ep = tag_parser(p);
      NodeP f = node(Node::kFor, line);
      f->targets.push_back(ep.expect_name());
      while (ep.is_op(",")) {
        ep.next();
        f->targets.push_back(ep.expect_name());
      }
      if (!ep.is_name("in")) fail(line, "expected 'in' in for loop");
      ep.next();
      f->iter = ep.parse_or_expression();
      if (ep.is_name("if")) {
        ep.next();
        f->cond = ep.parse_expression();
      }
      if (ep.is_name("recursive")) fail(line, "recursive loops are not supported");
      ep.expect_end();
      ++pos_;
      f->body = parse_body({"else", "endfor"});
      if (keyword_of(pieces_[pos_]) == "else") {
        ++pos_;
        f->else_body = parse_body({"endfor"});
      }
      ++pos_;  // endfor
      return f;
    }
    if (kw == "if") {
      NodeP n = node(Node::kIf, line);
      std::string cur = "if";
      while (cur == "if" || cur == "elif") {
        ExprParser ep = tag_parser(pieces_[pos_]);
        NodeP cond = ep.parse_expression();
        ep.expect_end();
        ++pos_;
        NodeP body = parse_body({"elif", "else", "endif"});
        n->branches.emplace_back(cond, body);
        cur = keyword_of(pieces_[pos_]);
      }
      if (cur == "else") {
        ++pos_;
        n->else_body = parse_body({"endif"});
      }
      ++pos_;  // endif
      return n;
    }
    if (kw == "set") {
      ExprParser ep = tag_parser(p);
      NodeP n = node(Node::kSet, line);
      n->name = ep.expect_name();
      if (ep.is_op(".")) {
        ep.next();
        n->attr = ep.expect_name();
      }
      ++pos_;
      if (ep.at_end()) {  // {% set x %}...{% endset %}
        n->kind = Node::kSetBlock;
        n->body = parse_body({"endset"});
        ++pos_;
        return n;
      }
      ep.expect_op("=");
      n->kids = {ep.parse_expression()};
      ep.expect_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      ++pos_;
      return node(kw == "break" ? Node::kBreak : Node::kContinue, line);
    }
    fail(line, "unsupported statement '" + kw + "'");
  }

  std::vector<Piece> pieces_;
  size_t pos_ = 0;
};

}  // namespace
}  // namespace blend::jinja

namespace blend::jinja {
namespace {

// ---------------------------------------------------------------------------------------------
// Rendering.

struct LoopControl {
  enum { kNone, kBreak, kContinue } state = kNone;
};

class Renderer {
 public:
  explicit Renderer(const ojson& context) {
    scopes_.emplace_back();
    for (const auto& [k, v] : context.items()) scopes_.back()[k] = from_json(v);
  }

  void exec(const Node& n, std::string& out, LoopControl& lc) {
    switch (n.kind) {
      case Node::kBody:
        for (const auto& k : n.kids) {
          exec(*k, out, lc);
          if (lc.state != LoopControl::kNone) return;
        }
        return;
      case Node::kText:
        out += n.value.s;
        return;
      case Node::kOutput:
        out += py_str(eval(*n.kids[0]));
        return;
      case Node::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (truthy(eval(*cond))) {
            exec(*body, out, lc);
            return;
          }
        }
        if (n.else_body) exec(*n.else_body, out, lc);
        return;
      case Node::kFor:
        exec_for(n, out, lc);
        return;
      case Node::kSet:
        assign(n, eval(*n.kids[0]));
        return;
      case Node::kSetBlock: {
        std::string captured;
        LoopControl inner;
        exec(*n.body, captured, inner);
        assign(n, Value::string(captured));
        return;
      }
      case Node::kBreak:
        lc.state = LoopControl::kBreak;
        return;
      case Node::kContinue:
        lc.state = LoopControl::kContinue;
        return;
      default:
        fail(n.line, "internal: expression used as a statement");
    }
  }

 private:
  void assign(const Node& n, Value v) {
    if (n.attr.empty()) {
      scopes_.back()[n.name] = std::move(v);
      return;
    }
    Value target = lookup(n.name);
    if (target.kind != Value::kDict) fail(n.line, "cannot set an attribute of '" + n.name + "'");
    target.dict->set(n.attr, std::move(v));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  static List iterate(const Value& v, int line) {
    switch (v.kind) {
      case Value::kList:
        return *v.list;
      case Value::kDict: {
        List keys;
        for (const auto& [k, val] : v.dict->items) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::kString: {
        List chars;
        for (size_t k = 0; k < v.s.size();) {
          size_t n = 1;
          const auto c = static_cast<unsigned char>(v.s[k]);
          if (c >= 0xF0) {
            n = 4;
          } else if (c >= 0xE0) {
            n = 3;
          } else if (c >= 0xC0) {
            n = 2;
          }
          chars.push_back(Value::string(v.s.substr(k, n)));
          k += n;
        }
        return chars;
      }
      case Value::kUndefined:
        return {};
      default:
        fail(line, "value is not iterable");
    }
  }

  void exec_for(const Node& n, std::string& out, LoopControl& outer) {
    (void)outer;
    List items = iterate(eval(*n.iter), n.line);
    if (n.cond) {  // the `if` filter runs before loop variables are computed
      List kept;
      for (auto& item : items) {
        scopes_.emplace_back();
        bind_targets(n, item);
        if (truthy(eval(*n.cond))) kept.push_back(item);
        scopes_.pop_back();
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.else_body) exec(*n.else_body, out, outer);
      return;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      scopes_.emplace_back();
      bind_targets(n, items[static_cast<size_t>(k)]);
      Dict loop;
      loop.set("index", Value::integer(k + 1));
      loop.set("index0", Value::integer(k));
      loop.set("revindex", Value::integer(len - k));
      loop.set("revindex0", Value::integer(len - k - 1));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == len - 1));
      loop.set("length", Value::integer(len));
      loop.set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value());
      loop.set("nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value());
      scopes_.back()["loop"] = of_dict(std::move(loop));
      LoopControl lc;
      exec(*n.body, out, lc);
      scopes_.pop_back();
      if (lc.state == LoopControl::kBreak) break;
    }
  }

  void bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    if (item.kind != Value::kList || item.list->size() != n.targets.size())
      fail(n.line, "cannot unpack loop item into " + std::to_string(n.targets.size()) + " names");
    for (size_t k = 0; k < n.targets.size(); ++k) scopes_.back()[n.targets[k]] = (*item.list)[k];
  }

  static int64_t as_int(const Value& v, int line) {
    if (v.kind == Value::kInt) return v.i;
    if (v.kind == Value::kBool) return v.b;
    fail(line, "expected an integer");
  }

  static Value get_attr(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Value::kDict) {
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value();
    }
    if (obj.kind == Value::kUndefined) fail(line, "'" + name + "' of an undefined value");
    return Value();  // other attributes: undefined (methods are handled at call sites)
  }

  static Value get_item(const Value& obj, const Value& key, int line) {
    if (obj.kind == Value::kDict) {
      if (key.kind != Value::kString) return Value();
      if (const Value* v = obj.dict->find(key.s)) return *v;
      return Value();
    }
    if (obj.kind == Value::kList || obj.kind == Value::kString) {
      // Strings index by code point, as Python's do.
      const List chars = obj.kind == Value::kString ? iterate(obj, line) : List();
      const List& seq = obj.kind == Value::kList ? *obj.list : chars;
      const int64_t size = static_cast<int64_t>(seq.size());
      int64_t k = as_int(key, line);
      if (k < 0) k += size;
      if (k < 0 || k >= size) return Value();
      return seq[static_cast<size_t>(k)];
    }
    if (obj.kind == Value::kUndefined) fail(line, "indexing an undefined value");
    return Value();
  }

  Value slice(const Node& n) {
    const Value obj = eval(*n.kids[0]);
    const bool is_list = obj.kind == Value::kList;
    if (!is_list && obj.kind != Value::kString) fail(n.line, "slicing needs a list or a string");
    const List chars = is_list ? List() : iterate(obj, n.line);  // code points
    const List& seq = is_list ? *obj.list : chars;
    const int64_t size = static_cast<int64_t>(seq.size());
    const int64_t step = n.kids[3] ? as_int(eval(*n.kids[3]), n.line) : 1;
    if (step == 0) fail(n.line, "slice step cannot be zero");
    auto norm = [&](const NodeP& e, int64_t dflt) {
      if (!e) return dflt;
      int64_t v = as_int(eval(*e), n.line);
      if (v < 0) v += size;
      return step > 0 ? std::clamp<int64_t>(v, 0, size) : std::clamp<int64_t>(v, -1, size - 1);
    };
    const int64_t start = norm(n.kids[1], step > 0 ? 0 : size - 1);
    const int64_t stop = norm(n.kids[2], step > 0 ? size : -1);
    List out_list;
    std::string out_str;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (is_list) {
        out_list.push_back(seq[static_cast<size_t>(k)]);
      } else {
        out_str += seq[static_cast<size_t>(k)].s;
      }
    }
    return is_list ? Value::of_list(std::move(out_list)) : Value::string(out_str);
  }

  static std::string strip_chars(const std::string& s, const std::string& chars, bool left,
                                 bool right) {
    size_t b = 0, e = s.size();
    if (left) {
      b = s.find_first_not_of(chars);
      if (b == std::string::npos) return "";
    }
    if (right) {
      const size_t last = s.find_last_not_of(chars);
      if (last == std::string::npos) return "";
      e = last + 1;
    }
    return b < e ? s.substr(b, e - b) : "";
  }

  static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    if (from.empty()) return s;
    size_t at = 0;
    while ((at = s.find(from, at)) != std::string::npos) {
      s.replace(at, from.size(), to);
      at += to.size();
    }
    return s;
  }

  static std::string upper(std::string s) {
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string capitalize(const std::string& s) {
    std::string out = lower(s);
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return out;
  }
  static std::string title(const std::string& s) {
    std::string out = s;
    bool start = true;
    for (char& c : out) {
      const auto u = static_cast<unsigned char>(c);
      if (std::isalpha(u)) {
        c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
        start = false;
      } else {
        start = true;
      }
    }
    return out;
  }

  static const std::string kWhitespace;

  Value call_method(const Node& call, const Value& obj, const std::string& name, Args& args) {
    auto str_arg = [&](size_t k) -> std::string {
      if (k >= args.size() || args[k].kind != Value::kString)
        fail(call.line, "." + name + "() expects a string argument");
      return args[k].s;
    };
    if (obj.kind == Value::kString) {
      const std::string& s = obj.s;
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const std::string chars =
            args.empty() || args[0].kind == Value::kNone ? kWhitespace : str_arg(0);
        return Value::string(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
      }
      if (name == "upper") return Value::string(upper(s));
      if (name == "lower") return Value::string(lower(s));
      if (name == "title") return Value::string(title(s));
      if (name == "capitalize") return Value::string(capitalize(s));
      if (name == "startswith") return Value::boolean(s.rfind(str_arg(0), 0) == 0);
      if (name == "endswith") {
        const std::string suf = str_arg(0);
        return Value::boolean(s.size() >= suf.size() &&
                              s.compare(s.size() - suf.size(), suf.size(), suf) == 0);
      }
      if (name == "replace") return Value::string(replace_all(s, str_arg(0), str_arg(1)));
      if (name == "find") {
        const size_t at = s.find(str_arg(0));
        return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(at));
      }
      if (name == "count") {
        const std::string sub = str_arg(0);
        int64_t c = 0;
        for (size_t at = s.find(sub); !sub.empty() && at != std::string::npos;
             at = s.find(sub, at + sub.size()))
          ++c;
        return Value::integer(c);
      }
      if (name == "split") {
        List parts;
        if (args.empty() || args[0].kind == Value::kNone) {  // split on runs of whitespace
          size_t k = 0;
          while (k < s.size()) {
            k = s.find_first_not_of(kWhitespace, k);
            if (k == std::string::npos) break;
            size_t e = s.find_first_of(kWhitespace, k);
            if (e == std::string::npos) e = s.size();
            parts.push_back(Value::string(s.substr(k, e - k)));
            k = e;
          }
        } else {
          const std::string sep = str_arg(0);
          if (sep.empty()) fail(call.line, "empty separator");
          size_t k = 0, at;
          while ((at = s.find(sep, k)) != std::string::npos) {
            parts.push_back(Value::string(s.substr(k, at - k)));
            k = at + sep.size();
          }
          parts.push_back(Value::string(s.substr(k)));
        }
        return Value::of_list(std::move(parts));
      }
      if (name == "join") {
        if (args.empty()) fail(call.line, ".join() needs a list");
        std::string out;
        const List items = iterate(args[0], call.line);
        for (size_t k = 0; k < items.size(); ++k) out += (k ? s : "") + py_str(items[k]);
        return Value::string(out);
      }
    }
    if (obj.kind == Value::kDict) {
      if (name == "get") {
        if (args.empty()) fail(call.line, ".get() needs a key");
        if (args[0].kind == Value::kString)
          if (const Value* v = obj.dict->find(args[0].s)) return *v;
        return args.size() > 1 ? args[1] : Value::none();
      }
      if (name == "items" || name == "keys" || name == "values") {
        List out;
        for (const auto& [k, v] : obj.dict->items) {
          if (name == "items") {
            out.push_back(Value::of_list({Value::string(k), v}));
          } else {
            out.push_back(name == "keys" ? Value::string(k) : v);
          }
        }
        return Value::of_list(std::move(out));
      }
    }
    fail(call.line, "no method '." + name + "()' on this value");
  }

  Value call_global(const Node& call, const std::string& name, Args& args, Kwargs& kwargs) {
    if (name == "raise_exception") {
      throw Error(args.empty() ? std::string("raise_exception") : py_str(args[0]));
    }
    if (name == "range") {
      int64_t start = 0, stop = 0, step = 1;
      if (args.size() == 1) {
        stop = as_int(args[0], call.line);
      } else if (args.size() >= 2) {
        start = as_int(args[0], call.line);
        stop = as_int(args[1], call.line);
        if (args.size() > 2) step = as_int(args[2], call.line);
      }
      if (step == 0) fail(call.line, "range() step cannot be zero");
      List out;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step)
        out.push_back(Value::integer(k));
      return Value::of_list(std::move(out));
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      for (auto& [k, v] : kwargs) d.set(k, v);
      return of_dict(std::move(d));
    }
    if (name == "strftime_now") {
      if (args.empty() || args[0].kind != Value::kString) fail(call.line, "strftime_now(format)");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, args[0].s.c_str(), &tm);
      return Value::string(std::string(buf, n));
    }
    fail(call.line, "unknown function '" + name + "'");
  }

  Value apply_filter(const Node& n, const Value& v, Args& args, Kwargs& kwargs) {
    const std::string& f = n.name;
    auto kwarg = [&](const char* key) -> const Value* {
      for (auto& [k, val] : kwargs)
        if (k == key) return &val;
      return nullptr;
    };
    if (f == "trim") return Value::string(strip_chars(py_str(v), kWhitespace, true, true));
    if (f == "length" || f == "count") {
      if (v.kind == Value::kString)
        return Value::integer(static_cast<int64_t>(iterate(v, n.line).size()));
      if (v.kind == Value::kList) return Value::integer(static_cast<int64_t>(v.list->size()));
      if (v.kind == Value::kDict) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      if (v.kind == Value::kUndefined) return Value::integer(0);
      fail(n.line, "length of a value without one");
    }
    if (f == "upper") return Value::string(upper(py_str(v)));
    if (f == "lower") return Value::string(lower(py_str(v)));
    if (f == "capitalize") return Value::string(capitalize(py_str(v)));
    if (f == "title") return Value::string(title(py_str(v)));
    if (f == "string") return Value::string(py_str(v));
    if (f == "safe" || f == "e" || f == "escape") {
      if (f != "safe") fail(n.line, "HTML escaping is not supported");
      return v;
    }
    if (f == "first" || f == "last") {
      const List items = iterate(v, n.line);
      if (items.empty()) return Value();
      return f == "first" ? items.front() : items.back();
    }
    if (f == "reverse") {
      if (v.kind == Value::kString) {
        const List chars = iterate(v, n.line);
        std::string out;
        for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->s;
        return Value::string(out);
      }
      List items = iterate(v, n.line);
      std::reverse(items.begin(), items.end());
      return Value::of_list(std::move(items));
    }
    if (f == "list") return Value::of_list(iterate(v, n.line));
    if (f == "join") {
      const std::string sep = args.empty() ? "" : py_str(args[0]);
      const Value* attr = kwarg("attribute");
      std::string out;
      const List items = iterate(v, n.line);
      for (size_t k = 0; k < items.size(); ++k) {
        const Value item = attr ? get_attr(items[k], py_str(*attr), n.line) : items[k];
        out += (k ? sep : "") + py_str(item);
      }
      return Value::string(out);
    }
    if (f == "default" || f == "d") {
      const bool boolean = args.size() > 1 && truthy(args[1]);
      const bool use_default = v.kind == Value::kUndefined || (boolean && !truthy(v));
      return use_default ? (args.empty() ? Value::string("") : args[0]) : v;
    }
    if (f == "tojson") {
      int indent = -1;
      if (!args.empty() && args[0].kind == Value::kInt) indent = static_cast<int>(args[0].i);
      if (const Value* ind = kwarg("indent"); ind && ind->kind == Value::kInt)
        indent = static_cast<int>(ind->i);
      std::string out;
      to_json(v, indent, 0, out);
      return Value::string(out);
    }
    if (f == "int") {
      if (v.kind == Value::kInt) return v;
      if (v.kind == Value::kFloat) return Value::integer(static_cast<int64_t>(v.f));
      if (v.kind == Value::kBool) return Value::integer(v.b);
      if (v.kind == Value::kString) {
        try {
          return Value::integer(std::stoll(v.s));
        } catch (const std::exception&) {
        }
      }
      return Value::integer(0);
    }
    if (f == "float") {
      if (v.is_number()) return Value::real(v.number());
      if (v.kind == Value::kString) {
        try {
          return Value::real(std::stod(v.s));
        } catch (const std::exception&) {
        }
      }
      return Value::real(0);
    }
    if (f == "abs") {
      if (v.kind == Value::kInt) return Value::integer(v.i < 0 ? -v.i : v.i);
      return Value::real(std::fabs(v.number()));
    }
    if (f == "round") {
      const int64_t digits = args.empty() ? 0 : as_int(args[0], n.line);
      const double scale = std::pow(10.0, static_cast<double>(digits));
      return Value::real(std::nearbyint(v.number() * scale) / scale);
    }
    if (f == "replace") {
      if (args.size() < 2) fail(n.line, "replace needs two arguments");
      return Value::string(replace_all(py_str(v), py_str(args[0]), py_str(args[1])));
    }
    if (f == "items") return call_method(n, v, "items", args);
    if (f == "unique") {
      List out;
      for (const auto& item : iterate(v, n.line)) {
        bool seen = false;
        for (const auto& o : out) seen |= equal(o, item);
        if (!seen) out.push_back(item);
      }
      return Value::of_list(std::move(out));
    }
    if (f == "indent") {
      const int64_t width = args.empty() ? 4 : as_int(args[0], n.line);
      const std::string pad(static_cast<size_t>(width), ' ');
      return Value::string(replace_all(py_str(v), "\n", "\n" + pad));
    }
    if (f == "map") {
      const Value* attr = kwarg("attribute");
      List out;
      for (const auto& item : iterate(v, n.line)) {
        if (attr) {
          out.push_back(get_attr(item, py_str(*attr), n.line));
        } else if (!args.empty() && args[0].kind == Value::kString) {
          Node fake = n;
          fake.name = args[0].s;
          if (!kFilters.count(fake.name)) fail(n.line, "unsupported filter '" + fake.name + "'");
          Args rest(args.begin() + 1, args.end());
          Kwargs none;
          out.push_back(apply_filter(fake, item, rest, none));
        } else {
          fail(n.line, "map needs attribute= or a filter name");
        }
      }
      return Value::of_list(std::move(out));
    }
    if (f == "select" || f == "reject") {
      List out;
      for (const auto& item : iterate(v, n.line)) {
        bool keep;
        if (!args.empty()) {
          Node t = n;
          t.name = py_str(args[0]);
          if (!kTests.count(t.name)) fail(n.line, "unsupported test '" + t.name + "'");
          Args targs(args.begin() + 1, args.end());
          keep = run_test(t, item, targs);
        } else {
          keep = truthy(item);
        }
        if (keep == (f == "select")) out.push_back(item);
      }
      return Value::of_list(std::move(out));
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (args.empty()) fail(n.line, f + " needs an attribute name");
      const std::string attr = py_str(args[0]);
      List out;
      for (const auto& item : iterate(v, n.line)) {
        const Value a = get_attr(item, attr, n.line);
        bool keep;
        if (args.size() > 1) {
          Node t = n;
          t.name = py_str(args[1]);
          if (!kTests.count(t.name)) fail(n.line, "unsupported test '" + t.name + "'");
          Args targs(args.begin() + 2, args.end());
          keep = run_test(t, a, targs);
        } else {
          keep = truthy(a);
        }
        if (keep == (f == "selectattr")) out.push_back(item);
      }
      return Value::of_list(std::move(out));
    }
    fail(n.line, "unsupported filter '" + f + "'");
  }

  bool run_test(const Node& n, const Value& v, Args& args) {
    const std::string& t = n.name;
    if (t == "defined") return v.kind != Value::kUndefined;
    if (t == "undefined") return v.kind == Value::kUndefined;
    if (t == "none") return v.kind == Value::kNone;
    if (t == "string") return v.kind == Value::kString;
    if (t == "number") return v.kind == Value::kInt || v.kind == Value::kFloat;
    if (t == "integer") return v.kind == Value::kInt;
    if (t == "float") return v.kind == Value::kFloat;
    if (t == "boolean") return v.kind == Value::kBool;
    if (t == "true") return v.kind == Value::kBool && v.b;
    if (t == "false") return v.kind == Value::kBool && !v.b;
    if (t == "mapping") return v.kind == Value::kDict;
    if (t == "iterable")
      return v.kind == Value::kList || v.kind == Value::kDict || v.kind == Value::kString;
    if (t == "sequence")
      return v.kind == Value::kList || v.kind == Value::kDict || v.kind == Value::kString;
    if (t == "callable") return v.kind == Value::kFunction;
    if (t == "lower") return v.kind == Value::kString && lower(v.s) == v.s;
    if (t == "upper") return v.kind == Value::kString && upper(v.s) == v.s;
    if (t == "odd" || t == "even") {
      const int64_t k = as_int(v, n.line);
      return (k % 2 != 0) == (t == "odd");
    }
    if (args.empty()) fail(n.line, "test '" + t + "' needs an argument");
    if (t == "equalto" || t == "eq") return equal(v, args[0]);
    if (t == "divisibleby") {
      const int64_t d = as_int(args[0], n.line);
      return d != 0 && as_int(v, n.line) % d == 0;
    }
    if (t == "in") return contains(args[0], v, n.line);
    fail(n.line, "unsupported test '" + t + "'");
  }

  static bool contains(const Value& container, const Value& item, int line) {
    if (container.kind == Value::kString) {
      if (item.kind != Value::kString) fail(line, "'in <string>' needs a string on the left");
      return container.s.find(item.s) != std::string::npos;
    }
    if (container.kind == Value::kList) {
      for (const auto& e : *container.list)
        if (equal(e, item)) return true;
      return false;
    }
    if (container.kind == Value::kDict)
      return item.kind == Value::kString && container.dict->find(item.s);
    if (container.kind == Value::kUndefined) fail(line, "'in' on an undefined value");
    return false;
  }

  Value binary(const Node& n) {
    const std::string& op = n.name;
    if (op == "and") {
      Value l = eval(*n.kids[0]);
      return truthy(l) ? eval(*n.kids[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*n.kids[0]);
      return truthy(l) ? l : eval(*n.kids[1]);
    }
    const Value l = eval(*n.kids[0]);
    const Value r = eval(*n.kids[1]);
    if (op == "~") return Value::string(py_str(l) + py_str(r));
    if (op == "==") return Value::boolean(equal(l, r));
    if (op == "!=") return Value::boolean(!equal(l, r));
    if (op == "in") return Value::boolean(contains(r, l, n.line));
    if (op == "not in") return Value::boolean(!contains(r, l, n.line));
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int c;
      if (l.is_number() && r.is_number()) {
        c = l.number() < r.number() ? -1 : l.number() > r.number() ? 1 : 0;
      } else if (l.kind == Value::kString && r.kind == Value::kString) {
        c = l.s.compare(r.s);
      } else {
        fail(n.line, "cannot compare these values with '" + op + "'");
      }
      if (op == "<") return Value::boolean(c < 0);
      if (op == "<=") return Value::boolean(c <= 0);
      if (op == ">") return Value::boolean(c > 0);
      return Value::boolean(c >= 0);
    }
    if (op == "+") {
      if (l.kind == Value::kString && r.kind == Value::kString) return Value::string(l.s + r.s);
      if (l.kind == Value::kList && r.kind == Value::kList) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::of_list(std::move(out));
      }
    }
    if (op == "*" && l.kind == Value::kString && r.kind == Value::kInt) {
      std::string out;
      for (int64_t k = 0; k < r.i; ++k) out += l.s;
      return Value::string(out);
    }
    if (!l.is_number() || !r.is_number()) fail(n.line, "operator '" + op + "' needs numbers here");
    const bool ints = l.kind != Value::kFloat && r.kind != Value::kFloat;
    const double a = l.number(), b = r.number();
    if (op == "+")
      return ints ? Value::integer(static_cast<int64_t>(a) + static_cast<int64_t>(b))
                  : Value::real(a + b);
    if (op == "-")
      return ints ? Value::integer(static_cast<int64_t>(a) - static_cast<int64_t>(b))
                  : Value::real(a - b);
    if (op == "*")
      return ints ? Value::integer(static_cast<int64_t>(a) * static_cast<int64_t>(b))
                  : Value::real(a * b);
    if (op == "**")
      return ints && b >= 0 ? Value::integer(static_cast<int64_t>(std::pow(a, b)))
                            : Value::real(std::pow(a, b));
    if (b == 0) fail(n.line, "division by zero");
    if (op == "/") return Value::real(a / b);
    if (op == "//")
      return ints ? Value::integer(static_cast<int64_t>(std::floor(a / b)))
                  : Value::real(std::floor(a / b));
    if (op == "%") {
      if (ints) {
        const int64_t x = static_cast<int64_t>(a), y = static_cast<int64_t>(b);
        const int64_t m = x % y;
        return Value::integer(m != 0 && ((m < 0) != (y < 0)) ? m + y : m);
      }
      return Value::real(a - b * std::floor(a / b));
    }
    fail(n.line, "unknown operator '" + op + "'");
  }

  Value eval(const Node& n) {
    switch (n.kind) {
      case Node::kLiteral:
        return n.value;
      case Node::kName:
        return lookup(n.name);
      case Node::kGetattr:
        return get_attr(eval(*n.kids[0]), n.name, n.line);
      case Node::kGetitem:
        return get_item(eval(*n.kids[0]), eval(*n.kids[1]), n.line);
      case Node::kSlice:
        return slice(n);
      case Node::kListLit: {
        List out;
        for (const auto& k : n.kids) out.push_back(eval(*k));
        return Value::of_list(std::move(out));
      }
      case Node::kDictLit: {
        Dict d;
        for (size_t k = 0; k + 1 < n.kids.size(); k += 2) {
          const Value key = eval(*n.kids[k]);
          if (key.kind != Value::kString) fail(n.line, "dict keys must be strings");
          d.set(key.s, eval(*n.kids[k + 1]));
        }
        return of_dict(std::move(d));
      }
      case Node::kUnary: {
        const Value v = eval(*n.kids[0]);
        if (n.name == "not") return Value::boolean(!truthy(v));
        if (!v.is_number()) fail(n.line, "unary '" + n.name + "' needs a number");
        if (n.name == "+") return v;
        return v.kind == Value::kFloat ? Value::real(-v.f)
                                       : Value::integer(-static_cast<int64_t>(v.number()));
      }
      case Node::kBinary:
        return binary(n);
      case Node::kCond:
        if (truthy(eval(*n.cond))) return eval(*n.kids[0]);
        return n.kids.size() > 1 ? eval(*n.kids[1]) : Value();
      case Node::kCall: {
        Args args;
        for (const auto& k : n.kids) args.push_back(eval(*k));
        Kwargs kwargs;
        for (const auto& [k, e] : n.kwargs) kwargs.emplace_back(k, eval(*e));
        if (n.iter->kind == Node::kGetattr)
          return call_method(n, eval(*n.iter->kids[0]), n.iter->name, args);
        if (n.iter->kind == Node::kName) return call_global(n, n.iter->name, args, kwargs);
        fail(n.line, "this expression cannot be called");
      }
      case Node::kFilter: {
        const Value v = eval(*n.kids[0]);
        Args args;
        for (size_t k = 1; k < n.kids.size(); ++k) args.push_back(eval(*n.kids[k]));
        Kwargs kwargs;
        for (const auto& [k, e] : n.kwargs) kwargs.emplace_back(k, eval(*e));
        return apply_filter(n, v, args, kwargs);
      }
      case Node::kTest: {
        const Value v = eval(*n.kids[0]);
        Args args;
        for (size_t k = 1; k < n.kids.size(); ++k) args.push_back(eval(*n.kids[k]));
        return Value::boolean(run_test(n, v, args) != n.negated);
      }
      default:
        fail(n.line, "internal: statement used as an expression");
    }
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
};

const std::string Renderer::kWhitespace = " \t\n\r\f\v";

}  // namespace

Template::Template(const std::string& source) {
  root_ = StatementParser(split_template(source)).parse_all();
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const ojson& context) const {
  Renderer r(context);
  std::string out;
  LoopControl lc;
  r.exec(*root_, out, lc);
  return out;
}

}  // namespace blend::jinja
