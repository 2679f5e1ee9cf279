#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend {
namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
std::vector<uint32_t> bytes_to_unicode() {
  std::vector<uint32_t> table(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[static_cast<size_t>(b)] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[static_cast<size_t>(b)] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[static_cast<size_t>(b)] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b)
    table[static_cast<size_t>(b)] =
        direct[static_cast<size_t>(b)] ? static_cast<uint32_t>(b) : next++;
  return table;
}

// Decodes one UTF-8 code point from s (valid input assumed: it comes from our JSON).
uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  uint32_t cp;
  int extra;
  if (c < 0x80) {
    cp = c;
    extra = 0;
  } else if ((c >> 5) == 6) {
    cp = c & 0x1f;
    extra = 1;
  } else if ((c >> 4) == 14) {
    cp = c & 0x0f;
    extra = 2;
  } else {
    cp = c & 0x07;
    extra = 3;
  }
  ++i;
  for (int k = 0; k < extra && i < s.size(); ++k, ++i)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3f);
  return cp;
}

// The WHATWG UTF-8 decoder's view of the bytes at s[i..]: the length of a valid character,
// or of the maximal ill-formed subpart (to be replaced by one U+FFFD). `incomplete` is set when
// the bytes are a valid prefix cut short by the end of the buffer.
size_t utf8_unit(std::string_view s, size_t i, bool& valid, bool& incomplete) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  valid = false;
  incomplete = false;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    valid = true;
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;  // invalid lead byte
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) {
      incomplete = true;
      return k;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return k;  // the subpart ends before this byte
    lo = 0x80;
    hi = 0xBF;
  }
  valid = true;
  return need + 1;
}

void append_replacement(std::string& out) {
  out += "\xEF\xBF\xBD";
}

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open " + path.string());
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
}

std::string token_string(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

// Owns a compiled PCRE2 pattern and hands each thread its own match data.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(where +
                  ": pre-tokenizer regex does not compile: " + reinterpret_cast<char*>(msg));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(begin, end) for every match in text, in order.
  template <typename F>
  void for_each_match(std::string_view text, F&& f) const {
    thread_local struct Data {
      pcre2_match_data* md = nullptr;
      ~Data() { pcre2_match_data_free(md); }
    } data;
    if (!data.md) data.md = pcre2_match_data_create(1, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    PCRE2_SIZE start = 0;
    while (start < text.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), start, 0, data.md, nullptr)
                          : pcre2_match(code_, subject, text.size(), start, 0, data.md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.md);
      if (ov[1] == ov[0]) {  // empty match: step over one character
        start = ov[0] + 1;
        while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
          ++start;
        continue;
      }
      f(ov[0], ov[1]);
      start = ov[1];
    }
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> id_to_bytes;                   // raw bytes of every id
  std::unordered_map<std::string, int32_t> bytes_to_id;   // regular vocab, by raw bytes
  std::unordered_map<std::string, int32_t> string_to_id;  // vocab + added, by JSON string
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a,b) -> (rank, merged)
  int32_t byte_ids[256] = {};
  std::vector<AddedToken> added;  // longest first
  std::vector<std::vector<size_t>> added_by_first_byte = std::vector<std::vector<size_t>>(256);
  std::vector<bool> special;
  std::unique_ptr<Regex> split;  // null: the whole text is one pre-token
  bool ignore_merges = false;
  std::string bos, eos;

  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
};

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges || piece.size() == 1) {
    if (auto it = bytes_to_id.find(std::string(piece)); it != bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Per-thread cache of pre-token -> ids: natural text repeats its words a lot.
  thread_local std::unordered_map<const Impl*,
                                  std::unordered_map<std::string, std::vector<int32_t>>>
      caches;
  auto& cache = caches[this];
  const std::string key(piece);
  if (auto it = cache.find(key); it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  // Symbols start as single bytes; repeatedly merge the adjacent pair of lowest rank.
  std::vector<int32_t> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_ids[static_cast<unsigned char>(piece[i])];
  while (sym.size() > 1) {
    int32_t best_rank = INT32_MAX, best_id = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges.find(pair_key(sym[i], sym[i + 1]));
      if (it != merges.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best_id = it->second.second;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    sym[best_at] = best_id;
    sym.erase(sym.begin() + static_cast<ptrdiff_t>(best_at) + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
  if (cache.size() > 200000) cache.clear();
  cache.emplace(key, std::move(sym));
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (!split) {
    bpe(text, out);
    return;
  }
  size_t last = 0;
  split->for_each_match(text, [&](size_t b, size_t e) {
    if (b > last) bpe(text.substr(last, b - last), out);  // "Isolated": gaps are pieces too
    bpe(text.substr(b, e - b), out);
    last = e;
  });
  if (last < text.size()) bpe(text.substr(last), out);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  const auto config = dir / "tokenizer_config.json";
  return from_files(dir / "tokenizer.json",
                    std::filesystem::exists(config) ? config : std::filesystem::path());
}

Tokenizer Tokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                const std::filesystem::path& tokenizer_config_json) {
  const std::string where = tokenizer_json.string();
  const json j = read_json(tokenizer_json);
  auto impl = std::make_unique<Impl>();
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw Error(where + ": missing 'model'");
  const json& model = j["model"];
  if (model.value("type", std::string("BPE")) != "BPE")
    throw Error(where + ": only BPE tokenizers are supported, not " + model["type"].dump());
  if (!model.contains("vocab") || !model["vocab"].is_object())
    throw Error(where + ": missing model.vocab");
  impl->ignore_merges = model.value("ignore_merges", false);

  // The vocabulary is stored in GPT-2's byte-to-unicode alphabet; keep it as raw bytes.
  const std::vector<uint32_t> b2u = bytes_to_unicode();
  std::unordered_map<uint32_t, unsigned char> u2b;
  for (int b = 0; b < 256; ++b) u2b[b2u[static_cast<size_t>(b)]] = static_cast<unsigned char>(b);
  auto to_bytes = [&](const std::string& s) {
    std::string raw;
    for (size_t i = 0; i < s.size();) {
      const uint32_t cp = next_code_point(s, i);
      auto it = u2b.find(cp);
      if (it == u2b.end()) throw Error(where + ": vocab entry is not byte-level: " + s);
      raw.push_back(static_cast<char>(it->second));
    }
    return raw;
  };
  int32_t max_id = -1;
  for (const auto& [tok, id] : model["vocab"].items()) max_id = std::max(max_id, id.get<int32_t>());
  if (j.contains("added_tokens"))
    for (const auto& a : j["added_tokens"]) max_id = std::max(max_id, a.at("id").get<int32_t>());
  impl->id_to_bytes.resize(static_cast<size_t>(max_id + 1));
  impl->special.assign(static_cast<size_t>(max_id + 1), false);
  impl->bytes_to_id.reserve(model["vocab"].size());
  for (const auto& [tok, id_json] : model["vocab"].items()) {
    const int32_t id = id_json.get<int32_t>();
    std::string raw = to_bytes(tok);
    impl->id_to_bytes[static_cast<size_t>(id)] = raw;
    impl->bytes_to_id.emplace(std::move(raw), id);
    impl->string_to_id.emplace(tok, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = impl->bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == impl->bytes_to_id.end()) throw Error(where + ": the vocab lacks a byte token");
    impl->byte_ids[b] = it->second;
  }
  if (model.contains("merges")) {
    int32_t rank = 0;
    impl->merges.reserve(model["merges"].size());
    for (const auto& m : model["merges"]) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) throw Error(where + ": malformed merge '" + s + "'");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        throw Error(where + ": malformed merge " + m.dump());
      }
      auto ia = impl->string_to_id.find(a), ib = impl->string_to_id.find(b),
           im = impl->string_to_id.find(a + b);
      if (ia == impl->string_to_id.end() || ib == impl->string_to_id.end() ||
          im == impl->string_to_id.end())
        throw Error(where + ": merge '" + a + " " + b + "' names tokens outside the vocab");
      impl->merges.emplace(pair_key(ia->second, ib->second), std::make_pair(rank++, im->second));
    }
  }
  if (j.contains("added_tokens")) {
    for (const auto& a : j["added_tokens"]) {
      AddedToken t{a.at("content").get<std::string>(), a.at("id").get<int32_t>(),
                   a.value("special", false)};
      if (t.content.empty()) continue;
      impl->id_to_bytes[static_cast<size_t>(t.id)] = t.content;
      impl->special[static_cast<size_t>(t.id)] = t.special;
      impl->string_to_id[t.content] = t.id;
      impl->added.push_back(std::move(t));
    }
    std::stable_sort(impl->added.begin(), impl->added.end(),
                     [](const AddedToken& x, const AddedToken& y) {
                       return x.content.size() > y.content.size();
                     });
    for (size_t i = 0; i < impl->added.size(); ++i)
      impl->added_by_first_byte[static_cast<unsigned char>(impl->added[i].content[0])].push_back(i);
  }

  // Pre-tokenizer: Split(regex) [+ ByteLevel(use_regex=false)], or ByteLevel(use_regex=true)
  // with GPT-2's pattern. Anything else would tokenize differently: refuse it.
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    for (const auto& p : pre["pretokenizers"]) steps.push_back(p);
  } else if (pre.is_object()) {
    steps.push_back(pre);
  }
  std::string pattern;
  for (const auto& p : steps) {
    const std::string type = p.value("type", "");
    if (type == "Split") {
      if (!pattern.empty()) throw Error(where + ": more than one Split pre-tokenizer");
      if (!p.contains("pattern") || !p["pattern"].contains("Regex"))
        throw Error(where + ": Split pre-tokenizer without a Regex pattern");
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
        throw Error(where + ": only Split with behavior Isolated is supported");
      pattern = p["pattern"]["Regex"].get<std::string>();
    } else if (type == "ByteLevel") {
      if (p.value("add_prefix_space", false))
        throw Error(where + ": ByteLevel add_prefix_space is not supported");
      if (p.value("use_regex", true)) {
        if (!pattern.empty()) throw Error(where + ": ByteLevel use_regex after a Split");
        pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
      }
    } else {
      throw Error(where + ": unsupported pre-tokenizer '" + type + "'");
    }
  }
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    throw Error(where + ": tokenizers with a normalizer are not supported");
  if (!pattern.empty()) impl->split = std::make_unique<Regex>(pattern, where);

  if (!tokenizer_config_json.empty()) {
    const json c = read_json(tokenizer_config_json);
    if (c.contains("bos_token")) impl->bos = token_string(c["bos_token"]);
    if (c.contains("eos_token")) impl->eos = token_string(c["eos_token"]);
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (!parse_special || impl_->added.empty()) {
    impl_->encode_plain(text, out);
    return out;
  }
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& candidates = impl_->added_by_first_byte[static_cast<unsigned char>(text[i])];
    for (size_t k : candidates) {
      const AddedToken& t = impl_->added[k];
      if (text.compare(i, t.content.size(), t.content) == 0) {
        if (i > start) impl_->encode_plain(text.substr(start, i - start), out);
        out.push_back(t.id);
        i += t.content.size() - 1;
        start = i + 1;
        break;
      }
    }
  }
  if (start < text.size()) impl_->encode_plain(text.substr(start), out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return sanitize_utf8(bytes);
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  static const std::string empty;
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_bytes.size()) return empty;
  return impl_->id_to_bytes[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->string_to_id.find(std::string(token));
  if (it == impl_->string_to_id.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->id_to_bytes.size());
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() &&
         impl_->special[static_cast<size_t>(id)];
}

const std::string& Tokenizer::bos_token() const {
  return impl_->bos;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool valid, incomplete;
    const size_t n = utf8_unit(bytes, i, valid, incomplete);
    if (valid) {
      out.append(bytes.substr(i, n));
    } else {
      append_replacement(out);
    }
    i += n;
  }
  return out;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return "";
  pending_ += tokenizer_.token_bytes(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    bool valid, incomplete;
    const size_t n = utf8_unit(pending_, i, valid, incomplete);
    if (incomplete) break;  // wait for the rest of the character
    if (valid) {
      out.append(pending_, i, n);
    } else {
      append_replacement(out);
    }
    i += n;
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace blend
