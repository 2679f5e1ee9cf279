// Python values: truthiness, type names, str()/repr()/json.dumps() byte for byte as Python
// writes them, == and <.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "text/jinja_value.h"

namespace blend::jinja {

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error("template line " + std::to_string(line) + ": " + what);
}

namespace {
thread_local Budget* current_budget = nullptr;
}  // namespace

Budget::Budget(int64_t steps) : left_(steps), total_(steps), saved_(current_budget) {
  current_budget = this;
}
Budget::~Budget() {
  current_budget = saved_;
}

void charge(int64_t steps) {
  Budget* b = current_budget;
  if (!b) return;
  b->left_ -= steps;
  if (b->left_ < 0)
    fail(b->line, "the template ran out of its step budget (" + std::to_string(b->total_) +
                      " steps: an endless or exponential loop?)");
}

size_t list_bytes(const List& items) {
  size_t bytes = 0;
  for (const Value& v : items) bytes += sizeof(Value) + v.s.size();
  return bytes;
}

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

Value from_json(const ojson& j, int64_t& values, int64_t& bytes, int depth) {
  if (depth > kMaxNesting) throw Error("template input is nested too deeply");
  ++values;
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
      bytes += static_cast<int64_t>(j.get_ref<const std::string&>().size());
      return Value::string(j.get<std::string>());
    case ojson::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, values, bytes, depth + 1));
      return Value::of_list(std::move(items));
    }
    case ojson::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, v] : j.items())
        d.items.emplace_back(k, from_json(v, values, bytes, depth + 1));
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

namespace {

void repr_into(const Value& v, int depth, std::string& out);

void repr_list(const Value& v, int depth, std::string& out) {
  if (v.s == kGenerator)
    throw Error(
        "printing a generator (what map, select, items, ... return) is not "
        "supported; add '| list'");
  if (v.s.rfind("range(", 0) == 0) {
    out += v.s;
    return;
  }
  if (!v.s.empty()) out += v.s + "(";  // dict_items([...])
  out += v.tuple ? "(" : "[";
  for (size_t k = 0; k < v.list->size(); ++k) {
    if (k) out += ", ";
    repr_into((*v.list)[k], depth + 1, out);
  }
  if (v.tuple && v.list->size() == 1) out += ",";
  out += v.tuple ? ")" : "]";
  if (!v.s.empty()) out += ")";
}

void repr_dict(const Value& v, int depth, std::string& out) {
  if (v.dict->type == Dict::kLoop) {
    out += "<LoopContext ";
    repr_into(*v.dict->find("index"), depth + 1, out);
    out += "/";
    repr_into(*v.dict->find("length"), depth + 1, out);
    out += ">";
    return;
  }
  if (v.dict->type == Dict::kNamespace) out += "<Namespace ";
  out += "{";
  bool first = true;
  for (const auto& [key, val] : v.dict->items) {
    out += (first ? "" : ", ") + str_repr(key) + ": ";
    repr_into(val, depth + 1, out);
    first = false;
  }
  out += "}";
  if (v.dict->type == Dict::kNamespace) out += ">";
}

// Appends repr(v): one string grows (a value that shares its parts prints in time linear in
// the text, not in the text times the depth) and stops at kMaxSize.
void repr_into(const Value& v, int depth, std::string& out) {
  if (depth > kMaxNesting) throw Error("a value to print is nested too deeply");
  if (out.size() > kMaxSize)
    throw Error("a value to print is too large (over " + std::to_string(kMaxSize >> 20) + " MiB)");
  charge(1);
  switch (v.kind) {
    case Value::kUndefined:
      out += "Undefined";
      return;
    case Value::kNone:
      out += "None";
      return;
    case Value::kBool:
      out += v.b ? "True" : "False";
      return;
    case Value::kInt:
      out += std::to_string(v.i);
      return;
    case Value::kFloat:
      out += float_repr(v.f);
      return;
    case Value::kString:
      charge_bytes(v.s.size());
      out += str_repr(v.s);
      return;
    case Value::kList:
      repr_list(v, depth, out);
      return;
    case Value::kDict:
      repr_dict(v, depth, out);
      return;
    case Value::kFunction:
      if (v.macro) {
        out += "<Macro '" + v.s + "'>";
        return;
      }
      // Python prints a function or a bound method with its address: there is no stable text.
      throw Error("printing the function '" + v.s + "' is not supported");
  }
}

}  // namespace

std::string py_repr(const Value& v, int depth) {
  std::string out;
  repr_into(v, depth, out);
  if (out.size() > kMaxSize)
    throw Error("a value to print is too large (over " + std::to_string(kMaxSize >> 20) + " MiB)");
  return out;
}

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
  if (out.size() > kMaxSize)
    fail(line,
         "tojson: the text would be too large (over " + std::to_string(kMaxSize >> 20) + " MiB)");
  charge(1);
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
      charge_bytes(v.s.size());
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
bool py_eq(const Value& a, const Value& b, int depth) {
  if (depth > kMaxNesting) throw Error("values to compare are nested too deeply");
  charge(1);
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
      charge_bytes(a.s.size());
      return a.s == b.s;
    case Value::kList:
      // A list is equal to itself without looking inside, as Python's == (identity first)
      // finds; it also keeps comparing a value built of shared parts linear.
      if (a.list == b.list) return true;
      if (a.s == kGenerator || b.s == kGenerator) return false;
      if (a.tuple != b.tuple || a.s != b.s || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!py_eq((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    case Value::kDict:
      if (a.dict == b.dict) return true;
      if (a.dict->type != Dict::kPlain || b.dict->type != Dict::kPlain) return false;
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
int py_cmp(const Value& a, const Value& b, int line, int depth) {
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

}  // namespace blend::jinja
