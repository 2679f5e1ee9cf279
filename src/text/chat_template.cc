#include "text/chat_template.h"

#include "core/error.h"
#include "core/regular_file.h"

namespace blend {
namespace {

using ojson = nlohmann::ordered_json;

// The special tokens transformers puts in special_tokens_map, which apply_chat_template passes
// to the template.
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

std::optional<std::string> token_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object()) {
    auto it = j.find("content");
    if (it != j.end() && it->is_string()) return it->get<std::string>();
  }
  return std::nullopt;
}

// tokenizer_config.json may carry several long templates; a template file is a few KB.
std::string read_text(const std::filesystem::path& path) {
  return read_regular_file(path, 64u << 20);
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)), template_(source_), special_tokens_(ojson::object()) {
  special_tokens_["bos_token"] = std::move(bos_token);
  special_tokens_["eos_token"] = std::move(eos_token);
}

ChatTemplate ChatTemplate::from_dir(const std::filesystem::path& dir) {
  const auto config_path = dir / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (path_exists(config_path)) {
    try {
      config = nlohmann::json::parse(read_text(config_path));
    } catch (const nlohmann::json::exception& e) {  // also out_of_range (1e999)
      throw Error(config_path.string() + ": invalid JSON: " + e.what());
    }
    if (!config.is_object()) throw Error(config_path.string() + ": expected a JSON object");
  }

  std::string source;
  std::string origin = config_path.string();
  const auto jinja_path = dir / "chat_template.jinja";
  if (path_exists(jinja_path)) {
    source = read_text(jinja_path);
    origin = jinja_path.string();
  } else if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      bool found = false;
      for (const auto& t : *it) {
        if (t.is_object() && t.contains("name") && t["name"] == "default" &&
            t.contains("template") && t["template"].is_string()) {
          source = t["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) throw Error(origin + ": chat_template has no template named \"default\"");
    } else {
      throw Error(origin + ": chat_template must be a string or a list of named templates");
    }
  } else {
    throw Error("no chat template in " + dir.string() +
                " (neither chat_template.jinja nor \"chat_template\" in tokenizer_config.json)");
  }

  ojson special = ojson::object();
  for (const char* name : kSpecialTokens) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    auto text = token_text(*it);
    // Another type would render differently in transformers (or fail there): refused.
    if (!text)
      throw Error(config_path.string() + ": " + name +
                  " must be a string or an object with a string \"content\", not " +
                  it->dump().substr(0, 60));
    special[name] = *text;
  }
  try {
    ChatTemplate t(std::move(source), "", "");
    t.special_tokens_ = std::move(special);
    return t;
  } catch (const Error& e) {
    throw Error(origin + ": " + e.what());
  }
}

std::string ChatTemplate::render(const ojson& messages, bool add_generation_prompt,
                                 const ojson& extra) const {
  if (!messages.is_array()) throw Error("chat template: messages must be a JSON array");
  if (!extra.is_object()) throw Error("chat template: extra variables must be a JSON object");
  // As apply_chat_template calls it: render(messages=..., tools=..., documents=...,
  // add_generation_prompt=..., **special_tokens_map, **kwargs).
  static const ojson kNone = nullptr;
  const ojson generation_prompt = add_generation_prompt;
  jinja::Template::Variables vars;
  for (const auto& [name, text] : special_tokens_.items()) vars.emplace_back(name, &text);
  vars.emplace_back("messages", &messages);
  vars.emplace_back("tools", &kNone);
  vars.emplace_back("documents", &kNone);
  vars.emplace_back("add_generation_prompt", &generation_prompt);
  for (const auto& [name, value] : extra.items()) {
    if (name == "messages" || name == "add_generation_prompt")
      throw Error("chat template: '" + name + "' cannot be an extra variable");
    vars.emplace_back(name, &value);
  }
  return template_.render(vars);
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  return render(ojson(messages), add_generation_prompt, ojson(extra));
}

}  // namespace blend
