#include "gguf/import.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/quant.h"
#include "gguf/export.h"
#include "gguf/gguf.h"
#include "gguf/tensor_data.h"
#include "gguf/tokenizer_metadata.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend {

using gguf_internal::GgufTokenType;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Bumped whenever what import_gguf writes changes, so older imports in the cache are not reused.
constexpr int kImportVersion = 3;  // 2: Q8_0 matrices kept as Q8_0; 3: Q5_0, Q4_K, Q6_K too

// ---- metadata ------------------------------------------------------------------------------

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kUint64:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

class Metadata {
 public:
  Metadata(const GgufFile& g, const fs::path& file) : g_(g), file_(file.string()) {}

  [[noreturn]] void fail(const std::string& what) const { throw Error(file_ + ": " + what); }

  const GgufValue* find(const std::string& key) const { return g_.find(key); }

  std::optional<int64_t> find_int(const std::string& key) const {
    const GgufValue* v = g_.find(key);
    if (!v) return std::nullopt;
    if (v->type == GgufType::kArray)
      fail(key + " is an array (per-layer values are not supported)");
    if (!is_integer(v->type) || v->i < 0) fail(key + " must be a non-negative integer");
    return v->i;
  }
  int64_t get_int(const std::string& key) const {
    if (std::optional<int64_t> v = find_int(key)) return *v;
    fail("no metadata key '" + key + "'");
  }
  // A float32 value as the shortest decimal that reads back as it: the number the converter
  // was given (1e-05, not 9.99999974737875e-06), which computes the same float32 model.
  std::optional<double> find_float(const std::string& key) const {
    const GgufValue* v = g_.find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::kFloat32 && v->type != GgufType::kFloat64)
      fail(key + " must be a float");
    if (v->type == GgufType::kFloat64) return v->f;
    const float f = static_cast<float>(v->f);
    for (int digits = 1; digits <= 9; ++digits) {
      char text[32];
      std::snprintf(text, sizeof text, "%.*g", digits, v->f);
      const double shortest = std::strtod(text, nullptr);
      if (static_cast<float>(shortest) == f) return shortest;
    }
    return v->f;
  }
  std::optional<std::string> find_string(const std::string& key) const {
    const GgufValue* v = g_.find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::kString) fail(key + " must be a string");
    return v->s;
  }
  std::optional<bool> find_bool(const std::string& key) const {
    const GgufValue* v = g_.find(key);
    if (!v) return std::nullopt;
    if (v->type != GgufType::kBool) fail(key + " must be a bool");
    return v->b;
  }

 private:
  const GgufFile& g_;
  std::string file_;
};

struct Architecture {
  const char* gguf;
  const char* hf;
  const char* model_type;
  bool permuted_qk;  // the converter permuted q/k rows to GGML's interleaved RoPE (Llama only)
};
constexpr Architecture kArchitectures[] = {
    {"llama", "LlamaForCausalLM", "llama", true},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", false},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", false},
};

// The {arch}.* keys import_gguf reads. Any other key of the architecture describes something
// the model does and blend would not: refused (config_of).
constexpr const char* kArchitectureKeys[] = {
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.scaling.type",
    "rope.scaling.factor",
    // Descriptive for linear scaling: the length the model was trained at before it.
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "vocab_size",
};

// The rope_scaling "llama3" whose factors (llama3_rope_factors) are `factors` bit for bit, over
// the parameters Meta's checkpoints use and a grid around them; nullopt when none matches.
std::optional<RopeScaling> llama3_scaling_of(ModelConfig config,
                                             const std::vector<float>& factors) {
  if (factors.empty()) return std::nullopt;
  RopeScaling s;
  s.type = "llama3";
  s.factor = *std::max_element(factors.begin(), factors.end());
  for (const int64_t original : {8192, 4096, 2048, 16384, 32768, 65536, 131072})
    for (const double high : {4.0, 2.0, 8.0})
      for (const double low : {1.0, 0.5, 2.0}) {
        if (low >= high) continue;
        s.low_freq_factor = low;
        s.high_freq_factor = high;
        s.original_max_position_embeddings = original;
        config.rope_scaling = s;
        if (llama3_rope_factors(config) == factors) return s;
      }
  return std::nullopt;
}

// ---- the mapped file -----------------------------------------------------------------------

class MappedFile {
 public:
  explicit MappedFile(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path.string() + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(path.string() + ": not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) map_ = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map_ == MAP_FAILED) throw Error(path.string() + ": cannot map: " + std::strerror(errno));
  }
  ~MappedFile() {
    if (map_ && map_ != MAP_FAILED) ::munmap(map_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::byte* data() const { return static_cast<const std::byte*>(map_); }
  size_t size() const { return size_; }

 private:
  void* map_ = nullptr;
  size_t size_ = 0;
};

// ---- tensors -------------------------------------------------------------------------------

// One Hugging Face tensor read from its GGUF tensor: HF row r is GGUF row source_row[r] (or r),
// each `cols` elements (the GGUF ne[0]); 1-D tensors are one row.
struct SourceTensor {
  std::string hf_name;
  std::vector<int64_t> shape;  // Hugging Face order
  const GgufTensorInfo* info = nullptr;
  const std::byte* data = nullptr;
  GgmlBlockLayout layout;
  int64_t rows = 1, cols = 1;
  std::vector<int64_t> source_row;  // empty: identity (rows of a 2-D tensor, elements of a 1-D)

  int64_t numel() const { return rows * cols; }
  uint64_t row_bytes() const {
    return static_cast<uint64_t>(cols) / layout.block_elems * layout.block_bytes;
  }
  // Elements [first, first + count) of the Hugging Face tensor, dequantized.
  void read(int64_t first, int64_t count, float* out) const {
    std::vector<float> row(static_cast<size_t>(cols));
    if (shape.size() == 1 && !source_row.empty()) {  // a permuted bias: whole, then gathered
      dequantize_row(info->type, data, row.data(), cols);
      for (int64_t i = 0; i < count; ++i) out[i] = row[static_cast<size_t>(source_row[first + i])];
      return;
    }
    int64_t done = 0;
    while (done < count) {
      const int64_t e = first + done, r = e / cols, c = e % cols;
      const int64_t src = source_row.empty() ? r : source_row[static_cast<size_t>(r)];
      const int64_t take = std::min(count - done, cols - c);
      if (c == 0 && take == cols) {
        dequantize_row(info->type, data + src * row_bytes(), out + done, cols);
      } else {
        dequantize_row(info->type, data + src * row_bytes(), row.data(), cols);
        std::memcpy(out + done, row.data() + c, static_cast<size_t>(take) * sizeof(float));
      }
      done += take;
    }
  }
};

std::vector<int64_t> reversed_shape(const GgufTensorInfo& t) {
  return {t.ne.rbegin(), t.ne.rend()};
}

// Whether every element of a 1-D float tensor survives a round trip through `dtype`.
bool representable(const SourceTensor& t, DType dtype) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  t.read(0, t.numel(), v.data());
  for (float x : v) {
    std::byte b[4];
    store_float(x, dtype, b);
    uint16_t h;
    std::memcpy(&h, b, 2);
    const float back = dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    if (std::memcmp(&back, &x, 4) != 0) return false;
  }
  return true;
}

// ---- tokenizer -----------------------------------------------------------------------------

// Control tokens llama.cpp ends generation at beyond the eos/eot/eom ids (llama-vocab's
// end-of-generation set for these vocabularies).
constexpr const char* kEndOfGenerationTokens[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>",
};

struct TokenizerFiles {
  json tokenizer;
  json tokenizer_config;
  std::optional<int32_t> bos;
  std::vector<int32_t> end_of_generation;
};

TokenizerFiles tokenizer_of(const Metadata& meta, int64_t context_length) {
  const std::string model = meta.find_string("tokenizer.ggml.model").value_or("");
  if (model != "gpt2")
    meta.fail("tokenizer.ggml.model '" + model +
              "' is not supported: only byte-level BPE ('gpt2') vocabularies are read from GGUF "
              "(SentencePiece 'llama' vocabularies of Llama 2, Mistral v0.1, Gemma and Phi-3 "
              "are not yet)");
  const std::string pre = meta.find_string("tokenizer.ggml.pre").value_or("default");
  const GgufValue* tokens_v = meta.find("tokenizer.ggml.tokens");
  if (!tokens_v || tokens_v->type != GgufType::kArray ||
      tokens_v->array_type != GgufType::kString || tokens_v->strings.empty())
    meta.fail("tokenizer.ggml.tokens must be a non-empty array of strings");
  const std::vector<std::string>& tokens = tokens_v->strings;
  const size_t n = tokens.size();
  std::vector<int64_t> types(n, static_cast<int64_t>(GgufTokenType::kNormal));
  if (const GgufValue* t = meta.find("tokenizer.ggml.token_type")) {
    if (t->type != GgufType::kArray || t->ints.size() != n)
      meta.fail("tokenizer.ggml.token_type must be an integer array of one type per token");
    types = t->ints;
  }
  const GgufValue* merges_v = meta.find("tokenizer.ggml.merges");
  if (!merges_v || merges_v->type != GgufType::kArray ||
      merges_v->array_type != GgufType::kString || merges_v->strings.empty())
    meta.fail("tokenizer.ggml.merges must be a non-empty array of strings");
  for (const char* key :
       {"tokenizer.ggml.scores", "tokenizer.ggml.add_space_prefix",
        "tokenizer.ggml.remove_extra_whitespaces", "tokenizer.ggml.precompiled_charsmap"})
    if (meta.find(key)) meta.fail(std::string(key) + " is not supported in a 'gpt2' vocabulary");

  json tok = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}};
  json split = {{"type", "Split"}, {"behavior", "Isolated"}, {"invert", false}};
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", false}};
  bool ignore_merges = false;
  tok["normalizer"] = nullptr;
  if (pre == "llama-bpe") {
    split["pattern"] = {{"Regex", std::string(gguf_internal::kLlama3Regex)}};
    tok["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
    ignore_merges = true;  // Meta's tokenizer.json; llama.cpp's llama-bpe does the same
  } else if (pre == "qwen2") {
    split["pattern"] = {{"Regex", std::string(gguf_internal::kQwen2Regex)}};
    tok["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}};
    tok["normalizer"] = {{"type", "NFC"}};  // Qwen's tokenizer.json; GGUF cannot say so
  } else if (pre == "gpt-2") {
    byte_level["use_regex"] = true;
    tok["pre_tokenizer"] = byte_level;
  } else {
    meta.fail("tokenizer.ggml.pre '" + pre +
              "' is not supported (supported pre-tokenizers: llama-bpe, qwen2, gpt-2)");
  }

  json vocab = json::object();
  json added = json::array();
  for (size_t id = 0; id < n; ++id) {
    const int64_t type = types[id];
    if (type == static_cast<int64_t>(GgufTokenType::kUnused)) continue;
    if (type == static_cast<int64_t>(GgufTokenType::kControl) ||
        type == static_cast<int64_t>(GgufTokenType::kUserDefined)) {
      const bool special = type == static_cast<int64_t>(GgufTokenType::kControl);
      added.push_back({{"id", id},
                       {"content", tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", special}});
      continue;
    }
    if (type != static_cast<int64_t>(GgufTokenType::kNormal) &&
        type != static_cast<int64_t>(GgufTokenType::kUnknown))
      meta.fail("token " + std::to_string(id) + " has token type " + std::to_string(type) +
                ", which a 'gpt2' vocabulary does not use");
    if (vocab.contains(tokens[id]))
      meta.fail("token '" + tokens[id] + "' appears twice (ids " +
                std::to_string(vocab[tokens[id]].get<int64_t>()) + " and " + std::to_string(id) +
                ")");
    vocab[tokens[id]] = id;
  }
  tok["added_tokens"] = std::move(added);
  tok["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};

  TokenizerFiles out;
  auto id_of = [&](const char* what) -> std::optional<int32_t> {
    const std::optional<int64_t> id = meta.find_int(std::string("tokenizer.ggml.") + what);
    if (!id) return std::nullopt;
    if (*id >= static_cast<int64_t>(n))
      meta.fail(std::string("tokenizer.ggml.") + what + " " + std::to_string(*id) +
                " is outside the vocabulary of " + std::to_string(n));
    return static_cast<int32_t>(*id);
  };
  const std::optional<int32_t> bos = id_of("bos_token_id"), eos = id_of("eos_token_id");
  const bool add_bos = meta.find_bool("tokenizer.ggml.add_bos_token").value_or(false);
  const bool add_eos = meta.find_bool("tokenizer.ggml.add_eos_token").value_or(false);
  if ((add_bos && !bos) || (add_eos && !eos))
    meta.fail("add_bos_token/add_eos_token is set but the token's id is not");
  json tcfg = {{"tokenizer_class", "PreTrainedTokenizerFast"},
               {"clean_up_tokenization_spaces", false},  // llama.cpp decodes without it
               {"model_max_length", context_length},
               {"add_bos_token", add_bos},
               {"add_eos_token", add_eos}};
  if (bos) tcfg["bos_token"] = tokens[static_cast<size_t>(*bos)];
  if (eos) tcfg["eos_token"] = tokens[static_cast<size_t>(*eos)];
  for (const char* what : {"unk", "pad"})
    if (std::optional<int32_t> id = id_of((std::string(what) + "_token_id").c_str()))
      tcfg[std::string(what) + "_token"] = tokens[static_cast<size_t>(*id)];
  if (add_bos || add_eos) {
    json single = json::array(), pair = json::array(), specials = json::object();
    auto special = [&](int32_t id) {
      const std::string& text = tokens[static_cast<size_t>(id)];
      specials[text] = {{"id", text}, {"ids", {id}}, {"tokens", {text}}};
      return json{{"SpecialToken", {{"id", text}, {"type_id", 0}}}};
    };
    if (add_bos) single.push_back(special(*bos));
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (add_eos) single.push_back(special(*eos));
    pair = single;
    if (add_bos) pair.push_back(special(*bos));
    pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
    if (add_eos) pair.push_back(special(*eos));
    tok["post_processor"] = {{"type", "TemplateProcessing"},
                             {"single", single},
                             {"pair", pair},
                             {"special_tokens", specials}};
  } else {
    tok["post_processor"] = nullptr;
  }
  tok["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", ignore_merges},
                  {"vocab", std::move(vocab)},
                  {"merges", merges_v->strings}};

  // Chat templates: the default one, and named ones as tokenizer_config.json's list.
  if (std::optional<std::string> t = meta.find_string("tokenizer.chat_template"))
    tcfg["chat_template"] = *t;
  if (const GgufValue* names = meta.find("tokenizer.chat_templates")) {
    if (names->type != GgufType::kArray || names->array_type != GgufType::kString)
      meta.fail("tokenizer.chat_templates must be an array of strings");
    json list = json::array();
    if (tcfg.contains("chat_template"))
      list.push_back({{"name", "default"}, {"template", tcfg["chat_template"]}});
    for (const std::string& name : names->strings) {
      const std::optional<std::string> t = meta.find_string("tokenizer.chat_template." + name);
      if (!t) meta.fail("tokenizer.chat_templates names '" + name + "' without its template");
      list.push_back({{"name", name}, {"template", *t}});
    }
    tcfg["chat_template"] = std::move(list);
  }

  std::set<int32_t> eog;
  for (const char* what : {"eos_token_id", "eot_token_id", "eom_token_id"})
    if (std::optional<int32_t> id = id_of(what)) eog.insert(*id);
  for (size_t id = 0; id < n; ++id)
    if (types[id] == static_cast<int64_t>(GgufTokenType::kControl))
      for (const char* text : kEndOfGenerationTokens)
        if (tokens[id] == text) eog.insert(static_cast<int32_t>(id));
  out.tokenizer = std::move(tok);
  out.tokenizer_config = std::move(tcfg);
  out.bos = bos;
  // eos first (config.json's first id is the one transformers pads with).
  if (eos) out.end_of_generation.push_back(*eos);
  for (int32_t id : eog)
    if (!eos || id != *eos) out.end_of_generation.push_back(id);
  return out;
}

// ---- config --------------------------------------------------------------------------------

const Architecture& architecture_of(const Metadata& meta) {
  const std::string arch = meta.find_string("general.architecture").value_or("");
  for (const Architecture& a : kArchitectures)
    if (arch == a.gguf) return a;
  meta.fail("general.architecture '" + arch +
            "' is not supported (supported GGUF architectures: llama, qwen2, qwen3)");
}

ModelConfig config_of(const GgufFile& g, const Metadata& meta, const Architecture& arch,
                      const std::vector<float>& rope_freqs) {
  const std::string p = std::string(arch.gguf) + ".";
  for (const auto& [key, value] : g.metadata) {
    if (!key.starts_with(p)) continue;
    const std::string rest = key.substr(p.size());
    if (std::find_if(std::begin(kArchitectureKeys), std::end(kArchitectureKeys),
                     [&](const char* k) { return rest == k; }) == std::end(kArchitectureKeys))
      meta.fail("metadata key '" + key + "' is not supported: the model it describes is not " +
                "the " + arch.gguf + " model blend computes");
  }
  if (const std::optional<int64_t> splits = meta.find_int("split.count"); splits && *splits > 1)
    meta.fail("a split GGUF file (" + std::to_string(*splits) +
              " parts) is not supported; merge it first (llama-gguf-split --merge)");
  ModelConfig c;
  c.architecture = arch.hf;
  c.model_type = arch.model_type;
  c.num_layers = meta.get_int(p + "block_count");
  c.hidden_size = meta.get_int(p + "embedding_length");
  c.intermediate_size = meta.get_int(p + "feed_forward_length");
  c.num_heads = meta.get_int(p + "attention.head_count");
  c.num_kv_heads = meta.find_int(p + "attention.head_count_kv").value_or(c.num_heads);
  c.max_position_embeddings = meta.get_int(p + "context_length");
  if (c.num_heads <= 0) meta.fail(p + "attention.head_count must be positive");
  c.head_dim = meta.find_int(p + "attention.key_length").value_or(c.hidden_size / c.num_heads);
  if (meta.find_int(p + "attention.value_length").value_or(c.head_dim) != c.head_dim)
    meta.fail(p + "attention.value_length differs from key_length, which blend does not support");
  if (meta.find_int(p + "rope.dimension_count").value_or(c.head_dim) != c.head_dim)
    meta.fail(p + "rope.dimension_count differs from the head size (partial RoPE is not " +
              "supported for " + arch.gguf + ")");
  c.rope_theta = meta.find_float(p + "rope.freq_base").value_or(10000.0);
  const std::optional<double> eps = meta.find_float(p + "attention.layer_norm_rms_epsilon");
  if (!eps) meta.fail("no metadata key '" + p + "attention.layer_norm_rms_epsilon'");
  c.rms_norm_eps = *eps;
  const std::string scaling = meta.find_string(p + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = meta.find_float(p + "rope.scaling.factor").value_or(1.0);
  } else if (scaling != "none") {
    meta.fail(p + "rope.scaling.type '" + scaling + "' is not supported (none, linear)");
  } else if (meta.find(p + "rope.scaling.factor") &&
             meta.find_float(p + "rope.scaling.factor").value_or(1.0) != 1.0) {
    meta.fail(p + "rope.scaling.factor is set without a scaling type");
  }
  if (!rope_freqs.empty()) {
    if (std::string(arch.gguf) != "llama" || c.rope_scaling.type != "none")
      meta.fail("rope_freqs.weight is only read as Llama 3's RoPE scaling");
    const std::optional<RopeScaling> s = llama3_scaling_of(c, rope_freqs);
    if (!s)
      meta.fail("rope_freqs.weight matches no Llama-3 rope_scaling (factor, low/high frequency " +
                std::string("factors, original context): such RoPE factors are not supported"));
    c.rope_scaling = *s;
  }
  c.attention_bias = g.tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = std::string(arch.gguf) == "qwen3";
  c.tie_word_embeddings = g.tensor("output.weight") == nullptr;
  return c;
}

// ---- writing the folder --------------------------------------------------------------------

void write_json_file(const fs::path& path, const json& j) {
  std::ofstream out(path, std::ios::binary);
  out << j.dump(2) << '\n';
  out.close();
  if (!out) throw Error(path.string() + ": cannot write");
}

std::string types_summary(const std::vector<SourceTensor>& tensors) {
  std::map<std::string, int> counts;
  for (const SourceTensor& t : tensors) ++counts[t.layout.name];
  std::string s;
  for (const auto& [name, count] : counts)
    s += (s.empty() ? "" : ", ") + name + " x" + std::to_string(count);
  return s;
}

uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

GgufImportSummary import_gguf(const fs::path& gguf_file, const fs::path& out_dir, int threads) {
  const GgufFile g = read_gguf(gguf_file);
  const Metadata meta(g, gguf_file);
  const Architecture& arch = architecture_of(meta);
  const MappedFile file(gguf_file);
  if (file.size() != g.file_size) meta.fail("changed while it was read");

  auto source_of = [&](const GgufTensorInfo& info) {
    SourceTensor s;
    s.info = &info;
    const std::optional<GgmlBlockLayout> layout = ggml_block_layout(info.type);
    if (!layout)
      meta.fail("tensor '" + info.name + "' has ggml type " + std::to_string(info.type) + " (" +
                ggml_type_display_name(info.type) + ")" +
                ", which blend cannot read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, " +
                "Q3_K, Q4_K, Q5_K, Q6_K)");
    s.layout = *layout;
    s.data = file.data() + g.data_offset + info.offset;
    s.cols = static_cast<int64_t>(info.ne[0]);
    s.rows = 1;
    for (size_t d = 1; d < info.ne.size(); ++d) s.rows *= static_cast<int64_t>(info.ne[d]);
    s.shape = reversed_shape(info);
    return s;
  };

  std::vector<float> rope_freqs;
  if (const GgufTensorInfo* f = g.tensor("rope_freqs.weight")) {
    const SourceTensor s = source_of(*f);
    if (s.shape.size() != 1) meta.fail("rope_freqs.weight must be 1-D");
    rope_freqs.resize(static_cast<size_t>(s.numel()));
    s.read(0, s.numel(), rope_freqs.data());
  }
  ModelConfig config = config_of(g, meta, arch, rope_freqs);
  const TokenizerFiles tok = tokenizer_of(meta, config.max_position_embeddings);
  config.vocab_size = static_cast<int64_t>(meta.find("tokenizer.ggml.tokens")->strings.size());
  if (std::optional<int64_t> v = meta.find_int(std::string(arch.gguf) + ".vocab_size");
      v && *v != config.vocab_size)
    meta.fail(std::string(arch.gguf) + ".vocab_size " + std::to_string(*v) + " differs from the " +
              std::to_string(config.vocab_size) + " tokens of tokenizer.ggml.tokens");
  config.bos_token_id = tok.bos;
  config.eos_token_ids = tok.end_of_generation;
  config.validate();

  // Every tensor of the Hugging Face layout from its GGUF tensor; any other tensor is refused.
  std::vector<SourceTensor> tensors;
  std::set<std::string> used = {"rope_freqs.weight"};
  for (const TensorSpec& spec : llama_tensor_specs(config)) {
    int64_t layer = -1;
    const std::string name = gguf_internal::gguf_tensor_name(spec.name, layer);
    const GgufTensorInfo* info = g.tensor(name);
    if (!info)
      meta.fail("no tensor '" + name + "' (" + spec.name + " of the " + arch.gguf +
                " model its metadata describes)");
    SourceTensor s = source_of(*info);
    if (s.shape != spec.shape)
      meta.fail("tensor '" + name + "' has shape " + shape_string(s.shape) + ", expected " +
                shape_string(spec.shape));
    s.hf_name = spec.name;
    const bool q = spec.name.ends_with("q_proj.weight") || spec.name.ends_with("q_proj.bias");
    const bool k = spec.name.ends_with("k_proj.weight") || spec.name.ends_with("k_proj.bias");
    if (arch.permuted_qk && (q || k)) {
      // The converter's row r came from HF row gguf_permuted_source_row(r): invert the map.
      const int64_t n = spec.shape[0];
      s.source_row.assign(static_cast<size_t>(n), 0);
      for (int64_t r = 0; r < n; ++r)
        s.source_row[static_cast<size_t>(
            gguf_permuted_source_row(r, q ? config.num_heads : config.num_kv_heads, n))] = r;
    }
    used.insert(name);
    tensors.push_back(std::move(s));
  }
  for (const GgufTensorInfo& t : g.tensors)
    if (!used.count(t.name))
      meta.fail("tensor '" + t.name + "' is not part of the " + arch.gguf +
                " model its metadata describes (running without it would be another model)");

  // One dtype for the folder: the matrices' own when all share BF16 or F16 (and the 1-D tensors
  // fit it exactly), else f32, which holds every dequantized value exactly.
  // Q8_0, Q5_0, Q4_K and Q6_K matrices (Q8_0 and Q4_K_M files) stay as they are: the cpu
  // backend's integer kernels run them. Other block types are dequantized.
  auto kept_type = [](const SourceTensor& t) -> std::optional<DType> {
    if (t.shape.size() != 2) return std::nullopt;
    for (DType d : {DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K})
      if (t.info->type == static_cast<uint32_t>(ggml_type_of(d))) return d;
    return std::nullopt;
  };
  auto kept_quantized = [&](const SourceTensor& t) { return kept_type(t).has_value(); };
  std::set<uint32_t> matrix_types;
  for (const SourceTensor& t : tensors)
    if (t.shape.size() > 1 && !kept_quantized(t)) matrix_types.insert(t.info->type);
  DType dtype = DType::kF32;
  if (matrix_types == std::set<uint32_t>{static_cast<uint32_t>(GgmlType::kBF16)})
    dtype = DType::kBF16;
  if (matrix_types == std::set<uint32_t>{static_cast<uint32_t>(GgmlType::kF16)})
    dtype = DType::kF16;
  for (const SourceTensor& t : tensors)
    if (dtype != DType::kF32 && t.shape.size() == 1 && !representable(t, dtype))
      dtype = DType::kF32;
  config.dtype = dtype;

  std::vector<TensorToWrite> writes;
  const size_t es = dtype_size(dtype);
  for (const SourceTensor& t : tensors) {
    TensorToWrite w;
    w.name = t.hf_name;
    w.dtype = dtype;
    w.shape = t.shape;
    if (kept_quantized(t)) {  // the GGUF rows' bytes, in Hugging Face row order
      w.dtype = *kept_type(t);
      w.fill = [&t](size_t offset, std::span<std::byte> out) {
        const size_t row = t.row_bytes();
        for (size_t done = 0; done < out.size();) {
          const size_t at = offset + done, r = at / row, c = at % row;
          const size_t src = t.source_row.empty() ? r : static_cast<size_t>(t.source_row[r]);
          const size_t take = std::min(out.size() - done, row - c);
          std::memcpy(out.data() + done, t.data + src * row + c, take);
          done += take;
        }
      };
      writes.push_back(std::move(w));
      continue;
    }
    w.fill = [&t, dtype, es](size_t offset, std::span<std::byte> out) {
      const int64_t first = static_cast<int64_t>(offset / es);
      const int64_t last = static_cast<int64_t>((offset + out.size() + es - 1) / es);
      std::vector<float> values(static_cast<size_t>(last - first));
      t.read(first, last - first, values.data());
      std::vector<std::byte> bytes(values.size() * es);
      for (size_t i = 0; i < values.size(); ++i)
        store_float(values[i], dtype, bytes.data() + i * es);
      std::memcpy(out.data(), bytes.data() + (offset - static_cast<size_t>(first) * es),
                  out.size());
    };
    writes.push_back(std::move(w));
  }

  std::error_code ec;
  if (fs::exists(out_dir, ec)) throw Error(out_dir.string() + ": already exists");
  // A 4.9 GB Q4_K_M file of an 8B model is 32 GB as f32: refuse before writing what cannot fit.
  uint64_t bytes = 0;
  for (const SourceTensor& t : tensors)
    bytes += kept_quantized(t) ? tensor_bytes(*kept_type(t), t.shape)
                               : static_cast<uint64_t>(t.numel()) * es;
  const fs::path parent = out_dir.has_parent_path() ? out_dir.parent_path() : fs::path(".");
  if (const fs::space_info space = fs::space(parent, ec);
      !ec && space.available < bytes + (64u << 20))
    throw Error(out_dir.string() + ": the imported model needs " + std::to_string(bytes >> 20) +
                " MiB of " + std::string(dtype_name(dtype)) + " weights, more than the " +
                std::to_string(space.available >> 20) + " MiB free there");
  const fs::path tmp = out_dir.string() + ".tmp" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  try {
    fs::create_directories(tmp);
    write_json_file(tmp / "config.json", config.to_json());
    write_json_file(tmp / "tokenizer.json", tok.tokenizer);
    write_json_file(tmp / "tokenizer_config.json", tok.tokenizer_config);
    write_safetensors(tmp / "model.safetensors", writes, {{"format", "pt"}}, std::max(1, threads));
    ModelConfig::from_dir(tmp).validate();  // what we wrote reads back as this model
    fs::rename(tmp, out_dir);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  std::set<std::string> kept;  // the block types the folder keeps, by name
  for (const SourceTensor& t : tensors)
    if (kept_quantized(t)) kept.insert(std::string(dtype_name(*kept_type(t))));
  std::string kept_types;
  for (const std::string& k : kept) kept_types += (kept_types.empty() ? "" : ", ") + k;
  return {arch.gguf, arch.hf, dtype, types_summary(tensors), tensors.size(), kept_types};
}

std::optional<fs::path> gguf_model_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    std::ifstream in(path, std::ios::binary);
    uint32_t magic = 0;
    in.read(reinterpret_cast<char*>(&magic), 4);
    if (in && magic == kGgufMagic) return path;
    return std::nullopt;
  }
  if (!fs::is_directory(path, ec) || fs::exists(path / "config.json", ec)) return std::nullopt;
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(path, ec))
    if (entry.path().extension() == ".gguf" && entry.is_regular_file(ec))
      found.push_back(entry.path());
  if (found.size() <= 1) return found.empty() ? std::nullopt : std::optional(found[0]);
  std::sort(found.begin(), found.end());
  std::string names;
  for (const fs::path& f : found) names += (names.empty() ? "" : ", ") + f.filename().string();
  throw Error(path.string() + ": holds " + std::to_string(found.size()) +
              " GGUF files and no config.json; name one of them (" + names + ")");
}

fs::path gguf_cache_dir() {
  if (const char* d = std::getenv("BLEND_GGUF_CACHE"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return fs::path(d) / "blend" / "gguf";
  if (const char* d = std::getenv("HOME"); d && *d)
    return fs::path(d) / ".cache" / "blend" / "gguf";
  throw Error("no cache folder for imported GGUF files: set BLEND_GGUF_CACHE (or HOME)");
}

fs::path resolve_model_source(const fs::path& path, int threads) {
  const std::optional<fs::path> file = gguf_model_file(path);
  if (!file) return path;
  std::error_code ec;
  const fs::path canonical = fs::canonical(*file, ec);
  if (ec) throw Error(file->string() + ": " + ec.message());
  struct stat st {};
  if (::stat(canonical.c_str(), &st) != 0) throw Error(canonical.string() + ": cannot stat");
  const std::string identity = canonical.string() + '\n' + std::to_string(st.st_size) + '\n' +
                               std::to_string(st.st_mtim.tv_sec) + '.' +
                               std::to_string(st.st_mtim.tv_nsec) + '\n' +
                               std::to_string(kImportVersion);
  char key[17];
  std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(fnv1a(identity)));
  const fs::path dir = gguf_cache_dir() / key / canonical.stem();
  if (fs::is_directory(dir, ec)) return dir;
  fs::create_directories(dir.parent_path(), ec);
  if (ec)
    throw Error(dir.parent_path().string() + ": cannot create the GGUF cache: " + ec.message());
  try {
    import_gguf(canonical, dir, threads);
  } catch (const std::exception&) {
    if (fs::is_directory(dir, ec)) return dir;  // another process imported it first
    throw;
  }
  return dir;
}

}  // namespace blend
