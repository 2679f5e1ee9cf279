// blend template — OpenAI-style messages (a JSON array) on stdin -> the rendered chat prompt on
// stdout, exactly as the model's chat template (and transformers) would render it.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/json_limits.h"
#include "cli/commands.h"
#include "core/error.h"
#include "text/chat_template.h"

namespace blend::cli {
namespace {

struct TemplateArgs {
  std::string model;
  bool no_generation_prompt = false;
};

void run_template(const TemplateArgs& a) {
  // Load first: a model without a usable template fails before waiting for stdin.
  const ChatTemplate tmpl = ChatTemplate::from_dir(a.model);
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  nlohmann::ordered_json messages;  // ordered: tools and arguments print in the order given
  try {
    if (json_nesting_depth(input) > kMaxClientJsonDepth) throw Error("messages nest too deep");
    messages = nlohmann::ordered_json::parse(input);
  } catch (const std::exception& e) {
    throw Error(std::string("expected a JSON array of messages on stdin: ") + e.what());
  }
  if (!messages.is_array()) throw Error("expected a JSON array of messages on stdin");
  const std::string text = tmpl.render(messages, !a.no_generation_prompt);
  std::fwrite(text.data(), 1, text.size(), stdout);  // no newline: the prompt is exact
}

}  // namespace

void register_template_command(CLI::App& app) {
  auto args = std::make_shared<TemplateArgs>();
  CLI::App* cmd = app.add_subcommand("template", "Render the chat template for messages on stdin");
  cmd->add_option("--model", args->model, "Model folder (tokenizer_config.json)")->required();
  cmd->add_flag("--no-generation-prompt", args->no_generation_prompt,
                "Do not ask the template for the assistant header");
  cmd->callback([args] { run_template(*args); });
}

}  // namespace blend::cli
