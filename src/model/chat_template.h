// ChatTemplate — renders a model's chat template (tokenizer_config.json "chat_template") for an
// OpenAI-style message list, as Hugging Face transformers' apply_chat_template does:
// variables messages, add_generation_prompt, bos_token, eos_token, plus raise_exception and
// strftime_now; trim_blocks and lstrip_blocks on (see model/jinja.h for the supported subset).
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "model/jinja.h"

namespace blend {

class ChatTemplate {
 public:
  // Parses once: an unsupported construct is a blend::Error here, not at render time.
  ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token);
  // Reads DIR/tokenizer_config.json: chat_template (a string, or a list of {name, template}
  // from which "default" is taken) and bos_token/eos_token (strings or AddedToken objects).
  static ChatTemplate from_dir(const std::filesystem::path& dir);

  // Thread-safe. A template's raise_exception() surfaces as blend::Error with its message.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  std::string render(const nlohmann::json& messages, bool add_generation_prompt) const;

 private:
  jinja::Template template_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace blend
