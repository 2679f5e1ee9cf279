// The renderer: statements write to a string, expressions evaluate to Values (what it calls
// on values is in jinja_builtins.h). Where Jinja2's behaviour is surprising (scoping,
// precedence, generators), the comment says so; the parity tests hold the two engines to the
// same output.
#include "text/jinja.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>

#include "text/jinja_builtins.h"
#include "text/jinja_lexer.h"
#include "text/jinja_parser.h"

namespace blend::jinja {
namespace {

class Renderer {
 public:
  explicit Renderer(const Template::Variables& variables) {
    scopes_.emplace_back();
    int64_t values = 0, bytes = 0;
    for (const auto& [name, value] : variables) scopes_[0][name] = from_json(*value, values, bytes);
    // A long conversation may take proportionally more work than the fixed budget.
    budget_.add(kStepsPerInputValue * values + bytes / kInputBytesPerStep);
  }

  // `set ns.attr = v` is the only way a template changes an object, so every reference cycle
  // (a namespace holding itself, or a list or loop that holds it) runs through a namespace
  // assigned to here. Emptying those when the render ends breaks the cycles that shared
  // ownership would otherwise leak (bench/fuzz.sh's jinja harness: `set ns.a = (ns, 1)`).
  ~Renderer() {
    for (const std::weak_ptr<Dict>& assigned : assigned_namespaces_)
      if (const std::shared_ptr<Dict> d = assigned.lock()) d->items.clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  void render(const Node& root, std::string& out) { exec(root, out); }

 private:
  enum class Flow { kNext, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;
  static constexpr int kMaxMacroDepth = 200;

  // Every statement and expression evaluated is a step of the budget and a level of recursion.
  class Enter {
   public:
    Enter(Renderer& r, int line) : nesting_(r.nesting_) {
      if (++nesting_ > kMaxRenderDepth)
        fail(line, "the template recurses too deeply while rendering (more than " +
                       std::to_string(kMaxRenderDepth) + " levels)");
      r.budget_.line = line;
      charge(1);
    }
    ~Enter() { --nesting_; }
    Enter(const Enter&) = delete;
    Enter& operator=(const Enter&) = delete;

   private:
    int& nesting_;
  };

  static void check_output(const std::string& out, int line) {
    if (out.size() > kMaxSize)
      fail(line, "the output would be too large (over " + std::to_string(kMaxSize >> 20) + " MiB)");
  }

  // --- statements

  Flow exec(const Node& n, std::string& out) {
    const Enter enter(*this, n.line);
    switch (n.kind) {
      case Node::kBody:
        for (const auto& k : n.kids) {
          const Flow f = exec(*k, out);
          if (f != Flow::kNext) return f;
        }
        return Flow::kNext;
      case Node::kText:
        out += n.value.s;
        check_output(out, n.line);
        return Flow::kNext;
      case Node::kOutput: {
        const Value v = eval(*n.kids[0]);
        out += v.kind == Value::kString ? v.s : py_str(v);
        charge_bytes(v.s.size());
        check_output(out, n.line);
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
      assigned_namespaces_.insert(target.dict);
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

  // --- expressions

  Value eval(const Node& n) {
    const Enter enter(*this, n.line);
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
    // A string is sliced by code points (not made a list of one-character strings first).
    const Cps chars = obj.kind == Value::kString ? to_cps(obj.s) : Cps();
    charge_bytes(obj.s.size());
    const auto size =
        static_cast<int64_t>(obj.kind == Value::kList ? obj.list->size() : chars.size());
    auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {  // PySlice_AdjustIndices
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + size : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, size);
      return std::clamp<int64_t>(x, -1, size - 1);
    };
    const int64_t b = adjust(start, step > 0 ? 0 : size - 1);
    const int64_t e = adjust(stop, step > 0 ? size : -1);
    if (obj.kind == Value::kList) {
      List picked;
      for (int64_t k = b; step > 0 ? k < e : k > e; k += step)
        picked.push_back((*obj.list)[static_cast<size_t>(k)]);
      charge(static_cast<int64_t>(picked.size()));
      return Value::of_list(std::move(picked), obj.tuple);
    }
    std::string s;
    for (int64_t k = b; step > 0 ? k < e : k > e; k += step)
      put_cp(s, chars[static_cast<size_t>(k)]);
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
    // A list's items are copied (their text too), so a list is bounded by the memory it takes.
    const size_t unit = seq.kind == Value::kString ? seq.s.size() : list_bytes(*seq.list);
    const size_t limit = seq.kind == Value::kString ? kMaxSize : kMaxListBytes;
    if (times > 0 && unit > 0 && static_cast<uint64_t>(times) > limit / unit)
      fail(line, "the repeated sequence would be too large");
    if (times > 0) charge_bytes(unit * static_cast<size_t>(times));
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
      if (list_bytes(*l.list) + list_bytes(*r.list) > kMaxListBytes)
        fail(n.line, "the list would be too large");
      charge(static_cast<int64_t>(l.list->size() + r.list->size()));
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

  std::vector<Scope> scopes_;  // [0]: the context and top-level sets; then loops and macros
  size_t frame_ = 0;           // the innermost macro call's scope (0: none)
  int depth_ = 0;              // macro call depth
  int nesting_ = 0;            // statements and expressions being evaluated, one in another
  Budget budget_{kMaxSteps};   // this render's steps, charged by it and by the builtins
  // Each namespace assigned to, once (by owner: a later namespace at a freed one's address is
  // another key).
  std::set<std::weak_ptr<Dict>, std::owner_less<std::weak_ptr<Dict>>> assigned_namespaces_;
};

}  // namespace

Template::Template(const std::string& source) {
  root_ = parse(lex(source));
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
