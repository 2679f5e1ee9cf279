// Internal to the Jinja engine. The syntax tree, and the parser that builds it from the token
// stream: one recursive-descent parser following Jinja2's grammar and so its precedence.
// Anything outside the supported subset is refused here, naming the construct and its line.
#pragma once

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace blend::jinja {

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
  int depth = 1;  // levels of nodes from this one down, at most kMaxTreeDepth
};

using NodeP = std::shared_ptr<Node>;

// The filters, tests, globals and methods the renderer implements; anything else is refused
// when the template is parsed.
extern const std::unordered_set<std::string> kFilters;
extern const std::unordered_set<std::string> kTests;
extern const std::unordered_set<std::string> kGlobals;
extern const std::unordered_set<std::string> kMethods;

// The template's tree; throws blend::Error naming the line of what it refuses.
NodeP parse(std::vector<Token> tokens);

}  // namespace blend::jinja
