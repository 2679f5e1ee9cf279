// ChatTemplate — renders a model's chat template for an OpenAI-style message list exactly as
// Hugging Face transformers' apply_chat_template does (text/jinja.h is the engine and lists
// what it supports). The template sees the variables transformers passes: messages,
// add_generation_prompt, tools and documents (None unless given), bos_token and eos_token (and
// the tokenizer's other special tokens when loaded from a model folder), plus any extra
// variables, and the functions raise_exception and strftime_now.
//
// A template is parsed once, when the ChatTemplate is made: a construct the engine does not
// support is a blend::Error then, naming it and its line, never a differently rendered prompt.
// render() is const and thread-safe.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace blend {

class ChatTemplate {
 public:
  // `source` is the Jinja text; bos_token/eos_token become the template variables of those names.
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);

  // Loads a model folder's template as transformers does: DIR/chat_template.jinja when it exists
  // (it takes priority, as in transformers), else "chat_template" in DIR/tokenizer_config.json —
  // a string, or a list of {name, template} from which "default" is taken. Special tokens
  // (bos_token, eos_token, unk_token, pad_token, ...) come from tokenizer_config.json, as strings
  // or AddedToken objects ({"content": ...}); a token that is absent or null is undefined in the
  // template, as in transformers. No template: blend::Error.
  static ChatTemplate from_dir(const std::filesystem::path& dir);

  // `messages`: a JSON array of messages ({role, content, ...}; content may be a string or a
  // list of parts, passed through as is). `extra`: more template variables (tools, documents,
  // date_string, enable_thinking, ...). Objects keep their key order (ordered_json), which
  // matters to templates that print tools with tojson. raise_exception() in the template and
  // errors while rendering surface as blend::Error.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // The same for nlohmann::json input (whose objects are sorted by key).
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
  nlohmann::ordered_json special_tokens_;  // name -> text; absent names stay undefined
};

}  // namespace blend
