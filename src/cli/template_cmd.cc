// blend template — OpenAI-style messages (a JSON array), or a whole chat request body (an object
// with "messages" and, if any, "tools"), on stdin -> the rendered chat prompt on stdout. It renders
// through api/openai.h render_chat_prompt, the server's own path, so both give the same prompt
// for the same request (issue 56).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/json_limits.h"
#include "api/openai.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "text/chat_template.h"

namespace blend::cli {
namespace {

constexpr const char* kExpected =
    "expected a JSON array of messages (or a chat request with \"messages\")";

struct TemplateArgs {
  std::string model;
  bool no_generation_prompt = false;
};

void run_template(const TemplateArgs& a) {
  // Load first: a model without a usable template fails before waiting for stdin.
  const ChatTemplate tmpl = ChatTemplate::from_dir(a.model);
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  nlohmann::json body;
  try {
    if (json_nesting_depth(input) > kMaxClientJsonDepth) throw Error("messages nest too deep");
    body = nlohmann::json::parse(input);
  } catch (const std::exception& e) {
    throw Error(std::string(kExpected) + " on stdin: " + e.what());
  }
  if (body.is_array()) body = nlohmann::json{{"messages", std::move(body)}};
  if (!body.is_object() || !body.contains("messages"))
    throw Error(std::string(kExpected) + " on stdin");
  if (a.no_generation_prompt) body["add_generation_prompt"] = false;
  // An ApiError is a blend::Error: its message ("'messages[0].content' must be ...") is the
  // CLI's.
  const std::string text = render_chat_prompt(body, &tmpl, input).text;
  std::fwrite(text.data(), 1, text.size(), stdout);  // no newline: the prompt is exact
}

}  // namespace

void register_template_command(CLI::App& app) {
  auto args = std::make_shared<TemplateArgs>();
  CLI::App* cmd = app.add_subcommand("template", "Render the chat template for messages on stdin");
  cmd->add_option("--model", args->model, "Model folder or GGUF file (tokenizer_config.json)")
      ->transform(model_source_transform())
      ->required();
  cmd->add_flag("--no-generation-prompt", args->no_generation_prompt,
                "Do not ask the template for the assistant header");
  cmd->callback([args] { run_template(*args); });
}

}  // namespace blend::cli
