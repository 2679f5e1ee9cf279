#include "gguf/gguf.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend {
namespace {

using nlohmann::json;

// The Split regexes of the tokenizers llama.cpp knows by these pre-tokenizer names.
constexpr std::string_view kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum class TokenType : int32_t { kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5 };

uint64_t align_up(uint64_t n, uint64_t a) {
  return (n + a - 1) / a * a;
}

size_t ggml_type_size(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return 4;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return 2;
  }
  return 0;
}

GgmlType ggml_type_of(DType d) {
  switch (d) {
    case DType::kF32:
      return GgmlType::kF32;
    case DType::kF16:
      return GgmlType::kF16;
    case DType::kBF16:
      return GgmlType::kBF16;
  }
  return GgmlType::kF32;
}

GgufFileType file_type_of(DType d) {
  switch (d) {
    case DType::kF32:
      return GgufFileType::kAllF32;
    case DType::kF16:
      return GgufFileType::kMostlyF16;
    case DType::kBF16:
      return GgufFileType::kMostlyBF16;
  }
  return GgufFileType::kAllF32;
}

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
}

// ---- metadata encoding -------------------------------------------------------------------

class KvBuffer {
 public:
  void put_u32(const std::string& key, uint32_t v) {
    begin(key, GgufType::kUint32);
    raw_u32(v);
  }
  void put_f32(const std::string& key, double v) {
    begin(key, GgufType::kFloat32);
    raw_f32(static_cast<float>(v));
  }
  void put_bool(const std::string& key, bool v) {
    begin(key, GgufType::kBool);
    buf_.push_back(v ? 1 : 0);
  }
  void put_string(const std::string& key, std::string_view v) {
    begin(key, GgufType::kString);
    raw_string(v);
  }
  void put_strings(const std::string& key, const std::vector<std::string>& v) {
    begin(key, GgufType::kArray);
    raw_u32(static_cast<uint32_t>(GgufType::kString));
    raw_u64(v.size());
    for (const auto& s : v) raw_string(s);
  }
  void put_i32s(const std::string& key, const std::vector<int32_t>& v) {
    begin(key, GgufType::kArray);
    raw_u32(static_cast<uint32_t>(GgufType::kInt32));
    raw_u64(v.size());
    for (int32_t x : v) raw_u32(static_cast<uint32_t>(x));
  }
  bool has(const std::string& key) const { return keys_.count(key) != 0; }
  size_t count() const { return keys_.size(); }
  const std::string& bytes() const { return buf_; }

 private:
  void begin(const std::string& key, GgufType type) {
    if (!keys_.insert(key).second) throw Error("gguf: duplicate metadata key '" + key + "'");
    raw_string(key);
    raw_u32(static_cast<uint32_t>(type));
  }
  void raw_u32(uint32_t v) {
    char b[4];
    std::memcpy(b, &v, 4);  // GGUF is little-endian, as is every host we build for
    buf_.append(b, 4);
  }
  void raw_u64(uint64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    buf_.append(b, 8);
  }
  void raw_f32(float v) { raw_u32(std::bit_cast<uint32_t>(v)); }
  void raw_string(std::string_view s) {
    raw_u64(s.size());
    buf_.append(s.data(), s.size());
  }

  std::string buf_;
  std::set<std::string> keys_;
};

// ---- tokenizer ---------------------------------------------------------------------------

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

// The pre-tokenizer name llama.cpp uses for this tokenizer.json (see the header).
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

  // Tokens in id order.
  const int64_t n = config.vocab_size;
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<int32_t> types(static_cast<size_t>(n), static_cast<int32_t>(TokenType::kUnused));
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
    types[id] = static_cast<int32_t>(TokenType::kNormal);
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
        types[id] = static_cast<int32_t>(TokenType::kControl);
      } else {
        content = replace_all(content, "\xE2\x96\x81", " ");  // pre-normalized user-defined spaces
        types[id] = static_cast<int32_t>(TokenType::kUserDefined);
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

// ---- tensors -----------------------------------------------------------------------------

struct PlannedTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> shape;  // Hugging Face order (outermost first)
  const TensorView* source = nullptr;
  std::vector<float> values;  // generated tensors
  int64_t permute_heads = 0;  // > 0: LlamaModel.permute over rows with this many heads
  uint64_t nbytes = 0;
  uint64_t offset = 0;

  int64_t numel() const {
    int64_t e = 1;
    for (int64_t d : shape) e *= d;
    return e;
  }
};

float load_element(const std::byte* p, DType t) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
  }
  return 0;
}

void store_element(std::byte* p, GgmlType t, float v) {
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(p, &v, 4);
      return;
    case GgmlType::kBF16: {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case GgmlType::kF16: {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
      return;
    }
  }
}

// Converts n elements; bytes are copied unchanged when the types agree.
void convert(const std::byte* src, DType st, std::byte* dst, GgmlType dt, size_t n) {
  if (ggml_type_of(st) == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  const size_t ss = dtype_size(st), ds = ggml_type_size(dt);
  for (size_t i = 0; i < n; ++i) store_element(dst + i * ds, dt, load_element(src + i * ss, st));
}

class OutFile {
 public:
  explicit OutFile(const std::filesystem::path& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) throw Error(path.string() + ": cannot create: " + std::strerror(errno));
  }
  ~OutFile() {
    if (f_) std::fclose(f_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n)
      throw Error(path_.string() + ": write failed: " + std::strerror(errno));
    pos_ += n;
  }
  void pad_to(uint64_t alignment) {
    static const char zeros[64] = {};
    uint64_t pad = align_up(pos_, alignment) - pos_;
    while (pad) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(pad, sizeof zeros));
      write(zeros, k);
      pad -= k;
    }
  }
  uint64_t pos() const { return pos_; }
  void close() {
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) throw Error(path_.string() + ": close failed: " + std::strerror(errno));
  }

 private:
  std::filesystem::path path_;
  FILE* f_ = nullptr;
  uint64_t pos_ = 0;
};

// Drops the (clean, file-backed) pages of a tensor that has been written, so exporting a
// multi-GB checkpoint does not keep all of it resident.
void release_pages(const TensorView& v) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(v.data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(v.data) + v.nbytes + page - 1) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void write_tensor_data(OutFile& out, const PlannedTensor& t) {
  const size_t ds = ggml_type_size(t.type);
  constexpr size_t kChunkBytes = 8u << 20;
  std::vector<std::byte> buf;
  if (!t.source) {
    buf.resize(t.values.size() * ds);
    for (size_t i = 0; i < t.values.size(); ++i)
      store_element(buf.data() + i * ds, t.type, t.values[i]);
    out.write(buf.data(), buf.size());
    return;
  }
  const TensorView& src = *t.source;
  const size_t ss = dtype_size(src.dtype);
  const int64_t numel = t.numel();
  if (t.permute_heads == 0) {
    const size_t chunk = std::max<size_t>(1, kChunkBytes / ds);
    buf.resize(std::min<size_t>(chunk, static_cast<size_t>(numel)) * ds);
    for (int64_t i = 0; i < numel; i += static_cast<int64_t>(chunk)) {
      const size_t k = static_cast<size_t>(std::min<int64_t>(chunk, numel - i));
      convert(src.data + i * ss, src.dtype, buf.data(), t.type, k);
      out.write(buf.data(), k * ds);
    }
    return;
  }
  const int64_t rows = t.shape[0];
  const int64_t cols = numel / rows;
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / (static_cast<size_t>(cols) * ds)));
  buf.resize(static_cast<size_t>(std::min(rows, rows_per_chunk) * cols) * ds);
  for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
    const int64_t r1 = std::min(rows, r0 + rows_per_chunk);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t sr = gguf_permuted_source_row(r, t.permute_heads, rows);
      convert(src.data + static_cast<size_t>(sr * cols) * ss, src.dtype,
              buf.data() + static_cast<size_t>((r - r0) * cols) * ds, t.type,
              static_cast<size_t>(cols));
    }
    out.write(buf.data(), static_cast<size_t>((r1 - r0) * cols) * ds);
  }
}

std::string gguf_tensor_name(const std::string& hf, int64_t& layer) {
  layer = -1;
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string prefix = "model.layers.";
  if (hf.starts_with(prefix)) {
    const size_t dot = hf.find('.', prefix.size());
    layer = std::stoll(hf.substr(prefix.size(), dot - prefix.size()));
    const std::string rest = hf.substr(dot + 1);
    static const std::pair<const char*, const char*> kMap[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    for (const auto& [from, to] : kMap)
      if (rest == from) return "blk." + std::to_string(layer) + "." + to;
  }
  throw Error("gguf: no GGUF name for tensor '" + hf + "'");
}

}  // namespace

// ---- public helpers ----------------------------------------------------------------------

int64_t gguf_permuted_source_row(int64_t row, int64_t n_head, int64_t rows) {
  // weights.reshape(n_head, 2, rows/n_head/2, ...).swapaxes(1, 2).reshape(rows, ...)
  const int64_t hd = rows / n_head, half = hd / 2;
  const int64_t h = row / hd, r = row % hd;
  return h * hd + (r % 2) * half + r / 2;
}

std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  if (c.rope_scaling.type != "llama3") return {};
  const int64_t dim = c.head_dim;
  const float base = static_cast<float>(c.rope_theta);
  const float factor = static_cast<float>(c.rope_scaling.factor);
  const float low = static_cast<float>(c.rope_scaling.low_freq_factor);
  const float high = static_cast<float>(c.rope_scaling.high_freq_factor);
  const float old_ctx = static_cast<float>(c.rope_scaling.original_max_position_embeddings);
  const float low_wavelen =
      static_cast<float>(static_cast<double>(c.rope_scaling.original_max_position_embeddings) /
                         c.rope_scaling.low_freq_factor);
  const float high_wavelen =
      static_cast<float>(static_cast<double>(c.rope_scaling.original_max_position_embeddings) /
                         c.rope_scaling.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  std::vector<float> out;
  for (int64_t i = 0; i < dim; i += 2) {
    const float e = static_cast<float>(i) / static_cast<float>(dim);
    const float freq = 1.0f / std::pow(base, e);
    const float wavelen = two_pi / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(factor);
    } else {
      const float smooth = (old_ctx / wavelen - low) / (high - low);
      out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return out;
}

size_t GgufValue::array_size() const {
  if (type != GgufType::kArray) return 0;
  return std::max({strings.size(), ints.size(), floats.size()});
}

const GgufValue* GgufFile::find(const std::string& key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

const GgufValue& GgufFile::at(const std::string& key) const {
  if (const GgufValue* v = find(key)) return *v;
  throw Error("gguf: no metadata key '" + key + "'");
}

const GgufTensorInfo* GgufFile::tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// ---- export ------------------------------------------------------------------------------

GgufExportSummary export_gguf(const std::filesystem::path& model_dir,
                              const std::filesystem::path& out_file,
                              const GgufExportOptions& options) {
  const ModelConfig config = ModelConfig::from_dir(model_dir);
  const json raw_config = read_json(model_dir / "config.json");
  const TensorStore store = TensorStore::open_dir(model_dir);
  const DType src_dtype = check_tensors(config, store);
  const DType dtype = options.dtype.value_or(src_dtype);

  const bool qwen2 = config.architecture == "Qwen2ForCausalLM";
  const std::string arch = qwen2 ? "qwen2" : "llama";
  const bool permute = !qwen2;  // LlamaModel.undo_permute; Qwen2 uses NEOX RoPE in llama.cpp
  std::string name = options.name;
  if (name.empty()) {
    name = std::filesystem::absolute(model_dir).lexically_normal().filename().string();
    if (name.empty())
      name =
          std::filesystem::absolute(model_dir).lexically_normal().parent_path().filename().string();
  }

  // Tensors: rope_freqs first (generate_extra_tensors), then the checkpoint's in HF order.
  std::vector<PlannedTensor> plan;
  if (std::vector<float> f = llama3_rope_factors(config); !f.empty()) {
    if (qwen2) throw Error("gguf: llama3 RoPE scaling on a Qwen2 model is not supported");
    PlannedTensor t;
    t.name = "rope_freqs.weight";
    t.shape = {static_cast<int64_t>(f.size())};
    t.values = std::move(f);
    plan.push_back(std::move(t));
  }
  for (const TensorSpec& spec : llama_tensor_specs(config)) {
    PlannedTensor t;
    int64_t layer = -1;
    t.name = gguf_tensor_name(spec.name, layer);
    t.shape = spec.shape;
    t.source = &store.get(spec.name, spec.shape);
    const bool one_d = spec.shape.size() <= 1 || t.name.ends_with("_norm.weight");
    t.type = one_d ? GgmlType::kF32 : ggml_type_of(dtype);
    if (permute) {
      if (spec.name.ends_with("q_proj.weight") || spec.name.ends_with("q_proj.bias"))
        t.permute_heads = config.num_heads;
      if (spec.name.ends_with("k_proj.weight") || spec.name.ends_with("k_proj.bias"))
        t.permute_heads = config.num_kv_heads;
    }
    plan.push_back(std::move(t));
  }
  uint64_t offset = 0;
  for (auto& t : plan) {
    t.nbytes = static_cast<uint64_t>(t.numel()) * ggml_type_size(t.type);
    t.offset = offset;
    offset = align_up(offset + t.nbytes, kGgufAlignment);
  }

  // Metadata, in the converter's order.
  KvBuffer kv;
  kv.put_string("general.architecture", arch);
  kv.put_string("general.type", "model");
  kv.put_string("general.name", name);
  kv.put_u32(arch + ".block_count", static_cast<uint32_t>(config.num_layers));
  kv.put_u32(arch + ".context_length", static_cast<uint32_t>(config.max_position_embeddings));
  kv.put_u32(arch + ".embedding_length", static_cast<uint32_t>(config.hidden_size));
  kv.put_u32(arch + ".feed_forward_length", static_cast<uint32_t>(config.intermediate_size));
  kv.put_u32(arch + ".attention.head_count", static_cast<uint32_t>(config.num_heads));
  kv.put_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(config.num_kv_heads));
  if (config.rope_scaling.type == "linear") {
    kv.put_string(arch + ".rope.scaling.type", "linear");
    kv.put_f32(arch + ".rope.scaling.factor", config.rope_scaling.factor);
  }
  kv.put_f32(arch + ".rope.freq_base", config.rope_theta);
  kv.put_f32(arch + ".attention.layer_norm_rms_epsilon", config.rms_norm_eps);
  if (raw_config.contains("head_dim") || config.head_dim * config.num_heads != config.hidden_size) {
    kv.put_u32(arch + ".attention.key_length", static_cast<uint32_t>(config.head_dim));
    kv.put_u32(arch + ".attention.value_length", static_cast<uint32_t>(config.head_dim));
  }
  kv.put_u32("general.file_type", static_cast<uint32_t>(file_type_of(dtype)));
  if (!qwen2) {
    kv.put_u32(arch + ".vocab_size", static_cast<uint32_t>(config.vocab_size));
    kv.put_u32(arch + ".rope.dimension_count", static_cast<uint32_t>(config.head_dim));
  }
  kv.put_u32("general.quantization_version", 2);
  kv.put_u32("general.alignment", kGgufAlignment);
  add_tokenizer_metadata(kv, model_dir, config, raw_config);

  // Tensor infos.
  std::string ti;
  auto put_u32 = [&](uint32_t v) { ti.append(reinterpret_cast<const char*>(&v), 4); };
  auto put_u64 = [&](uint64_t v) { ti.append(reinterpret_cast<const char*>(&v), 8); };
  for (const auto& t : plan) {
    put_u64(t.name.size());
    ti += t.name;
    put_u32(static_cast<uint32_t>(t.shape.size()));
    for (size_t j = t.shape.size(); j-- > 0;) put_u64(static_cast<uint64_t>(t.shape[j]));
    put_u32(static_cast<uint32_t>(t.type));
    put_u64(t.offset);
  }

  // Write to a temporary file next to the target, then rename.
  if (out_file.has_parent_path()) std::filesystem::create_directories(out_file.parent_path());
  const std::filesystem::path tmp = out_file.string() + ".tmp";
  uint64_t file_bytes = 0;
  try {
    OutFile out(tmp);
    const uint32_t magic = kGgufMagic, version = kGgufVersion;
    const uint64_t n_tensors = plan.size(), n_kv = kv.count();
    out.write(&magic, 4);
    out.write(&version, 4);
    out.write(&n_tensors, 8);
    out.write(&n_kv, 8);
    out.write(kv.bytes().data(), kv.bytes().size());
    out.write(ti.data(), ti.size());
    out.pad_to(kGgufAlignment);
    const uint64_t data_start = out.pos();
    for (const auto& t : plan) {
      if (out.pos() != data_start + t.offset) throw Error("gguf: internal offset mismatch");
      write_tensor_data(out, t);
      if (t.source) release_pages(*t.source);
      out.pad_to(kGgufAlignment);
    }
    file_bytes = out.pos();
    out.close();
    std::filesystem::rename(tmp, out_file);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
  return {arch, dtype, plan.size(), kv.count(), file_bytes};
}

// ---- reader ------------------------------------------------------------------------------

namespace {

class Reader {
 public:
  explicit Reader(const std::filesystem::path& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw Error(path.string() + ": cannot open");
    in_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(in_.tellg());
    in_.seekg(0);
  }
  uint64_t size() const { return size_; }
  uint64_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(path_.string() + ": " + what + " (at byte " + std::to_string(pos_) + ")");
  }
  void read(void* p, uint64_t n) {
    if (n > size_ - pos_) fail("truncated GGUF file");
    in_.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
    if (!in_) fail("read error");
    pos_ += n;
  }
  template <typename T>
  T get() {
    T v;
    read(&v, sizeof v);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (n > size_ - pos_) fail("string length " + std::to_string(n) + " beyond end of file");
    std::string s(n, '\0');
    read(s.data(), n);
    return s;
  }

 private:
  std::filesystem::path path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

// Reads one scalar of `t` into (u, i, f, b).
void read_scalar(Reader& r, GgufType t, GgufValue& v) {
  switch (t) {
    case GgufType::kUint8:
      v.u = r.get<uint8_t>();
      v.i = static_cast<int64_t>(v.u);
      return;
    case GgufType::kInt8:
      v.i = r.get<int8_t>();
      v.u = static_cast<uint64_t>(v.i);
      return;
    case GgufType::kUint16:
      v.u = r.get<uint16_t>();
      v.i = static_cast<int64_t>(v.u);
      return;
    case GgufType::kInt16:
      v.i = r.get<int16_t>();
      v.u = static_cast<uint64_t>(v.i);
      return;
    case GgufType::kUint32:
      v.u = r.get<uint32_t>();
      v.i = static_cast<int64_t>(v.u);
      return;
    case GgufType::kInt32:
      v.i = r.get<int32_t>();
      v.u = static_cast<uint64_t>(v.i);
      return;
    case GgufType::kUint64:
      v.u = r.get<uint64_t>();
      v.i = static_cast<int64_t>(v.u);
      return;
    case GgufType::kInt64:
      v.i = r.get<int64_t>();
      v.u = static_cast<uint64_t>(v.i);
      return;
    case GgufType::kFloat32:
      v.f = r.get<float>();
      return;
    case GgufType::kFloat64:
      v.f = r.get<double>();
      return;
    case GgufType::kBool: {
      const uint8_t b = r.get<uint8_t>();
      if (b > 1) r.fail("bool value " + std::to_string(b));
      v.b = b != 0;
      v.u = b;
      v.i = b;
      return;
    }
    default:
      r.fail("unknown metadata value type " + std::to_string(static_cast<uint32_t>(t)));
  }
}

GgufType read_type(Reader& r) {
  const uint32_t t = r.get<uint32_t>();
  if (t > static_cast<uint32_t>(GgufType::kFloat64))
    r.fail("unknown metadata value type " + std::to_string(t));
  return static_cast<GgufType>(t);
}

}  // namespace

GgufFile read_gguf(const std::filesystem::path& path) {
  Reader r(path);
  GgufFile g;
  g.file_size = r.size();
  if (r.size() < 24) r.fail("too short for a GGUF header");
  if (r.get<uint32_t>() != kGgufMagic) r.fail("not a GGUF file (bad magic)");
  g.version = r.get<uint32_t>();
  if (g.version != 2 && g.version != 3)
    r.fail("unsupported GGUF version " + std::to_string(g.version));
  const uint64_t n_tensors = r.get<uint64_t>();
  const uint64_t n_kv = r.get<uint64_t>();
  // Every entry takes at least 8 bytes of key length plus 4 of type: bound the counts by size.
  if (n_kv > r.size() / 12 || n_tensors > r.size() / 24)
    r.fail("implausible tensor/metadata count");
  std::set<std::string> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.str();
    if (!keys.insert(key).second) r.fail("duplicate metadata key '" + key + "'");
    GgufValue v;
    v.type = read_type(r);
    if (v.type == GgufType::kString) {
      v.s = r.str();
    } else if (v.type == GgufType::kArray) {
      v.array_type = read_type(r);
      const uint64_t n = r.get<uint64_t>();
      if (v.array_type == GgufType::kArray) r.fail("nested arrays are not supported");
      const uint64_t min_size = v.array_type == GgufType::kString ? 8 : scalar_size(v.array_type);
      if (n > (r.size() - r.pos()) / std::max<uint64_t>(1, min_size))
        r.fail("array of " + std::to_string(n) + " elements beyond end of file");
      for (uint64_t j = 0; j < n; ++j) {
        if (v.array_type == GgufType::kString) {
          v.strings.push_back(r.str());
        } else {
          GgufValue e;
          read_scalar(r, v.array_type, e);
          if (v.array_type == GgufType::kFloat32 || v.array_type == GgufType::kFloat64)
            v.floats.push_back(e.f);
          else
            v.ints.push_back(e.i);
        }
      }
    } else {
      read_scalar(r, v.type, v);
    }
    g.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = g.find("general.alignment")) {
    if (a->type != GgufType::kUint32 || a->u == 0 || (a->u & (a->u - 1)) != 0)
      r.fail("general.alignment must be a power-of-two uint32");
    g.alignment = a->u;
  }
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    t.name = r.str();
    const uint32_t n_dims = r.get<uint32_t>();
    if (n_dims == 0 || n_dims > 4)
      r.fail("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dims");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r.get<uint64_t>();
      if (ne == 0 || numel > std::numeric_limits<uint64_t>::max() / ne)
        r.fail("tensor '" + t.name + "' has a bad shape");
      numel *= ne;
      t.ne.push_back(ne);
    }
    t.type = r.get<uint32_t>();
    t.offset = r.get<uint64_t>();
    if (t.offset % g.alignment != 0) r.fail("tensor '" + t.name + "' offset is not aligned");
    switch (t.type) {
      case static_cast<uint32_t>(GgmlType::kF32):
        t.nbytes = numel * 4;
        break;
      case static_cast<uint32_t>(GgmlType::kF16):
      case static_cast<uint32_t>(GgmlType::kBF16):
        t.nbytes = numel * 2;
        break;
      default:
        t.nbytes = 0;
    }
    g.tensors.push_back(std::move(t));
  }
  g.data_offset = align_up(r.pos(), g.alignment);
  for (const auto& t : g.tensors) {
    if (t.offset > g.file_size || t.nbytes > g.file_size - t.offset ||
        g.data_offset > g.file_size - t.offset - t.nbytes)
      r.fail("tensor '" + t.name + "' data lies beyond the end of the file");
  }
  return g;
}

}  // namespace blend
