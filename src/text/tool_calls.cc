#include "text/tool_calls.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace blend {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
// Generated text is not a client's request, but it is as untrusted: nlohmann's parser recurses
// per level, so a reply of 100,000 "[" would overflow the stack. No tool's arguments nest this
// deep.
constexpr int kMaxDepth = 128;

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  const size_t b = skip_space(s, 0);
  size_t e = s.size();
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// The end (one past the matching "}") of the JSON object that starts at s[start] == '{', found
// by counting brackets outside strings; npos when it does not close or nests too deep.
size_t object_end(std::string_view s, size_t start) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = start; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return std::string_view::npos;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// One call object, exactly `text` (trimmed): {"name": "...", "<args>": {...}}. The arguments
// key is the format's ("arguments" for Hermes, "parameters" for Llama), the other accepted too,
// since models trained on one sometimes write the other. Arguments written as a string holding
// a JSON object are accepted (some models quote them). Absent arguments are {}.
std::optional<ParsedToolCall> parse_call(std::string_view text) {
  text = trim(text);
  if (text.empty() || text[0] != '{' || object_end(text, 0) != text.size()) return std::nullopt;
  const ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
    return std::nullopt;
  ojson args = ojson::object();
  for (const char* key : {"arguments", "parameters"}) {
    auto a = j.find(key);
    if (a == j.end()) continue;
    args = *a;
    break;
  }
  if (args.is_string()) {
    const std::string& s = args.get_ref<const std::string&>();
    const std::string_view t = trim(s);
    if (t.empty() || t[0] != '{' || object_end(t, 0) != t.size()) return std::nullopt;
    args = ojson::parse(t, nullptr, false);
  }
  if (!args.is_object()) return std::nullopt;
  return ParsedToolCall{name->get<std::string>(),
                        args.dump(-1, ' ', false, ojson::error_handler_t::replace)};
}

// How much of the end of `s` could be the start of `tag` (held back: the rest may follow).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

bool template_takes_tools(std::string_view source) {
  // A template reads the variable by name; one that never names it cannot render tools.
  return source.find("tools") != std::string_view::npos;
}

std::optional<ToolCallFormat> detect_tool_call_format(std::string_view source) {
  if (!template_takes_tools(source)) return std::nullopt;
  // Hermes-style templates print the wrapper tag in the instructions and in past calls.
  if (source.find(kOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  // Llama 3.x templates render past calls as '{"name": "' + name + '", "parameters": ...'.
  if (source.find("\"parameters\": ") != std::string_view::npos) return ToolCallFormat::kLlama3Json;
  return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
  return format == ToolCallFormat::kHermes ? "hermes" : "llama3_json";
}

ToolCallParser::ToolCallParser(ToolCallFormat format, size_t max_calls)
    : format_(format), max_calls_(max_calls) {}

void ToolCallParser::emit_content(std::string_view text, ToolCallOutput& out) {
  if (after_call_) {
    text = text.substr(skip_space(text, 0));
    if (text.empty()) return;
    after_call_ = false;
  }
  size_t last = text.size();
  while (last > 0 && is_space(text[last - 1])) --last;
  if (last == 0) {
    ws_ += text;
    return;
  }
  out.content += ws_;
  out.content += text.substr(0, last);
  ws_ = text.substr(last);
}

void ToolCallParser::add_call(ParsedToolCall call, ToolCallOutput& out) {
  ws_.clear();  // the whitespace before a call is formatting
  any_call_ = true;
  after_call_ = true;
  if (calls_ >= max_calls_) return;
  ++calls_;
  out.calls.push_back(std::move(call));
}

void ToolCallParser::feed_hermes(ToolCallOutput& out) {
  for (;;) {
    if (!in_call_) {
      const size_t at = buf_.find(kOpen);
      if (at == std::string::npos) {
        const size_t hold = partial_tag_suffix(buf_, kOpen);
        emit_content(std::string_view(buf_).substr(0, buf_.size() - hold), out);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      emit_content(std::string_view(buf_).substr(0, at), out);
      buf_.erase(0, at + kOpen.size());
      in_call_ = true;
    }
    const size_t end = buf_.find(kClose);
    if (end == std::string::npos) return;  // the call is still being written
    const std::string_view body = std::string_view(buf_).substr(0, end);
    if (auto call = parse_call(body)) {
      add_call(std::move(*call), out);
    } else {
      emit_content(std::string(kOpen) + std::string(body) + std::string(kClose), out);
    }
    buf_.erase(0, end + kClose.size());
    in_call_ = false;
  }
}

void ToolCallParser::feed_llama(ToolCallOutput& out) {
  if (mode_ == Mode::kUndecided) {
    const size_t i = skip_space(buf_, 0);
    if (i == buf_.size()) return;  // only whitespace yet
    const std::string_view rest = std::string_view(buf_).substr(i);
    if (rest[0] == '{' || rest.starts_with(kPythonTag)) {
      mode_ = Mode::kJson;
    } else if (kPythonTag.starts_with(rest)) {
      return;  // maybe the tag, in pieces
    } else {
      mode_ = Mode::kContent;
    }
  }
  if (mode_ == Mode::kContent) {
    emit_content(buf_, out);
    buf_.clear();
  }
  // kJson: a reply that opens with "{" is held whole; it is a call only if all of it parses.
}

ToolCallOutput ToolCallParser::feed(std::string_view text) {
  ToolCallOutput out;
  buf_ += text;
  if (format_ == ToolCallFormat::kHermes)
    feed_hermes(out);
  else
    feed_llama(out);
  return out;
}

ToolCallOutput ToolCallParser::finish() {
  ToolCallOutput out;
  if (format_ == ToolCallFormat::kHermes) {
    if (in_call_) {
      // An unclosed last call (the model ended without "</tool_call>") is still a call when
      // its object is complete, as vLLM's hermes parser reads it.
      if (auto call = parse_call(buf_))
        add_call(std::move(*call), out);
      else
        emit_content(std::string(kOpen) + buf_, out);
    } else {
      emit_content(buf_, out);
    }
  } else if (mode_ == Mode::kJson) {
    // {"name": ..., "parameters": ...} (";" {...})*, after an optional <|python_tag|>.
    const std::string_view s = buf_;
    std::vector<ParsedToolCall> calls;
    size_t i = skip_space(s, 0);
    if (s.substr(i).starts_with(kPythonTag)) i += kPythonTag.size();
    bool ok = true;
    while (ok) {
      i = skip_space(s, i);
      const size_t end = i < s.size() && s[i] == '{' ? object_end(s, i) : std::string_view::npos;
      auto call = end == std::string_view::npos ? std::nullopt : parse_call(s.substr(i, end - i));
      if (!call) {
        ok = false;
        break;
      }
      calls.push_back(std::move(*call));
      i = skip_space(s, end);
      if (i == s.size()) break;
      if (s[i] != ';') ok = false;
      ++i;
    }
    if (ok) {
      for (auto& c : calls) add_call(std::move(c), out);
    } else {
      emit_content(s, out);
    }
  } else {
    emit_content(buf_, out);
  }
  buf_.clear();
  in_call_ = false;
  if (!any_call_) out.content += ws_;
  ws_.clear();
  return out;
}

ToolCallOutput parse_tool_calls(ToolCallFormat format, std::string_view text, size_t max_calls) {
  ToolCallParser p(format, max_calls);
  ToolCallOutput out = p.feed(text);
  ToolCallOutput rest = p.finish();
  out.content += rest.content;
  for (auto& c : rest.calls) out.calls.push_back(std::move(c));
  return out;
}

}  // namespace blend
