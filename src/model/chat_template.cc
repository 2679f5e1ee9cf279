#include "model/chat_template.h"

#include <fstream>

#include "core/error.h"

namespace blend {
namespace {

std::string token_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token)
    : template_(source), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {}

ChatTemplate ChatTemplate::from_dir(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer_config.json";
  std::ifstream in(path);
  if (!in) throw Error("cannot open " + path.string());
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
  std::string source;
  if (auto it = config.find("chat_template"); it != config.end()) {
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      for (const auto& t : *it)
        if (t.value("name", "") == "default") source = t.value("template", "");
    }
  }
  if (source.empty()) throw Error(path.string() + ": no chat_template");
  try {
    return ChatTemplate(source, config.contains("bos_token") ? token_text(config["bos_token"]) : "",
                        config.contains("eos_token") ? token_text(config["eos_token"]) : "");
  } catch (const Error& e) {
    throw Error(path.string() + ": " + e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  for (const auto& [k, v] : extra.items()) context[k] = v;
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_token_;
  context["eos_token"] = eos_token_;
  return template_.render(context);
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt) const {
  return render(nlohmann::ordered_json::parse(messages.dump()), add_generation_prompt);
}

}  // namespace blend
