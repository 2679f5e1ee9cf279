// Filters and tests, as Jinja2's builtins behave.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "text/jinja_builtins.h"
#include "text/jinja_parser.h"

namespace blend::jinja {

namespace {

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

// An item's attribute for map/selectattr/join/unique: "a.b.0" follows a path.
Value attribute(const Value& item, const std::string& path, int line) {
  Value v = item;
  size_t k = 0;
  for (;;) {
    const size_t dot = path.find('.', k);
    const std::string part = path.substr(k, dot == std::string::npos ? std::string::npos : dot - k);
    const bool index = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    v = getitem(v, index ? Value::integer(std::stoll(part)) : Value::string(part), line);
    if (dot == std::string::npos) return v;
    k = dot + 1;
  }
}

int64_t length(const Value& v, int line) {
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

std::string indent(const std::string& s, const Value& width, bool first, bool blank, int line) {
  const std::string pad =
      width.kind == Value::kString ? width.s : spaces(width, line, "indent width");
  // Refused before splitting when the line feeds alone would make it too large.
  const auto feeds = static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
  if (!pad.empty() && feeds > (kMaxSize - std::min(kMaxSize, s.size())) / pad.size())
    fail(line,
         "indent: the string would be too large (over " + std::to_string(kMaxSize >> 20) + " MiB)");
  std::vector<std::string> lines = py_splitlines(s + "\n");
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += "\n";
    if (k && (blank || !lines[k].empty())) out += pad;
    out += lines[k];
    check_size(out, line, "indent");
  }
  charge_bytes(out.size());
  return first ? pad + out : out;
}

JsonStyle json_style(int line, Bound& a) {
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

// default, trim, upper/lower/capitalize/title/string, safe, length/count, tojson, replace, indent.
Value text_filter(int line, const std::string& name, Value v, Args& args, Kwargs& kwargs) {
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
  if (name == "tojson") {
    Bound a = bind(line, name, {"ensure_ascii", "indent", "separators", "sort_keys"}, args, kwargs);
    std::string out;
    to_json(v, json_style(line, a), 0, line, out);
    return Value::string(std::move(out));
  }
  if (name == "replace") {
    const Bound a = bind(line, name, {"old", "new", "count"}, args, kwargs);
    if (!a[0] || !a[1]) fail(line, "replace needs two arguments");
    return Value::string(replace(py_str(v), py_str(*a[0]), py_str(*a[1]),
                                 given(a[2]) ? to_index(*a[2], line, "count") : -1, line));
  }
  if (name == "indent") {
    const Bound a = bind(line, name, {"width", "first", "blank"}, args, kwargs);
    return Value::string(indent(py_str(v), a[0] ? *a[0] : Value::integer(4), a[1] && truthy(*a[1]),
                                a[2] && truthy(*a[2]), line));
  }
  fail(line, "unsupported filter '" + name + "'");
}

// int, float, abs, round.
Value number_filter(int line, const std::string& name, Value v, Args& args, Kwargs& kwargs) {
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
  fail(line, "unsupported filter '" + name + "'");
}

// first, last, list, reverse, join, items, unique, map, select/reject(attr): what takes or gives
// a sequence.
Value sequence_filter(int line, const std::string& name, Value v, Args& args, Kwargs& kwargs) {
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
    for (size_t k = 0; k < items.size(); ++k) {
      out += (k ? sep : "") +
             py_str(given(a[1]) ? attribute(items[k], py_str(*a[1]), line) : items[k]);
      check_size(out, line, "join");
    }
    charge_bytes(out.size());
    return Value::string(std::move(out));
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

}  // namespace

Value filter(int line, const std::string& name, Value v, Args& args, Kwargs& kwargs) {
  if (!kFilters.count(name)) fail(line, "unsupported filter '" + name + "'");
  charge_bytes(v.s.size());  // what the filters on strings read
  static const std::unordered_set<std::string> kNumber = {"int", "float", "abs", "round"};
  static const std::unordered_set<std::string> kSequence = {
      "first",  "last", "list",   "reverse", "join",       "items",
      "unique", "map",  "select", "reject",  "selectattr", "rejectattr"};
  if (kNumber.count(name)) return number_filter(line, name, std::move(v), args, kwargs);
  if (kSequence.count(name)) return sequence_filter(line, name, std::move(v), args, kwargs);
  return text_filter(line, name, std::move(v), args, kwargs);
}

bool test(int line, const std::string& name, const Value& v, Args& args) {
  static const std::unordered_set<std::string> kNoArgument = {
      "defined",  "undefined", "none",   "boolean", "true",    "false",
      "integer",  "float",     "number", "string",  "mapping", "callable",
      "iterable", "sequence",  "lower",  "upper",   "odd",     "even"};
  if (kNoArgument.count(name) && !args.empty()) fail(line, "test '" + name + "' takes no argument");
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

}  // namespace blend::jinja
