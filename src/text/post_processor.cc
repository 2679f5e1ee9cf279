#include "text/post_processor.h"

#include <algorithm>

#include "core/error.h"

namespace blend::tok {
namespace {

using nlohmann::json;

std::string type_of(const json& p) {
  return p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>()
                                                                      : "";
}

// A [token, id] pair of RobertaProcessing / BertProcessing.
int32_t token_pair(const json& p, const char* key,
                   const std::function<std::optional<int32_t>(std::string_view)>& token_id,
                   const std::string& where) {
  const json& v = p.contains(key) ? p[key] : json();
  if (!v.is_array() || v.size() != 2 || !v[0].is_string() || !v[1].is_number_integer())
    throw Error(where + ": post_processor." + key + " must be [token, id]");
  const auto id = token_id(v[0].get<std::string>());
  if (!id || *id != v[1].get<int64_t>())
    throw Error(where + ": post_processor." + key + " names " + v.dump() +
                ", which is not that token's id");
  return *id;
}

// The "single" template of a TemplateProcessing.
void load_template(const json& p, PostProcessor& out, const std::string& where) {
  const json& single = p.contains("single") ? p["single"] : json();
  const json& specials = p.contains("special_tokens") ? p["special_tokens"] : json::object();
  if (!single.is_array()) throw Error(where + ": TemplateProcessing without a 'single' template");
  bool seen_sequence = false;
  for (const json& item : single) {
    if (item.is_object() && item.contains("Sequence")) {
      const json& seq = item["Sequence"];
      if (seen_sequence || !seq.is_object() || seq.value("id", "") != "A")
        throw Error(where + ": TemplateProcessing's single template must hold sequence A once, " +
                    "not " + item.dump().substr(0, 100));
      seen_sequence = true;
      continue;
    }
    const json* special =
        item.is_object() && item.contains("SpecialToken") ? &item["SpecialToken"] : nullptr;
    if (!special || !special->is_object() || !(*special).contains("id") ||
        !(*special)["id"].is_string())
      throw Error(where + ": unsupported TemplateProcessing item " + item.dump().substr(0, 100));
    const std::string name = (*special)["id"].get<std::string>();
    if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
        !specials[name]["ids"].is_array())
      throw Error(where + ": TemplateProcessing names special token '" + name +
                  "' that its special_tokens do not give ids for");
    std::vector<int32_t>& side = seen_sequence ? out.suffix : out.prefix;
    for (const json& id : specials[name]["ids"]) {
      if (!id.is_number_integer()) throw Error(where + ": bad id in special_tokens." + name);
      side.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence)
    throw Error(where + ": TemplateProcessing's single template lacks sequence A");
}

void load_into(const json& p, PostProcessor& out,
               const std::function<std::optional<int32_t>(std::string_view)>& token_id,
               const std::string& where) {
  if (p.is_null()) return;
  const std::string type = type_of(p);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    if (!p.contains("processors") || !p["processors"].is_array())
      throw Error(where + ": Sequence post_processor without 'processors'");
    for (const json& step : p["processors"]) load_into(step, out, token_id, where);
    return;
  }
  PostProcessor step;
  if (type == "TemplateProcessing") {
    load_template(p, step, where);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    step.prefix = {token_pair(p, "cls", token_id, where)};
    step.suffix = {token_pair(p, "sep", token_id, where)};
  } else {
    throw Error(where + ": unsupported post_processor " + p.dump().substr(0, 200));
  }
  // A later step wraps what the earlier ones made.
  out.prefix.insert(out.prefix.begin(), step.prefix.begin(), step.prefix.end());
  out.suffix.insert(out.suffix.end(), step.suffix.begin(), step.suffix.end());
}

}  // namespace

std::vector<int32_t> PostProcessor::apply(std::vector<int32_t> ids) const {
  const bool has_prefix =
      ids.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
  std::vector<int32_t> out;
  out.reserve(prefix.size() + ids.size() + suffix.size());
  if (!has_prefix) out = prefix;
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), suffix.begin(), suffix.end());
  return out;
}

PostProcessor load_post_processor(
    const json& post_processor,
    const std::function<std::optional<int32_t>(std::string_view)>& token_id,
    const std::string& where) {
  PostProcessor out;
  load_into(post_processor, out, token_id, where);
  return out;
}

}  // namespace blend::tok
