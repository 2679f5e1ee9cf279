// Loading a tokenizer.json (and tokenizer_config.json) into a Tokenizer.
#include <algorithm>
#include <limits>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace blend {

namespace tok {

// Members read with their type checked: a wrong JSON type is an error naming the file and the
// field (nlohmann's own type_error surfaced as "internal error"). `field` is where `obj` is.
bool flag(const nlohmann::json& obj, const char* key, bool dflt, const std::string& where,
          const std::string& field) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean())
    throw Error(where + ": " + field + key + " must be true or false, not " +
                it->dump().substr(0, 60));
  return it->get<bool>();
}

std::string text(const nlohmann::json& obj, const char* key, const std::string& where,
                 const std::string& field) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return "";
  if (!it->is_string())
    throw Error(where + ": " + field + key + " must be a string, not " + it->dump().substr(0, 60));
  return it->get<std::string>();
}

}  // namespace tok

namespace {

using nlohmann::json;
using namespace tok;

// tokenizer.json of the largest vocabularies (Gemma's 256K) is ~35 MB.
constexpr uint64_t kMaxTokenizerFileBytes = 1u << 30;

std::string read_file(const std::filesystem::path& path) {
  return read_regular_file(path, kMaxTokenizerFileBytes);
}

json read_json(const std::filesystem::path& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
}

// tokenizer.json with its two big members, model.vocab (object) and model.merges (array), read
// straight into vectors by a SAX parser: building them as a DOM first took four times longer
// than parsing (nlohmann keeps objects in std::map). Everything else becomes an ordinary DOM.
struct TokenizerFile {
  json rest;  // the document without model.vocab / model.merges when those were captured
  bool has_vocab = false, has_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

class TokenizerSax : public json::json_sax_t {
 public:
  explicit TokenizerSax(TokenizerFile& out) : out_(out) {}
  std::string error;

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(json::number_integer_t v) override { return integer(v); }
  bool number_unsigned(json::number_unsigned_t v) override {
    return integer(v > static_cast<json::number_unsigned_t>(INT64_MAX) ? -1
                                                                       : static_cast<int64_t>(v));
  }
  bool number_float(json::number_float_t v, const json::string_t&) override {
    return value(json(v));
  }
  bool binary(json::binary_t&) override { return fail("unexpected binary value"); }
  bool string(json::string_t& v) override {
    if (mode() == Mode::kMerges) {
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        return fail("malformed merge '" + v + "'");
      out_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (mode() == Mode::kMergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return value(json(std::move(v)));
  }
  bool start_object(std::size_t) override {
    if (at_model_member("vocab")) {
      out_.has_vocab = true;
      frames_.push_back({nullptr, {}, Mode::kVocab});
      return true;
    }
    if (mode() != Mode::kDom) return fail("unexpected object in model.vocab or model.merges");
    frames_.push_back({place(json::object()), {}, Mode::kDom});
    return true;
  }
  bool key(json::string_t& k) override {
    frames_.back().key = std::move(k);
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (at_model_member("merges")) {
      out_.has_merges = true;
      frames_.push_back({nullptr, {}, Mode::kMerges});
      return true;
    }
    if (mode() == Mode::kMerges) {
      pair_.clear();
      frames_.push_back({nullptr, {}, Mode::kMergePair});
      return true;
    }
    if (mode() != Mode::kDom) return fail("unexpected array in model.vocab or model.merges");
    frames_.push_back({place(json::array()), {}, Mode::kDom});
    return true;
  }
  bool end_array() override {
    if (mode() == Mode::kMergePair) {
      if (pair_.size() != 2) return fail("a merge is not a pair of strings");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
    }
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(std::string("invalid JSON: ") + e.what());
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };
  struct Frame {
    json* node;       // the DOM container being filled (kDom only)
    std::string key;  // the current key, in objects
    Mode mode;
  };

  Mode mode() const { return frames_.empty() ? Mode::kDom : frames_.back().mode; }
  bool fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }
  // True when the next value is the top-level "model" object's member `name`.
  bool at_model_member(const char* name) const {
    return frames_.size() == 2 && frames_[0].mode == Mode::kDom && frames_[0].node->is_object() &&
           frames_[0].key == "model" && frames_[1].mode == Mode::kDom &&
           frames_[1].node->is_object() && frames_[1].key == name;
  }
  bool integer(int64_t v) {
    if (mode() == Mode::kVocab) {
      out_.vocab.emplace_back(std::move(frames_.back().key), v);
      return true;
    }
    return value(json(v));
  }
  bool value(json v) {
    if (mode() != Mode::kDom) return fail("unexpected value in model.vocab or model.merges");
    place(std::move(v));
    return true;
  }
  // Puts v where the parser is (the root, the end of an array, or under the current key).
  json* place(json v) {
    if (frames_.empty()) {
      out_.rest = std::move(v);
      return &out_.rest;
    }
    Frame& top = frames_.back();
    if (top.node->is_array()) {
      top.node->push_back(std::move(v));
      return &top.node->back();
    }
    json& slot = (*top.node)[top.key];
    slot = std::move(v);
    return &slot;
  }

  TokenizerFile& out_;
  std::vector<Frame> frames_;
  std::vector<std::string> pair_;
};

TokenizerFile read_tokenizer_file(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  TokenizerFile file;
  TokenizerSax sax(file);
  bool ok = false;
  try {
    ok = json::sax_parse(text, &sax);
  } catch (const json::exception& e) {
    sax.error = std::string("invalid JSON: ") + e.what();
  }
  if (!ok) throw Error(path.string() + ": " + (sax.error.empty() ? "invalid JSON" : sax.error));
  return file;
}

// What marks a SentencePiece-style tokenizer.json (Llama 2, Mistral 7B v0.x, Gemma): byte
// fallback to <0xNN> tokens, the Metaspace pre-tokenizer or decoder (spaces as U+2581), a
// normalizer that prepends or replaces with U+2581, a ByteFallback decoder. Any of them means
// the vocabulary is text pieces, not byte-level.
std::vector<std::string> sentencepiece_features(const json& j) {
  std::vector<std::string> found;
  const json& model = j["model"];
  if (model.contains("byte_fallback") && model["byte_fallback"] == true)
    found.push_back("model.byte_fallback");
  // The types named anywhere in a component, Sequences included.
  auto types = [](const json& component) {
    std::vector<std::string> out;
    std::vector<const json*> todo = {&component};
    while (!todo.empty()) {
      const json* c = todo.back();
      todo.pop_back();
      if (c->is_array())
        for (const auto& e : *c) todo.push_back(&e);
      if (!c->is_object()) continue;
      if (c->contains("type") && (*c)["type"].is_string()) out.push_back((*c)["type"]);
      for (const char* list : {"normalizers", "pretokenizers", "decoders"})
        if (c->contains(list)) todo.push_back(&(*c)[list]);
    }
    return out;
  };
  for (const char* component : {"normalizer", "pre_tokenizer", "decoder"}) {
    if (!j.contains(component)) continue;
    for (const std::string& type : types(j[component]))
      if (type == "Metaspace" || type == "Prepend" || type == "ByteFallback" ||
          (type == "Replace" && j[component].dump().find("\xe2\x96\x81") != std::string::npos))
        found.push_back(std::string(component) + " " + type);
  }
  return found;
}

// A special token in tokenizer_config.json: a string, an AddedToken object {"content": ...} or
// null.
std::string token_string(const json& c, const char* key, const std::string& where) {
  const auto it = c.find(key);
  if (it == c.end() || it->is_null()) return "";
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  if (!it->is_string())
    throw Error(where + ": " + key + " must be a string or an object with a string \"content\", " +
                "not " + it->dump().substr(0, 60));
  return it->get<std::string>();
}

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex=true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  const auto config = dir / "tokenizer_config.json";
  return from_files(dir / "tokenizer.json", path_exists(config) ? config : std::filesystem::path());
}

Tokenizer Tokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                const std::filesystem::path& tokenizer_config_json) {
  try {
    return load(tokenizer_json, tokenizer_config_json);
  } catch (const nlohmann::json::exception& e) {
    // A JSON type this reader does not check by name: still an error naming the files.
    throw Error(tokenizer_json.string() +
                (tokenizer_config_json.empty() ? "" : " or " + tokenizer_config_json.string()) +
                ": unexpected JSON: " + e.what());
  }
}

Tokenizer Tokenizer::load(const std::filesystem::path& tokenizer_json,
                          const std::filesystem::path& tokenizer_config_json) {
  const std::string where = tokenizer_json.string();
  TokenizerFile file = read_tokenizer_file(tokenizer_json);
  const json& j = file.rest;
  auto impl = std::make_unique<Impl>();
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw Error(where + ": missing 'model'");
  const json& model = j["model"];
  if (model.contains("type") && model["type"] != "BPE")
    throw Error(where + ": only BPE tokenizers are supported, not " + model["type"].dump());
  if (!file.has_vocab) throw Error(where + ": missing model.vocab");
  if (model.contains("merges") && !model["merges"].is_null())
    throw Error(where + ": model.merges is not an array");
  // SentencePiece-style files (Llama 2, Mistral 7B v0.x, Gemma) have a vocabulary of text
  // pieces, not GPT-2's byte alphabet: sentencepiece.cc reads their model, normalizers,
  // Metaspace pre-tokenizer and decoders.
  impl->sentencepiece =
      !sentencepiece_features(j).empty() || flag(model, "byte_fallback", false, where, "model.");
  // An empty prefix or suffix (Qwen3's files write "") adds nothing: the same as none.
  for (const char* unsupported : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (model.contains(unsupported) && !model[unsupported].is_null() &&
        model[unsupported] != json(""))
      throw Error(where + ": model." + unsupported + " is not supported");
  if (impl->sentencepiece) impl->load_sentencepiece_model(model, where);
  impl->ignore_merges = flag(model, "ignore_merges", false, where, "model.");
  const json empty_array = json::array();
  const json& added_json =
      j.contains("added_tokens") && !j["added_tokens"].is_null() ? j["added_tokens"] : empty_array;
  if (!added_json.is_array()) throw Error(where + ": 'added_tokens' is not an array");

  impl->load_vocab(std::move(file.vocab), added_json, where);
  impl->load_merges(std::move(file.merges), where);
  impl->load_added_tokens(added_json, where);
  impl->load_pipeline(j, where);
  if (impl->sentencepiece) impl->finish_sentencepiece(where);
  const Impl& loaded = *impl;
  impl->post_processor = load_post_processor(
      j.contains("post_processor") ? j["post_processor"] : json(),
      [&loaded](std::string_view token) -> std::optional<int32_t> {
        const int32_t id = loaded.by_text.find(token);
        return id < 0 ? std::nullopt : std::optional<int32_t>(id);
      },
      where);
  if (!tokenizer_config_json.empty()) {
    const json c = read_json(tokenizer_config_json);
    if (!c.is_object()) throw Error(tokenizer_config_json.string() + ": not a JSON object");
    impl->bos = token_string(c, "bos_token", tokenizer_config_json.string());
    impl->eos = token_string(c, "eos_token", tokenizer_config_json.string());
  }
  return Tokenizer(std::move(impl));
}

// Ids: the vocabulary's and the added tokens'; the largest one sizes the tables.
void Tokenizer::Impl::load_vocab(std::vector<std::pair<std::string, int64_t>> vocab,
                                 const json& added_json, const std::string& where) {
  // The tables below hold an entry per id up to the largest, so a sparse id sizes them: 2^22 is
  // 16x the largest vocabulary in use (Gemma's 262,144), and its tables take ~270 MB. (2^30
  // let one stray id ask for tens of GB; bench/fuzz.sh's tokenizer_json harness found it.)
  constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;
  int64_t max_id = -1;
  auto check_id = [&](int64_t id) {
    if (id < 0 || id > kMaxTokenId)
      throw Error(where + ": bad token id " + std::to_string(id) + " (ids run from 0 to " +
                  std::to_string(kMaxTokenId) + ")");
    max_id = std::max(max_id, id);
  };
  for (const auto& entry : vocab) check_id(entry.second);
  for (const auto& a : added_json) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string())
      throw Error(where + ": malformed added token " + a.dump());
    check_id(a["id"].get<int64_t>());
  }
  const auto n_ids = static_cast<size_t>(max_id + 1);
  id_to_bytes.resize(n_ids);
  id_to_text.resize(n_ids);
  special.assign(n_ids, false);
  vocab_by_bytes.init(&id_to_bytes, vocab.size());
  by_text.init(&id_to_text, vocab.size() + added_json.size());
  if (sentencepiece) {
    load_sentencepiece_vocab(std::move(vocab), where);
    return;
  }

  // The vocabulary is stored in GPT-2's byte-to-unicode alphabet; keep the raw bytes too.
  const std::array<uint32_t, 256> b2u = bytes_to_unicode();
  std::array<int16_t, 512> u2b;
  u2b.fill(-1);
  for (size_t b = 0; b < 256; ++b) u2b[b2u[b]] = static_cast<int16_t>(b);
  // A special token may also be a vocabulary entry of the same id, as DeepSeek-V3's are: its
  // text is not byte-level; load_added_tokens() fills the entry, as transformers does.
  std::unordered_map<std::string_view, int64_t> added_ids;
  for (const auto& a : added_json)
    added_ids.emplace(a["content"].get_ref<const std::string&>(), a["id"].get<int64_t>());
  for (auto& [tok, id64] : vocab) {
    const auto id = static_cast<size_t>(id64);
    std::string raw;
    raw.reserve(tok.size());
    bool byte_level = true;
    for (size_t i = 0; i < tok.size() && byte_level;) {
      const uint32_t cp = next_code_point(tok, i);
      byte_level = cp < u2b.size() && u2b[cp] >= 0;
      if (byte_level) raw.push_back(static_cast<char>(u2b[cp]));
    }
    if (!byte_level) {
      const auto as_added = added_ids.find(tok);
      if (as_added != added_ids.end() && as_added->second == id64) continue;
      throw Error(where + ": vocabulary entry '" + tok +
                  "' is not byte-level (only byte-level BPE is supported)");
    }
    if (!id_to_bytes[id].empty())
      throw Error(where + ": token id " + std::to_string(id) + " is used twice");
    id_to_text[id] = std::move(tok);
    id_to_bytes[id] = std::move(raw);
    vocab_by_bytes.insert(static_cast<int32_t>(id));
    by_text.insert(static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    const int32_t id = vocab_by_bytes.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (id < 0)
      throw Error(where + ": the vocabulary lacks the token of byte " + std::to_string(b));
    byte_ids[b] = id;
  }
}

void Tokenizer::Impl::load_merges(std::vector<std::pair<std::string, std::string>> list,
                                  const std::string& where) {
  merges.init(list.size());
  int32_t rank = 0;
  std::string joined;
  for (const auto& [a, b] : list) {
    joined.assign(a).append(b);
    const int32_t ia = by_text.find(a), ib = by_text.find(b), im = by_text.find(joined);
    if (ia < 0 || ib < 0 || im < 0)
      throw Error(where + ": merge '" + a + " " + b + "' names tokens outside the vocabulary");
    merges.insert(ia, ib, rank++, im);
  }
  if (sentencepiece) return;  // BPE starts from characters, not bytes
  byte_pair_merges.resize(256 * 256);
  for (size_t a = 0; a < 256; ++a) {
    for (size_t b = 0; b < 256; ++b) {
      const PairTable::Entry* e = merges.find(byte_ids[a], byte_ids[b]);
      byte_pair_merges[a * 256 + b] =
          e ? std::make_pair(e->rank, e->merged) : std::make_pair(kNoRank, int32_t{-1});
    }
  }
}

void Tokenizer::Impl::load_added_tokens(const json& added_json, const std::string& where) {
  for (size_t k = 0; k < added_json.size(); ++k) {
    const json& a = added_json[k];
    const std::string field = "added_tokens[" + std::to_string(k) + "].";
    AddedToken t;
    t.content = a["content"].get<std::string>();
    t.id = static_cast<int32_t>(a["id"].get<int64_t>());
    t.special = flag(a, "special", false, where, field);
    t.lstrip = flag(a, "lstrip", false, where, field);
    t.rstrip = flag(a, "rstrip", false, where, field);
    const auto id = static_cast<size_t>(t.id);
    id_to_bytes[id] = t.content;
    id_to_text[id] = t.content;
    special[id] = t.special;
    by_text.insert(t.id);
    if (!t.content.empty()) added.push_back(std::move(t));
  }
  if (added.size() > std::numeric_limits<uint16_t>::max())
    throw Error(where + ": too many added tokens");
  std::stable_sort(added.begin(), added.end(), [](const AddedToken& x, const AddedToken& y) {
    return x.content.size() > y.content.size();
  });
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string& c = added[i].content;
    AddedBucket& bucket = added_by_first_byte[static_cast<unsigned char>(c[0])];
    bucket.tokens.push_back(static_cast<uint16_t>(i));
    if (c.size() == 1) {
      bucket.single_byte = true;
    } else {
      bucket.second.set(static_cast<unsigned char>(c[1]));
    }
  }
}

// Normalizer: none, a Unicode normal form, or a Sequence of them (DeepSeek-V3's is empty).
void Tokenizer::Impl::load_normalizer(const json& norm, const std::string& where) {
  if (norm.is_null()) return;
  const std::string type = norm.is_object() ? text(norm, "type", where, "normalizer.") : "";
  if (type == "Sequence") {
    if (!norm.contains("normalizers") || !norm["normalizers"].is_array())
      throw Error(where + ": Sequence normalizer without 'normalizers'");
    for (const auto& n : norm["normalizers"]) load_normalizer(n, where);
    return;
  }
  const std::optional<NormalForm> form = normal_form_named(type);
  if (!form) throw Error(where + ": unsupported normalizer " + norm.dump().substr(0, 200));
  normal_forms.push_back(*form);
}

// Normalizer, pre-tokenizer and decoder: the supported ones, or an error naming what is not.
void Tokenizer::Impl::load_pipeline(const json& j, const std::string& where) {
  // Normalizer: SentencePiece's Replace / Prepend / Strip (sentencepiece.cc), or else none, a
  // Unicode normal form or a Sequence of them.
  if (sentencepiece && j.contains("normalizer") && !j["normalizer"].is_null())
    load_normalizers(j["normalizer"], where);
  else if (j.contains("normalizer"))
    load_normalizer(j["normalizer"], where);

  // Pre-tokenizer: Split(regex or string, Isolated), Digits, ByteLevel; alone or in a Sequence.
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  std::vector<json> steps;
  if (pre.is_object() && text(pre, "type", where, "pre_tokenizer.") == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
      throw Error(where + ": Sequence pre-tokenizer without 'pretokenizers'");
    for (const auto& p : pre["pretokenizers"]) steps.push_back(p);
  } else if (pre.is_object()) {
    steps.push_back(pre);
  } else if (!pre.is_null()) {
    throw Error(where + ": malformed pre_tokenizer");
  }
  for (size_t k = 0; k < steps.size(); ++k) {
    const json& p = steps[k];
    const std::string field = steps.size() > 1 || pre.contains("pretokenizers")
                                  ? "pre_tokenizer.pretokenizers[" + std::to_string(k) + "]."
                                  : "pre_tokenizer.";
    const std::string type = p.is_object() ? text(p, "type", where, field) : "";
    if (type == "Metaspace") {
      if (steps.size() > 1)
        throw Error(where + ": the Metaspace pre-tokenizer is supported alone, not in a Sequence");
      load_metaspace(p, field, where);
      continue;
    }
    if (type == "Split") {
      const std::string behavior = text(p, "behavior", where, field);
      if ((behavior != "Isolated" && behavior != "MergedWithPrevious") ||
          flag(p, "invert", false, where, field))
        throw Error(where + ": " + field + "behavior '" + behavior +
                    "' is not supported (only Split with behavior Isolated or " +
                    "MergedWithPrevious, not inverted, is)");
      split_merges_with_previous.push_back(behavior == "MergedWithPrevious");
      const json& pat = p.contains("pattern") ? p["pattern"] : json();
      if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
        splits.push_back(std::make_unique<Regex>(pat["Regex"].get<std::string>(), false, where));
      } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
        splits.push_back(std::make_unique<Regex>(pat["String"].get<std::string>(), true, where));
      } else {
        throw Error(where + ": Split pre-tokenizer without a Regex or String pattern");
      }
    } else if (type == "Digits") {
      split_merges_with_previous.push_back(false);
      const bool each = flag(p, "individual_digits", false, where, field);
      splits.push_back(std::make_unique<Regex>(each ? "\\p{N}" : "\\p{N}+", false, where));
    } else if (type == "ByteLevel") {
      if (flag(p, "add_prefix_space", false, where, field))
        throw Error(where + ": ByteLevel pre-tokenizer with add_prefix_space is not supported");
      if (flag(p, "use_regex", true, where, field)) {
        split_merges_with_previous.push_back(false);
        splits.push_back(std::make_unique<Regex>(kGpt2Pattern, false, where));
      }
    } else {
      throw Error(where + ": unsupported pre-tokenizer '" + (type.empty() ? p.dump() : type) + "'");
    }
  }
  if (sentencepiece) {
    load_decoders(j.contains("decoder") ? j["decoder"] : json(), where);
  } else if (j.contains("decoder") && !j["decoder"].is_null() &&
             (!j["decoder"].is_object() ||
              text(j["decoder"], "type", where, "decoder.") != "ByteLevel"))
    throw Error(where + ": unsupported decoder " + j["decoder"].dump().substr(0, 200));
}

}  // namespace blend
