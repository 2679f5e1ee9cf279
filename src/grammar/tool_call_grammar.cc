#include "grammar/tool_call_grammar.h"

#include "core/error.h"
#include "grammar/json_schema.h"

namespace blend {

using nlohmann::json;

std::shared_ptr<Grammar> tool_call_grammar(ToolCallFormat format,
                                           const std::vector<ToolGrammarFunction>& functions,
                                           bool parallel, const GrammarBudget& budget) {
  if (functions.empty()) throw Error("tool call grammar: no functions");
  const bool hermes = format == ToolCallFormat::kHermes;
  const std::string args_key = hermes ? "arguments" : "parameters";
  auto g = std::make_shared<Grammar>();
  std::vector<GExpr> calls;
  std::vector<int32_t> args_rules;
  for (const ToolGrammarFunction& f : functions) {
    // Both formats need the arguments to be an object; a function without parameters takes
    // any object (OpenAI: parameters may be omitted; the model usually writes {}).
    const json schema = f.schema.is_null() ? json{{"type", "object"}} : f.schema;
    const int32_t args = g->add_rule(f.path);
    args_rules.push_back(args);
    g->define(args, json_schema_expr(*g, schema, f.path));
    GExpr call = g_seq({g_lit("{\"name\": " + json(f.name).dump() + ", \"" + args_key + "\": "),
                        g_rule(args), g_lit("}")});
    if (hermes) call = g_seq({g_lit("<tool_call>\n"), call, g_lit("\n</tool_call>")});
    calls.push_back(std::move(call));
  }
  const int32_t call = g->add_rule("call");
  g->define(call, g_alt(std::move(calls)));
  GExpr body = g_rule(call);
  if (parallel && hermes) body = g_seq({body, g_star(g_seq({g_lit("\n"), g_rule(call)}))});
  const int32_t root = g->add_rule("tool calls");
  g->define(root, body);
  g->compile(root, budget);
  // A function whose arguments cannot be written would be silently never called.
  for (size_t i = 0; i < functions.size(); ++i)
    if (!g->rule_productive(args_rules[i]))
      throw Error(functions[i].path +
                  ": the schema matches no finite JSON value (it recurses without end)");
  return g;
}

std::string tool_call_grammar_key(ToolCallFormat format,
                                  const std::vector<ToolGrammarFunction>& functions,
                                  bool parallel) {
  json key = json::array();
  for (const ToolGrammarFunction& f : functions) key.push_back({f.name, f.schema});
  return std::string("tools:") + tool_call_format_name(format) +
         (parallel ? ":parallel:" : ":one:") + key.dump();
}

}  // namespace blend
