#include "text/jinja_parser.h"

#include <algorithm>
#include <array>
#include <initializer_list>

namespace blend::jinja {

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

namespace {

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
        body->kids.push_back(seal(out));
      } else if (t.kind == Token::kBlockBegin) {
        next();
        for (const char* e : ends)
          if (at_name(e)) return seal(body);
        body->kids.push_back(seal(parse_statement()));
      } else if (t.kind == Token::kEof) {
        if (ends.size() == 0) return seal(body);
        std::string want;
        for (const char* e : ends) want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
        fail(open_line, std::string("'{% ") + opener + " %}' is never closed (expected " + want +
                            " before the end of the template)");
      } else {
        unexpected("template text or a tag");
      }
    }
  }

  // Sets n's depth from its children's (complete by now). Deeper than kMaxTreeDepth is an error
  // here, before the tree grows further: a chain parsed in a loop (`a + b + ...`, `x|f|g...`,
  // `x.a.b...`) is as deep as it is long, and the renderer and the tree's destructor recurse
  // down it.
  static NodeP seal(NodeP n) {
    int d = 0;
    auto see = [&d](const NodeP& k) {
      if (k) d = std::max(d, k->depth);
    };
    for (const auto& k : n->kids) see(k);
    for (const auto& kw : n->kwargs) see(kw.second);
    for (const auto& [c, b] : n->branches) {
      see(c);
      see(b);
    }
    see(n->iter);
    see(n->cond);
    see(n->body);
    see(n->else_body);
    n->depth = d + 1;
    if (n->depth > kMaxTreeDepth)
      fail(n->line, "the template nests too deeply (more than " + std::to_string(kMaxTreeDepth) +
                        " levels of expressions and blocks)");
    return n;
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
    return seal(t);
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
      e = seal(c);
    }
    return e;
  }

  NodeP binary(const std::string& op, NodeP l, NodeP r, int line) {
    NodeP n = make_node(Node::kBinary, line);
    n->name = op;
    n->kids = {std::move(l), std::move(r)};
    return seal(n);
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
      return seal(n);
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
    return n ? seal(n) : first;
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
      n = seal(n);
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
      return seal(n);
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
      return seal(n);
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
          n = seal(g);
        } else if (cur().kind == Token::kInt) {  // x.0 is x[0]
          NodeP g = make_node(Node::kGetitem, line);
          NodeP key = make_node(Node::kLiteral, line);
          key->value = Value::integer(cur().i);
          next();
          g->kids = {n, key};
          n = seal(g);
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
    return seal(n);
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
    return seal(n);
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
    return seal(n);
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
    return seal(n);
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
  std::vector<std::pair<std::string, int>> calls_;
  std::unordered_set<std::string> macros_;
};

}  // namespace

NodeP parse(std::vector<Token> tokens) {
  return Parser(std::move(tokens)).parse_template();
}

}  // namespace blend::jinja
