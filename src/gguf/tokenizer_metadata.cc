#include "gguf/tokenizer_metadata.h"

#include <cctype>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace blend::gguf_internal {

using nlohmann::json;

namespace {

bool looks_special(const std::string& t) {
  auto starts = [&](std::string_view p) { return t.size() >= p.size() && t.starts_with(p); };
  auto ends = [&](std::string_view p) { return t.size() >= p.size() && t.ends_with(p); };
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (t.size() >= 4 && starts("<|") && ends("|>")) return true;
  if (starts("<\xEF\xBD\x9C") && ends("\xEF\xBD\x9C>") && t.size() >= 8) return true;  // <｜ ｜>
  return starts("<unused") && ends(">");
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

// The pre-tokenizer name llama.cpp uses for this tokenizer.json (see export.h).
std::string pre_tokenizer_name(const json& tok, const std::filesystem::path& path) {
  const auto model_it = tok.find("model");
  if (model_it == tok.end() || !model_it->is_object() ||
      model_it->value("type", std::string()) != "BPE")
    throw Error(path.string() + ": only BPE tokenizers can be exported to GGUF");
  const json& model = *model_it;
  if (model.value("byte_fallback", false))
    throw Error(path.string() +
                ": byte_fallback (SentencePiece-style) BPE is not supported by the GGUF export; "
                "only byte-level BPE (Llama-3, Qwen2)");
  std::vector<json> pres;
  if (auto it = tok.find("pre_tokenizer"); it != tok.end() && it->is_object()) {
    if (it->value("type", std::string()) == "Sequence" && it->contains("pretokenizers") &&
        (*it)["pretokenizers"].is_array()) {
      for (const auto& p : (*it)["pretokenizers"]) pres.push_back(p);
    } else {
      pres.push_back(*it);
    }
  }
  std::optional<std::string> regex;
  bool byte_level = false, byte_level_regex = false;
  for (const auto& p : pres) {
    if (!p.is_object()) continue;
    const std::string type = p.value("type", std::string());
    if (type == "ByteLevel") {
      byte_level = true;
      byte_level_regex = p.value("use_regex", true);
    } else if (type == "Split") {
      const json& pattern = p.value("pattern", json::object());
      if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string())
        regex = pattern["Regex"].get<std::string>();
      else
        throw Error(path.string() + ": Split pre-tokenizer without a Regex pattern");
    } else {
      throw Error(path.string() + ": pre-tokenizer '" + type +
                  "' is not supported by the GGUF export");
    }
  }
  if (!byte_level) throw Error(path.string() + ": not a byte-level BPE tokenizer (no ByteLevel)");
  if (regex) {
    if (*regex == kLlama3Regex) return "llama-bpe";
    if (*regex == kQwen2Regex) return "qwen2";
    throw Error(path.string() + ": pre-tokenizer regex has no llama.cpp equivalent: " + *regex);
  }
  if (byte_level_regex) return "gpt-2";
  throw Error(path.string() + ": ByteLevel pre-tokenizer without a split regex");
}

std::optional<std::string> token_string(const json& entry) {
  if (entry.is_string()) return entry.get<std::string>();
  if (entry.is_object() && entry.contains("content") && entry["content"].is_string())
    return entry["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
}

namespace {

// tokenizer.ggml.{model,pre,tokens,token_type}: tokens in id order, added tokens typed as
// control or user-defined. Returns the added tokens (content, id), first one first.
std::vector<std::pair<std::string, int64_t>> add_vocabulary(KvBuffer& kv, const json& tok,
                                                            const std::filesystem::path& tok_path,
                                                            const std::string& pre, int64_t n) {
  // Tokens in id order.
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<int32_t> types(static_cast<size_t>(n), static_cast<int32_t>(GgufTokenType::kUnused));
  std::vector<bool> filled(static_cast<size_t>(n), false);
  auto check_id = [&](int64_t id, const std::string& what) {
    if (id < 0 || id >= n)
      throw Error(tok_path.string() + ": " + what + " has id " + std::to_string(id) +
                  " outside the model's vocab_size " + std::to_string(n));
  };
  const json& tok_model = tok.at("model");  // an object: pre_tokenizer_name checked it
  const auto vocab = tok_model.find("vocab");
  if (vocab == tok_model.end() || !vocab->is_object() || vocab->empty())
    throw Error(tok_path.string() + ": model.vocab is missing or empty");
  for (const auto& [text, idj] : vocab->items()) {
    if (!idj.is_number_integer()) throw Error(tok_path.string() + ": vocab id of '" + text + "'");
    const int64_t id = idj.get<int64_t>();
    check_id(id, "token '" + text + "'");
    tokens[id] = text;
    types[id] = static_cast<int32_t>(GgufTokenType::kNormal);
    filled[id] = true;
  }
  // Added tokens: id -> content (first one wins, as the converter's lookup does).
  std::vector<std::pair<std::string, int64_t>> added;
  if (auto it = tok.find("added_tokens"); it != tok.end() && it->is_array()) {
    for (const auto& a : *it) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string())
        throw Error(tok_path.string() + ": malformed entry in added_tokens");
      const int64_t id = a["id"].get<int64_t>();
      std::string content = a["content"].get<std::string>();
      check_id(id, "added token '" + content + "'");
      added.emplace_back(content, id);
      const bool special = a.value("special", false);
      if (special || looks_special(content)) {
        types[id] = static_cast<int32_t>(GgufTokenType::kControl);
      } else {
        content = replace_all(content, "\xE2\x96\x81", " ");  // pre-normalized user-defined spaces
        types[id] = static_cast<int32_t>(GgufTokenType::kUserDefined);
      }
      tokens[id] = content;
      filled[id] = true;
    }
  }
  for (int64_t i = 0; i < n; ++i)
    if (!filled[i]) tokens[i] = "[PAD" + std::to_string(i) + "]";

  kv.put_string("tokenizer.ggml.model", "gpt2");
  kv.put_string("tokenizer.ggml.pre", pre);
  kv.put_strings("tokenizer.ggml.tokens", tokens);
  kv.put_i32s("tokenizer.ggml.token_type", types);
  tokens.clear();
  tokens.shrink_to_fit();

  return added;
}

void add_merges(KvBuffer& kv, const json& tok_model, const std::filesystem::path& tok_path) {
  // Merges: strings, or (transformers >= 4.45) pairs whose spaces become U+0120.
  std::vector<std::string> merges;
  if (auto it = tok_model.find("merges"); it != tok_model.end() && it->is_array()) {
    merges.reserve(it->size());
    for (const auto& m : *it) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        auto enc = [](const std::string& s) { return replace_all(s, " ", "\xC4\xA0"); };
        merges.push_back(enc(m[0].get<std::string>()) + " " + enc(m[1].get<std::string>()));
      } else {
        throw Error(tok_path.string() + ": unknown merges format");
      }
    }
  }
  if (merges.empty()) throw Error(tok_path.string() + ": model.merges is missing or empty");
  kv.put_strings("tokenizer.ggml.merges", merges);
  merges.clear();
  merges.shrink_to_fit();
}

void add_special_tokens(KvBuffer& kv, const json& tok, const json& tcfg, const json& raw_config,
                        const std::vector<std::pair<std::string, int64_t>>& added, int64_t n) {
  // Special token ids: tokenizer_config.json's token strings, then config.json's *_token_id
  // (gguf-py SpecialVocab order); add_*_token from the TemplateProcessing post-processor, then
  // tokenizer_config.json.
  auto added_id = [&](const std::string& content) -> std::optional<int64_t> {
    for (const auto& [c, id] : added)
      if (c == content) return id;
    return std::nullopt;
  };
  std::map<std::string, bool> add_flags;
  const std::optional<std::string> bos_str =
      tcfg.contains("bos_token") ? token_string(tcfg["bos_token"]) : std::nullopt;
  const std::optional<std::string> eos_str =
      tcfg.contains("eos_token") ? token_string(tcfg["eos_token"]) : std::nullopt;
  if (auto it = tok.find("post_processor"); it != tok.end() && it->is_object()) {
    std::vector<json> procs;
    if (it->contains("processors") && (*it)["processors"].is_array())
      for (const auto& p : (*it)["processors"]) procs.push_back(p);
    else
      procs.push_back(*it);
    for (const auto& p : procs) {
      if (!p.is_object() || p.value("type", std::string()) != "TemplateProcessing") continue;
      const json& single = p.value("single", json::array());
      if (!single.is_array() || single.size() < 2) continue;
      auto special_id = [](const json& e) -> std::optional<std::string> {
        if (e.is_object() && e.contains("SpecialToken") && e["SpecialToken"].is_object() &&
            e["SpecialToken"].contains("id") && e["SpecialToken"]["id"].is_string())
          return e["SpecialToken"]["id"].get<std::string>();
        return std::nullopt;
      };
      if (auto first = special_id(single.front())) add_flags["bos"] = bos_str && *first == *bos_str;
      if (auto last = special_id(single.back())) add_flags["eos"] = eos_str && *last == *eos_str;
    }
  }
  const char* kTypes[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
  std::map<std::string, int64_t> ids;
  for (const char* typ : kTypes) {
    const std::string t(typ);
    if (auto it = tcfg.find("add_" + t + "_token"); it != tcfg.end() && it->is_boolean())
      add_flags[t] = it->get<bool>();
    if (auto it = tcfg.find(t + "_token"); it != tcfg.end())
      if (auto s = token_string(*it))
        if (auto id = added_id(*s)) ids[t] = *id;
  }
  for (const char* typ : kTypes) {
    const std::string t(typ);
    if (ids.count(t)) continue;
    if (auto it = raw_config.find(t + "_token_id");
        it != raw_config.end() && it->is_number_integer())
      if (it->get<int64_t>() >= 0 && it->get<int64_t>() < n) ids[t] = it->get<int64_t>();
  }
  for (const char* typ : {"eot_id", "im_end"}) {
    if (auto id = added_id(std::string("<|") + typ + "|>")) {
      ids["eot"] = *id;
      break;
    }
  }
  const char* kIdOrder[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot"};
  for (const char* typ : kIdOrder)
    if (auto it = ids.find(typ); it != ids.end())
      kv.put_u32(std::string("tokenizer.ggml.") + typ + "_token_id",
                 static_cast<uint32_t>(it->second));
  for (const char* typ : kTypes)
    if (auto it = add_flags.find(typ); it != add_flags.end())
      kv.put_bool(std::string("tokenizer.ggml.add_") + typ + "_token", it->second);
}

void add_chat_templates(KvBuffer& kv, const std::filesystem::path& dir, const json& tcfg) {
  // Chat template(s): tokenizer_config.json, else chat_template.jinja / chat_template.json.
  json tmpl;
  if (auto it = tcfg.find("chat_template"); it != tcfg.end()) {
    tmpl = *it;
  } else if (std::filesystem::exists(dir / "chat_template.jinja")) {
    std::ifstream in(dir / "chat_template.jinja", std::ios::binary);
    tmpl = std::string(std::istreambuf_iterator<char>(in), {});
  } else if (std::filesystem::exists(dir / "chat_template.json")) {
    const json j = read_json(dir / "chat_template.json");
    if (j.is_object() && j.contains("chat_template")) tmpl = j["chat_template"];
  }
  if (tmpl.is_string()) {
    kv.put_string("tokenizer.chat_template", tmpl.get<std::string>());
  } else if (tmpl.is_array()) {
    std::optional<std::string> def;
    std::vector<std::string> names;
    for (const auto& choice : tmpl) {
      if (!choice.is_object() || !choice.contains("template") || !choice["template"].is_string())
        continue;
      std::string name = choice.value("name", std::string());
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      if (name.empty()) continue;
      if (name == "default") {
        def = choice["template"].get<std::string>();
      } else if (!kv.has("tokenizer.chat_template." + name)) {
        names.push_back(name);
        kv.put_string("tokenizer.chat_template." + name, choice["template"].get<std::string>());
      }
    }
    if (!names.empty()) kv.put_strings("tokenizer.chat_templates", names);
    if (def) kv.put_string("tokenizer.chat_template", *def);
  }
}

}  // namespace

void add_tokenizer_metadata(KvBuffer& kv, const std::filesystem::path& dir,
                            const ModelConfig& config, const json& raw_config) {
  const auto tok_path = dir / "tokenizer.json";
  if (!std::filesystem::exists(tok_path))
    throw Error(dir.string() + ": no tokenizer.json (GGUF export needs the tokenizer)");
  const json tok = read_json(tok_path);
  if (!tok.is_object()) throw Error(tok_path.string() + ": expected a JSON object");
  const std::string pre = pre_tokenizer_name(tok, tok_path);

  json tcfg = json::object();
  const auto tcfg_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(tcfg_path)) {
    tcfg = read_json(tcfg_path);
    if (!tcfg.is_object()) throw Error(tcfg_path.string() + ": expected a JSON object");
  }

  const int64_t n = config.vocab_size;
  const std::vector<std::pair<std::string, int64_t>> added =
      add_vocabulary(kv, tok, tok_path, pre, n);
  add_merges(kv, tok.at("model"), tok_path);
  add_special_tokens(kv, tok, tcfg, raw_config, added, n);
  add_chat_templates(kv, dir, tcfg);
}

}  // namespace blend::gguf_internal
