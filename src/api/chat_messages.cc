#include "api/chat_messages.h"

#include <string>

#include "api/api_error.h"
#include "api/utf8.h"

namespace blend {
namespace {

using nlohmann::json;

std::string flatten_parts(const json& parts, const std::string& where) {
  std::string text;
  bool first = true;
  for (size_t j = 0; j < parts.size(); ++j) {
    const json& part = parts[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw ApiError(400, "'" + at + "' must be a content part object with a 'type'", at);
    const std::string& type = part["type"].get_ref<const std::string&>();
    if (type != "text")
      throw ApiError(400,
                     "'" + at + "' is a '" + type +
                         "' content part; this model reads text only (type \"text\")",
                     at + ".type");
    auto t = part.find("text");
    if (t == part.end() || !t->is_string())
      throw ApiError(400, "'" + at + ".text' must be a string", at + ".text");
    if (!first) text += '\n';
    text += t->get_ref<const std::string&>();
    first = false;
  }
  return text;
}

}  // namespace

json flatten_chat_messages(const json& messages) {
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw ApiError(400, "each message needs a 'role' (" + where + ")", "messages");
    json copy = m;
    if (auto c = copy.find("content"); c != copy.end()) {
      if (c->is_array()) {
        *c = flatten_parts(*c, where + ".content");
      } else if (!c->is_string() && !c->is_null()) {
        throw ApiError(400, "'" + where + ".content' must be a string or a list of content parts",
                       where + ".content");
      }
      if (c->is_string()) check_utf8(c->get_ref<const std::string&>(), where + ".content");
    }
    out.push_back(std::move(copy));
  }
  return out;
}

}  // namespace blend
