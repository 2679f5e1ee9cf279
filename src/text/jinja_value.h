// Internal to the Jinja engine (text/jinja.h is its API): Python's object model as a template
// sees it, and the Python rules for text (code points, case mapping, strip, str(), repr(),
// json.dumps, ==, <) that the lexer, parser and renderer share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/jinja.h"

namespace blend::jinja {

using ojson = nlohmann::ordered_json;

// Throws blend::Error "template line N: what".
[[noreturn]] void fail(int line, const std::string& what);

struct Node;

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
Value generator(List items);
// Marks a generator used; throws if it was already.
void consume(const Value& v, int line);
Value of_dict(Dict d);

// How deeply values may nest (template input, and values printed or serialised): deeper is an
// error rather than a stack overflow.
constexpr int kMaxNesting = 512;

// The largest string a template may build or print (and the largest output), and the most
// memory one list it builds may take (items counted at sizeof(Value) plus their text): beyond
// them a runaway template is an error instead of exhausting memory. text/jinja.h lists them.
constexpr size_t kMaxSize = size_t{64} << 20;
constexpr size_t kMaxListBytes = size_t{256} << 20;

// What one render may spend. The renderer charges a step for every statement and expression it
// evaluates and every loop iteration; the builtins charge for the items and bytes they go
// through (1 step per item, per 64 bytes), so a filter on a big value inside a long loop counts
// what it costs. The budget of the render running on this thread is reached through a
// thread-local pointer rather than a parameter of every builtin: a render runs on one thread
// from start to end.
class Budget {
 public:
  explicit Budget(int64_t steps);
  void add(int64_t steps) {
    left_ += steps;
    total_ += steps;
  }
  ~Budget();
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;
  int line = 0;  // the template line being rendered, for the error message

 private:
  friend void charge(int64_t steps);
  int64_t left_;
  int64_t total_;
  Budget* saved_;
};
// Charges this thread's render `steps`; a blend::Error naming the step budget when it is spent.
// Outside a render it does nothing.
void charge(int64_t steps);
inline void charge_bytes(size_t bytes) {
  charge(static_cast<int64_t>(bytes / 64) + 1);
}
// The memory a list's items take, as kMaxListBytes counts it.
size_t list_bytes(const List& items);

// Adds to `values` and `bytes` the JSON values and string bytes it converts.
Value from_json(const ojson& j, int64_t& values, int64_t& bytes, int depth = 0);
bool truthy(const Value& v);
std::string type_name(const Value& v);

// ---------------------------------------------------------------------------------------------
// Text as Python sees it: a sequence of code points. Invalid UTF-8 bytes decode to
// kRawByte + byte and encode back unchanged, so no byte is ever lost.

constexpr uint32_t kRawByte = 0x110000;
using Cps = std::vector<uint32_t>;

uint32_t next_cp(std::string_view s, size_t& k);  // decodes one code point and advances k
void put_cp(std::string& out, uint32_t cp);
Cps to_cps(std::string_view s);
std::string from_cps(const Cps& cps, size_t b, size_t e);
size_t cp_count(std::string_view s);
// str.isspace(), which is also what str.strip()/split() and the regex \s use.
bool py_isspace(uint32_t c);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_capitalize(const std::string& s);  // str.capitalize()
std::string py_title(const std::string& s);       // str.title()
// Jinja2's `title` filter (not str.title()): words start after runs of whitespace, '-', '(',
// '{', '[' or '<'; each word's first letter is upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s);
bool py_islower(const std::string& s);
bool py_isupper(const std::string& s);
// str.strip(chars) / lstrip / rstrip; chars == nullptr strips whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
// str.splitlines(): the line boundaries Python knows, \r\n counting as one.
std::vector<std::string> py_splitlines(const std::string& s);

// ---------------------------------------------------------------------------------------------
// str(), repr() and json.dumps() of values, byte for byte as Python writes them.

// repr(float): the shortest text that reads back as the same double; exponent form outside
// [1e-4, 1e16).
std::string float_repr(double d);
std::string str_repr(const std::string& s);
std::string py_repr(const Value& v, int depth = 0);
std::string py_str(const Value& v);  // str(v); what {{ v }} prints

// How transformers' tojson filter calls json.dumps: ensure_ascii, indent, separators, sort_keys.
struct JsonStyle {
  bool ensure_ascii = false;
  bool pretty = false;
  std::string indent;           // one level, when pretty
  std::string item_sep = ", ";  // json.dumps uses "," when indenting
  std::string key_sep = ": ";
  bool sort_keys = false;
};

void to_json(const Value& v, const JsonStyle& st, int level, int line, std::string& out);
// Python ==.
bool py_eq(const Value& a, const Value& b, int depth = 0);
// Python <, as -1/0/1; throws where Python raises TypeError.
int py_cmp(const Value& a, const Value& b, int line, int depth = 0);

}  // namespace blend::jinja
