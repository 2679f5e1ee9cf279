// The grammar of "the output is tool calls": what tool_choice "required" or a named function
// asks for (api/tools.cc), written in the model's own call format (text/tool_calls.h) so that
// the model is only kept on a path it was trained to take, and so the parser reads every output
// back as calls. The arguments are JSON valid against the function's parameters schema (the
// same compiler as response_format, grammar/json_schema.h, embedded between literal text):
//  * kHermes:     <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>, and with
//                 `parallel` more of them, each after a "\n" (the way Qwen2.5 writes several);
//  * kLlama3Json: {"name": "NAME", "parameters": ARGS}, one call whatever `parallel` says:
//                 Llama 3.x templates render one call per assistant turn and refuse more.
// The spacing is the one the templates render past calls with, so a constrained call looks the
// same as an unconstrained one in the next turn's prompt.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "text/tool_calls.h"

namespace blend {

struct ToolGrammarFunction {
  std::string name;       // written as a JSON string; callers keep it to [A-Za-z0-9_-]
  nlohmann::json schema;  // the parameters schema; null = any JSON object
  std::string path;       // names the schema in errors ("tools[2].function.parameters")
};

// Throws blend::Error naming the path of a schema the JSON schema compiler refuses or that no
// finite JSON value satisfies, when `functions` is empty, or past `budget` (Grammar::compile).
std::shared_ptr<Grammar> tool_call_grammar(ToolCallFormat format,
                                           const std::vector<ToolGrammarFunction>& functions,
                                           bool parallel, const GrammarBudget& budget = {});

// A cache key (GrammarCompiler::grammar) for the same arguments.
std::string tool_call_grammar_key(ToolCallFormat format,
                                  const std::vector<ToolGrammarFunction>& functions, bool parallel);

}  // namespace blend
