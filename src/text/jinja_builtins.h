// Internal to the Jinja engine: what the renderer calls on values. Attribute and item access,
// arithmetic and comparison with Python's rules, the global functions (range, namespace, ...),
// str and dict methods (jinja_builtins.cc), filters and tests (jinja_filters.cc).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace blend::jinja {

using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Bound = std::vector<std::optional<Value>>;

// Binds call arguments to parameter names as Python does: positional ones first, then keywords.
Bound bind(int line, const std::string& what, std::initializer_list<const char*> params, Args& args,
           Kwargs& kwargs);
bool given(const std::optional<Value>& v);  // passed and not None
int64_t to_index(const Value& v, int line, const std::string& what);
const std::string& to_text(const Value& v, int line, const std::string& what);

// The widest indentation (indent, tojson); kMaxSize bounds what it is applied to.
constexpr int64_t kMaxIndent = 1 << 12;
std::string spaces(const Value& width, int line, const std::string& what);
Value joined(std::string a, const std::string& b, int line);  // a + b, within kMaxSize

// What `for` iterates: a list's items, a dict's keys, a string's characters.
List iterate(const Value& v, int line);
Value getattr(const Value& obj, const std::string& name, int line);
Value getitem(const Value& obj, const Value& key, int line);
Value arith(const std::string& op, const Value& a, const Value& b, int line);
bool contains(const Value& container, const Value& item, int line);
bool compare(const std::string& op, const Value& l, const Value& r, int line);
// str.replace(old, new, count); count < 0: all.
std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, int line);
// A blend::Error naming `what` when s is over kMaxSize.
void check_size(const std::string& s, int line, const char* what);
Value call_global(int line, const std::string& name, Args& args, Kwargs& kwargs);
Value method(int line, const Value& obj, const std::string& name, Args& args, Kwargs& kwargs);
Value filter(int line, const std::string& name, Value v, Args& args, Kwargs& kwargs);
bool test(int line, const std::string& name, const Value& v, Args& args);

}  // namespace blend::jinja
