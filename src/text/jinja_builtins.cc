#include "text/jinja_builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <unordered_set>

#include "text/jinja_parser.h"

namespace blend::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // the sandbox's MAX_RANGE

// An attribute that is a Python method, read without calling it (`{% if s.strip %}`): the
// sandbox gives the bound method (truthy, callable; printing it is refused), or undefined for
// a method that would modify the object, and never a dict key of the same name. Returns a
// plain Value (kind undefined, empty text) when `name` is no such method.
Value method_attribute(const Value& obj, const std::string& name) {
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
  const Value unsafe = Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) +
                                        "' object is unsafe");
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

Value split(int line, const std::string& s, const Bound& a, bool from_right) {
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

bool affix_matches(const std::string& s, const Value& affix, bool prefix, int line) {
  if (affix.kind == Value::kList && affix.tuple) {
    for (const auto& a : *affix.list)
      if (affix_matches(s, a, prefix, line)) return true;
    return false;
  }
  const std::string& x = to_text(affix, line, prefix ? "startswith() prefix" : "endswith() suffix");
  if (x.size() > s.size()) return false;
  return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
}

}  // namespace

void check_size(const std::string& s, int line, const char* what) {
  if (s.size() > kMaxSize)
    fail(line, std::string(what) + ": the string would be too large (over " +
                   std::to_string(kMaxSize >> 20) + " MiB)");
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, int line) {
  charge_bytes(s.size());
  std::string out;
  int64_t done = 0;
  auto more = [&] { return count < 0 || done < count; };
  if (from.empty()) {  // Python inserts `to` around every character
    for (size_t k = 0; k < s.size();) {
      if (more()) {
        out += to;
        ++done;
        check_size(out, line, "replace");
      }
      put_cp(out, next_cp(s, k));
    }
    if (more()) out += to;
    check_size(out, line, "replace");
    return out;
  }
  size_t k = 0;
  for (size_t at; more() && (at = s.find(from, k)) != std::string::npos; k = at + from.size()) {
    out.append(s, k, at - k);
    out += to;
    ++done;
    check_size(out, line, "replace");
  }
  out.append(s, k, std::string::npos);
  check_size(out, line, "replace");
  return out;
}

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

std::string spaces(const Value& width, int line, const std::string& what) {
  const int64_t n = to_index(width, line, what);
  if (n > kMaxIndent) fail(line, what + " " + std::to_string(n) + " is too large");
  return std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
}

Value joined(std::string a, const std::string& b, int line) {
  if (a.size() + b.size() > kMaxSize) fail(line, "the string would be too large");
  charge_bytes(a.size() + b.size());
  return Value::string(a += b);
}

List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::kList:
      consume(v, line);
      charge(static_cast<int64_t>(v.list->size()));
      return *v.list;
    case Value::kDict: {
      if (v.dict->type == Dict::kNamespace) break;
      charge(static_cast<int64_t>(v.dict->items.size()));
      List keys;
      for (const auto& item : v.dict->items) keys.push_back(Value::string(item.first));
      return keys;
    }
    case Value::kString: {
      // One Value per character: bounded as a list the template builds.
      if (cp_count(v.s) > kMaxListBytes / (sizeof(Value) + 4))
        fail(line, "the string is too long to iterate over");
      charge_bytes(v.s.size() * 8);
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

Value getattr(const Value& obj, const std::string& name, int line) {
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

Value getitem(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) fail(line, obj.s);
  if (obj.kind == Value::kDict && key.kind == Value::kString) {  // the key, then attributes
    if (obj.dict->type == Dict::kPlain)
      if (const Value* v = obj.dict->find(key.s)) return *v;
    return getattr(obj, key.s, line);
  }
  const bool indexable = obj.kind == Value::kString ||
                         (obj.kind == Value::kList && (obj.s.empty() || type_name(obj) == "range"));
  if (indexable && key.is_integral() && obj.kind == Value::kList) {
    const auto size = static_cast<int64_t>(obj.list->size());
    int64_t k = key.integral();
    if (k < 0) k += size;
    if (k >= 0 && k < size) return (*obj.list)[static_cast<size_t>(k)];
  }
  if (indexable && key.is_integral() && obj.kind == Value::kString) {  // a code point
    charge_bytes(obj.s.size());
    const Cps chars = to_cps(obj.s);
    const auto size = static_cast<int64_t>(chars.size());
    int64_t k = key.integral();
    if (k < 0) k += size;
    if (k >= 0 && k < size) {
      std::string c;
      put_cp(c, chars[static_cast<size_t>(k)]);
      return Value::string(std::move(c));
    }
  }
  return Value::undefined(type_name(obj) + " object has no element " + py_repr(key));
}

Value arith(const std::string& op, const Value& a, const Value& b, int line) {
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

bool contains(const Value& container, const Value& item, int line) {
  switch (container.kind) {
    case Value::kString:
      if (item.kind != Value::kString)
        fail(line, "'in <string>' requires string as left operand, not " + type_name(item));
      charge_bytes(container.s.size());
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

bool compare(const std::string& op, const Value& l, const Value& r, int line) {
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

Value call_global(int line, const std::string& name, Args& args, Kwargs& kwargs) {
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
    // The count and the items in unsigned 64-bit arithmetic: `stop - start` always fits there,
    // and stepping a signed counter past `stop` could wrap around and never end.
    const bool up = step > 0;
    const uint64_t span = up ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start)
                             : static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
    const uint64_t stride = up ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
    const uint64_t count = (up ? start < stop : start > stop) ? (span - 1) / stride + 1 : 0;
    if (count > static_cast<uint64_t>(kMaxRange))
      fail(line, "range too big (the sandbox allows " + std::to_string(kMaxRange) + " items)");
    charge(static_cast<int64_t>(count));
    List items;
    for (uint64_t k = 0; k < count; ++k)  // modulo 2^64, exact since each item fits in 64 bits
      items.push_back(Value::integer(
          static_cast<int64_t>(static_cast<uint64_t>(start) + k * static_cast<uint64_t>(step))));
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

Value method(int line, const Value& obj, const std::string& name, Args& args, Kwargs& kwargs) {
  if (obj.is_undefined()) fail(line, obj.s);
  const std::string what = "." + name;
  if (obj.kind == Value::kString) {
    const std::string& s = obj.s;
    charge_bytes(s.size());  // every str method reads the string
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
                                   given(a[2]) ? to_index(*a[2], line, "count") : -1, line));
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
      for (size_t k = 0; k < items.size(); ++k) {
        out += (k ? s : "") + to_text(items[k], line, "sequence item " + std::to_string(k));
        check_size(out, line, ".join()");
      }
      charge_bytes(out.size());
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

}  // namespace blend::jinja
