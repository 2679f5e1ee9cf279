#include "gguf/import.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/quant.h"
#include "gguf/export.h"
#include "gguf/gguf.h"
#include "gguf_file_util.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "model/zoo.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace blend {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

RandomInitOptions init_options(DType dtype = DType::kBF16) {
  RandomInitOptions o;
  o.seed = 5;
  o.dtype = dtype;
  o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  return o;
}

json load_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every tensor of `a` and `b` has the same name, dtype, shape and bytes.
void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const TensorStore sa = TensorStore::open_dir(a), sb = TensorStore::open_dir(b);
  ASSERT_EQ(sa.tensors().size(), sb.tensors().size());
  for (const auto& [name, ta] : sa.tensors()) {
    ASSERT_TRUE(sb.contains(name)) << name;
    const TensorView& tb = sb.get(name);
    EXPECT_EQ(ta->dtype, tb.dtype) << name;
    EXPECT_EQ(ta->shape, tb.shape) << name;
    ASSERT_EQ(ta->nbytes, tb.nbytes) << name;
    EXPECT_EQ(std::memcmp(ta->data, tb.data, ta->nbytes), 0) << name;
  }
}

const char* const kTexts[] = {
    "Hello, world! 12345 numbers",
    "  leading spaces and\nnew lines\r\n\ttabs",
    "<|begin_of_text|>special <|eot_id|> tokens in text",
    "unicode: caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80",
};

void expect_same_tokenizer(const fs::path& a, const fs::path& b) {
  const Tokenizer ta = Tokenizer::from_dir(a), tb = Tokenizer::from_dir(b);
  for (const char* text : kTexts) EXPECT_EQ(ta.encode(text), tb.encode(text)) << text;
  ASSERT_EQ(ta.vocab_size(), tb.vocab_size());
  for (int32_t id = 0; id < ta.vocab_size(); ++id) {
    ASSERT_EQ(ta.token_bytes(id), tb.token_bytes(id)) << id;
    ASSERT_EQ(ta.is_special(id), tb.is_special(id)) << id;
  }
}

// ---- a model exported by blend reads back as itself --------------------------------------

TEST(GgufImport, Bf16ExportReadsBackAsTheSameModel) {
  testing::TempDir dir;
  const ModelConfig c = *find_model_preset("tiny");
  write_random_model(c, dir / "m", init_options());
  export_gguf(dir / "m", dir / "m.gguf");
  const GgufImportSummary s = import_gguf(dir / "m.gguf", dir / "back", 2);
  EXPECT_EQ(s.gguf_architecture, "llama");
  EXPECT_EQ(s.architecture, "LlamaForCausalLM");
  EXPECT_EQ(s.dtype, DType::kBF16);
  const ModelConfig back = ModelConfig::from_dir(dir / "back");
  EXPECT_EQ(architecture_difference(c, back), "");
  EXPECT_EQ(back.vocab_size, c.vocab_size);
  EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings);
  EXPECT_EQ(back.bos_token_id, c.bos_token_id);
  // q_proj / k_proj rows went through the converter's permutation and back: bytes identical.
  expect_same_tensors(dir / "m", dir / "back");
  expect_same_tokenizer(dir / "m", dir / "back");
  const json tc = load_json(dir / "back" / "tokenizer_config.json");
  const json orig = load_json(dir / "m" / "tokenizer_config.json");
  EXPECT_EQ(tc["chat_template"], orig["chat_template"]);
  EXPECT_EQ(tc["bos_token"], "<|begin_of_text|>");
  // The BOS token is added exactly when the original adds it.
  const Tokenizer t = Tokenizer::from_dir(dir / "back");
  const Tokenizer o = Tokenizer::from_dir(dir / "m");
  EXPECT_EQ(t.add_special_tokens(t.encode("hi")), o.add_special_tokens(o.encode("hi")));
  EXPECT_EQ(tc["add_bos_token"],
            load_json(dir / "m" / "tokenizer_config.json").value("add_bos_token", false));
  // The stop ids llama.cpp uses: the config's eos and <|eot_id|>.
  const std::vector<int32_t> eos = back.eos_token_ids;
  EXPECT_NE(std::find(eos.begin(), eos.end(), 128009), eos.end());
  EXPECT_NE(std::find(eos.begin(), eos.end(), 128001), eos.end());
  // The folder is written whole or not at all: importing onto it again is refused.
  EXPECT_NE(error_of([&] { import_gguf(dir / "m.gguf", dir / "back"); }).find("already exists"),
            std::string::npos);
}

TEST(GgufImport, F32AndF16FilesKeepTheirValues) {
  testing::TempDir dir;
  const ModelConfig c = *find_model_preset("tiny");
  write_random_model(c, dir / "m32", init_options(DType::kF32));
  export_gguf(dir / "m32", dir / "m32.gguf");
  EXPECT_EQ(import_gguf(dir / "m32.gguf", dir / "b32").dtype, DType::kF32);
  expect_same_tensors(dir / "m32", dir / "b32");
  write_random_model(c, dir / "m16", init_options(DType::kF16));
  export_gguf(dir / "m16", dir / "m16.gguf");
  EXPECT_EQ(import_gguf(dir / "m16.gguf", dir / "b16").dtype, DType::kF16);
  expect_same_tensors(dir / "m16", dir / "b16");
}

TEST(GgufImport, QwenVariantsKeepBiasesHeadNormsAndNfc) {
  for (const std::string variant : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(variant);
    testing::TempDir dir;
    ModelConfig c = *find_model_preset("tiny");
    c.architecture = variant == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM";
    c.model_type = variant;
    c.attention_bias = variant == "qwen2";
    c.qk_norm = variant == "qwen3";
    if (variant == "qwen3") c.head_dim = 32;
    write_random_model(c, dir / "m", init_options());
    export_gguf(dir / "m", dir / "m.gguf");
    const GgufImportSummary s = import_gguf(dir / "m.gguf", dir / "back");
    EXPECT_EQ(s.gguf_architecture, variant);
    const ModelConfig back = ModelConfig::from_dir(dir / "back");
    EXPECT_EQ(architecture_difference(c, back), "");
    EXPECT_EQ(back.attention_bias, c.attention_bias);
    EXPECT_EQ(back.qk_norm, c.qk_norm);
    expect_same_tensors(dir / "m", dir / "back");
    // The Llama-3 tokenizer exported as "llama-bpe" keeps its own pre-tokenizer.
    expect_same_tokenizer(dir / "m", dir / "back");
  }
  // A "qwen2" vocabulary gets Qwen's NFC normalizer: a decomposed é encodes as the composed one.
  testing::TempDir dir;
  write_random_model(*find_model_preset("tiny"), dir / "m", init_options());
  export_gguf(dir / "m", dir / "m.gguf");
  testing::GgufContents g = testing::read_gguf_contents(dir / "m.gguf");
  g.set("tokenizer.ggml.pre", testing::gguf_string("qwen2"));
  GgufValue add_bos;
  add_bos.type = GgufType::kBool;
  add_bos.b = true;
  g.set("tokenizer.ggml.add_bos_token", add_bos);
  testing::write_gguf_contents(dir / "q.gguf", g);
  import_gguf(dir / "q.gguf", dir / "q");
  const Tokenizer t = Tokenizer::from_dir(dir / "q");
  // add_bos_token becomes the TemplateProcessing post-processor that prepends it.
  const std::vector<int32_t> with_bos = t.add_special_tokens(t.encode("hi"));
  ASSERT_EQ(with_bos.size(), t.encode("hi").size() + 1);
  EXPECT_EQ(with_bos.front(), 128000);
  EXPECT_EQ(t.encode("caf\x65\xCC\x81"), t.encode("caf\xC3\xA9"));
  EXPECT_EQ(load_json(dir / "q" / "tokenizer.json")["normalizer"]["type"], "NFC");
}

TEST(GgufImport, Llama3RopeFreqsBecomeItsRopeScaling) {
  testing::TempDir dir;
  ModelConfig c = *find_model_preset("tiny");
  c.rope_scaling = {.type = "llama3",
                    .factor = 32.0,
                    .low_freq_factor = 1.0,
                    .high_freq_factor = 4.0,
                    .original_max_position_embeddings = 8192};
  c.tie_word_embeddings = true;
  write_random_model(c, dir / "m", init_options());
  export_gguf(dir / "m", dir / "m.gguf");
  import_gguf(dir / "m.gguf", dir / "back");
  const ModelConfig back = ModelConfig::from_dir(dir / "back");
  EXPECT_TRUE(back.tie_word_embeddings);
  EXPECT_EQ(back.rope_scaling.type, "llama3");
  EXPECT_EQ(llama3_rope_factors(back), llama3_rope_factors(c));
  EXPECT_EQ(architecture_difference(c, back), "");
  // Factors no Llama-3 parameters produce are refused, not rounded to the nearest.
  testing::GgufContents g = testing::read_gguf_contents(dir / "m.gguf");
  testing::GgufTensorBytes* f = g.tensor("rope_freqs.weight");
  ASSERT_NE(f, nullptr);
  float x;
  std::memcpy(&x, f->bytes.data(), 4);
  x *= 1.5f;
  std::memcpy(f->bytes.data(), &x, 4);
  testing::write_gguf_contents(dir / "odd.gguf", g);
  EXPECT_NE(error_of([&] { import_gguf(dir / "odd.gguf", dir / "odd"); }).find("rope_freqs"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "odd"));
}

// ---- quantized tensors -------------------------------------------------------------------

// A model whose matrices are whole K-quant super-blocks wide (hidden 256, intermediate 512).
ModelConfig wide_config() {
  ModelConfig c = *find_model_preset("tiny");
  c.hidden_size = 256;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 512;
  c.num_layers = 2;
  return c;
}

// Random blocks of a K-quant `type` (no quantizer for them yet): random bytes, with the
// super-block scales set to small finite values.
std::string random_k_blocks(uint32_t type, size_t blocks, uint32_t seed) {
  const GgmlBlockLayout layout = *ggml_block_layout(type);
  std::string out(blocks * layout.block_bytes, '\0');
  uint32_t x = seed;
  for (char& ch : out) {
    x = x * 1664525u + 1013904223u;
    ch = static_cast<char>(x >> 24);
  }
  std::vector<size_t> halves;  // offsets of d (and dmin) in a block
  if (type == static_cast<uint32_t>(GgmlType::kQ4_K) ||
      type == static_cast<uint32_t>(GgmlType::kQ5_K))
    halves = {0, 2};
  if (type == static_cast<uint32_t>(GgmlType::kQ6_K)) halves = {208};
  const uint16_t small = f32_to_f16(0.0005f);
  for (size_t b = 0; b < blocks; ++b)
    for (size_t off : halves) std::memcpy(out.data() + b * layout.block_bytes + off, &small, 2);
  return out;
}

// The matrices of blk.* as `type_of(name)`: Q8_0 / Q4_0 quantized from their (bf16) values,
// K-quants as random blocks.
template <typename TypeOf>
void quantize_layers(testing::GgufContents& g, TypeOf type_of) {
  uint32_t seed = 1;
  for (testing::GgufTensorBytes& t : g.tensors) {
    if (t.ne.size() != 2 || !t.name.starts_with("blk.")) continue;
    const uint32_t type = type_of(t.name);
    const GgmlBlockLayout layout = *ggml_block_layout(type);
    const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.ne[1]);
    const size_t row_bytes = static_cast<size_t>(cols) / layout.block_elems * layout.block_bytes;
    std::string out;
    if (layout.block_elems == 256) {
      out = random_k_blocks(type, static_cast<size_t>(rows * cols / 256), seed++);
    } else {
      std::vector<float> row(static_cast<size_t>(cols));
      std::string qrow(row_bytes, '\0');
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(t.type, t.bytes.data() + r * cols * 2, row.data(), cols);
        quantize_row(type, row.data(), qrow.data(), cols);
        out += qrow;
      }
    }
    t.bytes = std::move(out);
    t.type = type;
  }
}

TEST(GgufImport, QuantizedMatricesKeptOrDequantizedToF32ExactlyAndUnpermuted) {
  testing::TempDir dir;
  const ModelConfig c = wide_config();
  write_random_model(c, dir / "m", init_options());
  export_gguf(dir / "m", dir / "m.gguf");
  testing::GgufContents g = testing::read_gguf_contents(dir / "m.gguf");
  // A Q4_K_M-like mix: Q4_K for q, Q6_K for v and down, Q8_0 for k, Q4_0 for gate, Q5_K else.
  quantize_layers(g, [](const std::string& name) {
    auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
    if (has("attn_v") || has("ffn_down")) return static_cast<uint32_t>(GgmlType::kQ6_K);
    if (has("attn_q")) return static_cast<uint32_t>(GgmlType::kQ4_K);
    if (has("attn_k")) return static_cast<uint32_t>(GgmlType::kQ8_0);
    if (has("ffn_gate")) return static_cast<uint32_t>(GgmlType::kQ4_0);
    return static_cast<uint32_t>(GgmlType::kQ5_K);
  });
  testing::write_gguf_contents(dir / "q.gguf", g);
  const GgufImportSummary s = import_gguf(dir / "q.gguf", dir / "q", 2);
  EXPECT_EQ(s.dtype, DType::kF32);
  EXPECT_NE(s.source_types.find("Q4_K x"), std::string::npos) << s.source_types;
  EXPECT_EQ(s.kept_block_types, "Q4_K, Q6_K, Q8_0");  // Q4_0 and Q5_K are dequantized
  const TensorStore q = TensorStore::open_dir(dir / "q");
  const TensorStore orig = TensorStore::open_dir(dir / "m");
  // Each HF tensor equals its GGUF blocks dequantized, HF row r from GGUF row p where the
  // converter's permutation sent r: checked here row by row against dequantize_row.
  for (const char* name : {"attn_q", "attn_k", "attn_v", "ffn_down", "ffn_gate"}) {
    const std::string gname = std::string("blk.1.") + name + ".weight";
    const testing::GgufTensorBytes& t = *g.tensor(gname);
    const std::string hf =
        gname == "blk.1.ffn_down.weight" ? "model.layers.1.mlp.down_proj.weight"
        : gname == "blk.1.ffn_gate.weight"
            ? "model.layers.1.mlp.gate_proj.weight"
            : std::string("model.layers.1.self_attn.") + name[5] + "_proj.weight";
    const TensorView& v = q.get(hf);
    // Q8_0, Q4_K and Q6_K stay as they are (the cpu backend's integer kernels run them), the
    // others are f32.
    const bool kept = t.type == static_cast<uint32_t>(GgmlType::kQ8_0) ||
                      t.type == static_cast<uint32_t>(GgmlType::kQ4_K) ||
                      t.type == static_cast<uint32_t>(GgmlType::kQ6_K);
    ASSERT_EQ(v.dtype, kept ? *parse_block_dtype(ggml_type_display_name(t.type)) : DType::kF32)
        << hf;
    const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.ne[1]);
    const GgmlBlockLayout layout = *ggml_block_layout(t.type);
    const size_t row_bytes = static_cast<size_t>(cols) / layout.block_elems * layout.block_bytes;
    const bool permuted = name == std::string("attn_q") || name == std::string("attn_k");
    const int64_t heads = name == std::string("attn_q") ? c.num_heads : c.num_kv_heads;
    std::vector<float> row(static_cast<size_t>(cols));
    double err = 0;
    for (int64_t p = 0; p < rows; ++p) {
      dequantize_row(t.type, t.bytes.data() + p * row_bytes, row.data(), cols);
      const int64_t r = permuted ? gguf_permuted_source_row(p, heads, rows) : p;
      std::vector<float> got(static_cast<size_t>(cols));
      for (int64_t k = 0; k < cols; ++k) got[static_cast<size_t>(k)] = v.at(r * cols + k);
      ASSERT_EQ(std::memcmp(got.data(), row.data(), static_cast<size_t>(cols) * 4), 0)
          << hf << " row " << r;
      for (int64_t k = 0; k < cols; ++k)
        err = std::max<double>(err, std::abs(row[k] - orig.get(hf).at(r * cols + k)));
    }
    // The quantized ones are near the bf16 weights they came from (a wrong row order or scale
    // would be far off).
    if (t.type == static_cast<uint32_t>(GgmlType::kQ8_0)) {
      EXPECT_LT(err, 0.002) << hf;
    }
    if (t.type == static_cast<uint32_t>(GgmlType::kQ4_0)) {
      EXPECT_LT(err, 0.03) << hf;
    }
  }
  // The embedding stayed BF16 in the file: its values are exact in the f32 folder.
  const TensorView& e = q.get("model.embed_tokens.weight");
  for (int64_t i = 0; i < 1000; ++i)
    ASSERT_EQ(e.at(i), orig.get("model.embed_tokens.weight").at(i)) << i;
}

// `blend model quantize --type Q8_0`: every matrix Q8_0 (rows permuted for llama before they
// are quantized), which the import reads back as each HF row quantized and dequantized.
TEST(GgufImport, Q8_0ExportReadsBackAsEachRowQuantized) {
  testing::TempDir dir;
  const ModelConfig c = *find_model_preset("tiny");
  write_random_model(c, dir / "m", init_options());
  GgufExportOptions options;
  options.quantization = QuantPreset::kQ8_0;
  const GgufExportSummary s = export_gguf(dir / "m", dir / "q8.gguf", options);
  EXPECT_EQ(s.matrix_type, "Q8_0");
  const GgufFile g = read_gguf(dir / "q8.gguf");
  EXPECT_EQ(g.at("general.file_type").u, 7u);  // LLAMA_FTYPE_MOSTLY_Q8_0
  for (const GgufTensorInfo& t : g.tensors)
    EXPECT_EQ(t.type, t.ne.size() == 2 ? static_cast<uint32_t>(GgmlType::kQ8_0) : 0u) << t.name;
  EXPECT_EQ(import_gguf(dir / "q8.gguf", dir / "back").dtype, DType::kF32);
  const TensorStore orig = TensorStore::open_dir(dir / "m"),
                    back = TensorStore::open_dir(dir / "back");
  for (const char* name :
       {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"}) {
    const TensorView& o = orig.get(name);
    const TensorView& b = back.get(name);
    EXPECT_EQ(b.dtype, DType::kQ8_0) << name;  // kept as the file's blocks
    const int64_t cols = o.shape[1], rows = std::min<int64_t>(o.shape[0], 256);
    std::vector<float> row(static_cast<size_t>(cols)), want(static_cast<size_t>(cols));
    std::vector<uint8_t> q(static_cast<size_t>(cols / 32 * 34));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) row[static_cast<size_t>(k)] = o.at(r * cols + k);
      quantize_row(static_cast<uint32_t>(GgmlType::kQ8_0), row.data(), q.data(), cols);
      dequantize_row(static_cast<uint32_t>(GgmlType::kQ8_0), q.data(), want.data(), cols);
      for (int64_t k = 0; k < cols; ++k) row[static_cast<size_t>(k)] = b.at(r * cols + k);
      ASSERT_EQ(std::memcmp(row.data(), want.data(), static_cast<size_t>(cols) * 4), 0)
          << name << " row " << r;
      // The stored bytes are the quantizer's own block bytes (scale first, then the values).
      ASSERT_EQ(std::memcmp(b.data + r * q.size(), q.data(), q.size()), 0) << name << " row " << r;
    }
  }
}

// `blend model quantize --type Q4_K_M` on the tiny model with 256-wide FFN rows: llama-quantize's
// choice per tensor (its rows of 64 are not whole 256-blocks, so Q4_K falls back to Q5_0 and
// Q6_K to Q8_0, except ffn_down's 256-wide rows), which the import reads back as each HF row
// quantized with that type and dequantized.
TEST(GgufImport, Q4_K_MExportPicksLlamaQuantizesTypesAndReadsBack) {
  testing::TempDir dir;
  ModelConfig c = *find_model_preset("tiny");
  c.intermediate_size = 256;
  write_random_model(c, dir / "m", init_options());
  GgufExportOptions options;
  options.quantization = QuantPreset::kQ4_K_M;
  const GgufExportSummary s = export_gguf(dir / "m", dir / "q4.gguf", options);
  EXPECT_EQ(s.matrix_type, "Q4_K_M");
  const GgufFile g = read_gguf(dir / "q4.gguf");
  EXPECT_EQ(g.at("general.file_type").u, 15u);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  // Two layers: llama.cpp's use_more_bits picks layer 1 (the last eighth), not layer 0.
  const std::map<std::string, GgmlType> want = {
      {"token_embd.weight", GgmlType::kQ5_0},     {"output.weight", GgmlType::kQ8_0},
      {"blk.0.attn_q.weight", GgmlType::kQ5_0},   {"blk.1.attn_k.weight", GgmlType::kQ5_0},
      {"blk.0.attn_v.weight", GgmlType::kQ5_0},   {"blk.1.attn_v.weight", GgmlType::kQ8_0},
      {"blk.0.ffn_down.weight", GgmlType::kQ4_K}, {"blk.1.ffn_down.weight", GgmlType::kQ6_K},
      {"blk.1.ffn_up.weight", GgmlType::kQ5_0},   {"blk.0.attn_norm.weight", GgmlType::kF32}};
  size_t seen = 0;
  for (const GgufTensorInfo& t : g.tensors) {
    if (t.ne.size() == 1) {
      EXPECT_EQ(t.type, 0u) << t.name;
    }
    if (auto it = want.find(t.name); it != want.end()) {
      EXPECT_EQ(t.type, static_cast<uint32_t>(it->second)) << t.name;
      ++seen;
    }
  }
  EXPECT_EQ(seen, want.size());
  import_gguf(dir / "q4.gguf", dir / "back");
  const TensorStore orig = TensorStore::open_dir(dir / "m"),
                    back = TensorStore::open_dir(dir / "back");
  const std::pair<const char*, GgmlType> checks[] = {
      {"model.layers.0.self_attn.q_proj.weight", GgmlType::kQ5_0},
      {"model.layers.1.self_attn.v_proj.weight", GgmlType::kQ8_0},
      {"model.layers.0.mlp.down_proj.weight", GgmlType::kQ4_K},
      {"model.layers.1.mlp.down_proj.weight", GgmlType::kQ6_K},
      {"model.embed_tokens.weight", GgmlType::kQ5_0}};
  for (const auto& [name, type] : checks) {
    const TensorView& o = orig.get(name);
    const TensorView& b = back.get(name);
    const int64_t cols = o.shape[1], rows = std::min<int64_t>(o.shape[0], 256);
    const GgmlBlockLayout layout = *ggml_block_layout(static_cast<uint32_t>(type));
    std::vector<float> row(static_cast<size_t>(cols)), want_row(static_cast<size_t>(cols));
    std::vector<uint8_t> q(static_cast<size_t>(cols / layout.block_elems * layout.block_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) row[static_cast<size_t>(k)] = o.at(r * cols + k);
      quantize_row(static_cast<uint32_t>(type), row.data(), q.data(), cols);
      dequantize_row(static_cast<uint32_t>(type), q.data(), want_row.data(), cols);
      for (int64_t k = 0; k < cols; ++k) row[static_cast<size_t>(k)] = b.at(r * cols + k);
      ASSERT_EQ(std::memcmp(row.data(), want_row.data(), static_cast<size_t>(cols) * 4), 0)
          << name << " row " << r;
    }
  }
}

// ---- what is refused -----------------------------------------------------------------------

class GgufImportRefusals : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    write_random_model(*find_model_preset("tiny"), *dir_ / "m", init_options());
    export_gguf(*dir_ / "m", *dir_ / "m.gguf");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  // The import's error for the exported file changed by `edit` ("" when it imports).
  template <typename Edit>
  static std::string import_error(Edit edit) {
    testing::GgufContents g = testing::read_gguf_contents(*dir_ / "m.gguf");
    edit(g);
    const fs::path file = *dir_ / "edited.gguf", out = *dir_ / "edited";
    testing::write_gguf_contents(file, g);
    std::error_code ec;
    fs::remove_all(out, ec);
    const std::string e = error_of([&] { import_gguf(file, out); });
    EXPECT_EQ(fs::exists(out), e.empty()) << e;  // nothing is left of a refused import
    return e;
  }
  static testing::TempDir* dir_;
};
testing::TempDir* GgufImportRefusals::dir_ = nullptr;

TEST_F(GgufImportRefusals, UnreadableTensorTypesAreNamed) {
  const std::string e = import_error([](testing::GgufContents& g) {
    testing::GgufTensorBytes& t = *g.tensor("blk.0.attn_q.weight");
    t.type = 16;  // IQ2_XXS: 256 elements in 66 bytes
    t.bytes.assign(t.ne[1] * (t.ne[0] / 256 + 1) * 66, '\0');
    t.ne[0] = 256;
  });
  EXPECT_NE(e.find("blk.0.attn_q.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("IQ2_XXS"), std::string::npos) << e;
}

TEST_F(GgufImportRefusals, KeysTheModelWouldIgnoreAreNamed) {
  std::string e = import_error(
      [](testing::GgufContents& g) { g.set("llama.expert_count", testing::gguf_u32(8)); });
  EXPECT_NE(e.find("llama.expert_count"), std::string::npos) << e;
  e = import_error([](testing::GgufContents& g) {
    g.set("llama.attention.sliding_window", testing::gguf_u32(4096));
  });
  EXPECT_NE(e.find("llama.attention.sliding_window"), std::string::npos) << e;
  e = import_error([](testing::GgufContents& g) {
    g.set("llama.rope.scaling.type", testing::gguf_string("yarn"));
  });
  EXPECT_NE(e.find("yarn"), std::string::npos) << e;
  // general.* keys describe the file and change nothing.
  e = import_error([](testing::GgufContents& g) {
    g.set("general.quantized_by", testing::gguf_string("someone"));
  });
  EXPECT_EQ(e, "");
}

TEST_F(GgufImportRefusals, OtherArchitecturesAndVocabulariesAreNamed) {
  std::string e = import_error([](testing::GgufContents& g) {
    g.set("general.architecture", testing::gguf_string("mamba"));
  });
  EXPECT_NE(e.find("'mamba'"), std::string::npos) << e;
  e = import_error([](testing::GgufContents& g) {
    g.set("tokenizer.ggml.model", testing::gguf_string("llama"));
  });
  EXPECT_NE(e.find("tokenizer.ggml.model 'llama'"), std::string::npos) << e;
  e = import_error([](testing::GgufContents& g) {
    g.set("tokenizer.ggml.pre", testing::gguf_string("deepseek-llm"));
  });
  EXPECT_NE(e.find("deepseek-llm"), std::string::npos) << e;
}

TEST_F(GgufImportRefusals, MissingAndExtraTensorsAreNamed) {
  std::string e = import_error([](testing::GgufContents& g) {
    g.tensors.push_back({"blk.0.attn_sinks.weight", {4}, 0, std::string(16, '\0')});
  });
  EXPECT_NE(e.find("blk.0.attn_sinks.weight"), std::string::npos) << e;
  e = import_error([](testing::GgufContents& g) {
    std::erase_if(g.tensors, [](const auto& t) { return t.name == "blk.1.ffn_up.weight"; });
  });
  EXPECT_NE(e.find("blk.1.ffn_up.weight"), std::string::npos) << e;
  // One layer more in the metadata than the file holds.
  e = import_error(
      [](testing::GgufContents& g) { g.set("llama.block_count", testing::gguf_u32(3)); });
  EXPECT_NE(e.find("blk.2."), std::string::npos) << e;
}

// ---- --model FILE.gguf ----------------------------------------------------------------------

TEST(GgufModelSource, ResolvesFilesAndFoldersOnceIntoTheCache) {
  testing::TempDir dir;
  write_random_model(*find_model_preset("tiny"), dir / "m", init_options());
  fs::create_directories(dir / "holder");
  export_gguf(dir / "m", dir / "holder" / "tiny-bf16.gguf");
  ::setenv("BLEND_GGUF_CACHE", (dir / "cache").c_str(), 1);
  // A model folder is itself.
  EXPECT_EQ(resolve_model_source(dir / "m"), dir / "m");
  EXPECT_EQ(gguf_model_file(dir / "m"), std::nullopt);
  // A file, and the folder holding it, are the same cached import, named after the file.
  const fs::path a = resolve_model_source(dir / "holder" / "tiny-bf16.gguf");
  EXPECT_EQ(a.filename(), "tiny-bf16");
  EXPECT_TRUE(a.string().starts_with((dir / "cache").string())) << a;
  EXPECT_EQ(model_folder_name(a), "tiny-bf16");  // what the served model is called
  const auto written = fs::last_write_time(a / "model.safetensors");
  EXPECT_EQ(resolve_model_source(dir / "holder"), a);
  EXPECT_EQ(fs::last_write_time(a / "model.safetensors"), written);  // reused, not rewritten
  expect_same_tensors(dir / "m", a);
  // A changed file is imported again.
  fs::last_write_time(dir / "holder" / "tiny-bf16.gguf", written + std::chrono::seconds(5));
  EXPECT_NE(resolve_model_source(dir / "holder" / "tiny-bf16.gguf"), a);
  // Two files in a folder without config.json: which one is meant is the user's to say.
  fs::copy_file(dir / "holder" / "tiny-bf16.gguf", dir / "holder" / "other.gguf");
  const std::string e = error_of([&] { resolve_model_source(dir / "holder"); });
  EXPECT_NE(e.find("other.gguf"), std::string::npos) << e;
  // A file that is not GGUF is left to the model folder's reader (which refuses it).
  testing::write_file(dir / "notes.txt", "hello");
  EXPECT_EQ(resolve_model_source(dir / "notes.txt"), dir / "notes.txt");
  ::unsetenv("BLEND_GGUF_CACHE");
}

}  // namespace
}  // namespace blend

namespace blend {
namespace {

// `--model FILE.gguf` end to end: blend batch on the exported file gives the tokens blend batch
// gives on the folder it came from (--deterministic), and import-gguf refuses a bad file.
TEST(GgufCli, BatchOnAGgufFileMatchesItsFolder) {
  const fs::path blend = BLEND_BINARY;
  if (!fs::exists(blend)) GTEST_SKIP() << "blend binary not built: " << blend;
  testing::TempDir dir;
  write_random_model(*find_model_preset("tiny"), dir / "m", init_options());
  export_gguf(dir / "m", dir / "m.gguf");
  testing::write_file(dir / "in.jsonl",
                      R"({"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":)"
                      R"({"model":"m","messages":[{"role":"user","content":"Hello there"}],)"
                      R"("max_tokens":8,"temperature":0}})"
                      "\n");
  const std::string env = "BLEND_GGUF_CACHE=" + (dir / "cache").string() + " ";
  std::string contents[2];
  int k = 0;
  for (const char* model : {"m", "m.gguf"}) {
    const fs::path out = dir / (std::string(model) + ".out.jsonl");
    const auto r = testing::run_command(
        env + blend.string() + " batch --deterministic --model " + (dir / model).string() +
        " --input " + (dir / "in.jsonl").string() + " --output " + out.string() + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const json line = json::parse(testing::read_file(out));
    contents[k++] = line["response"]["body"]["choices"][0]["message"]["content"];
  }
  EXPECT_FALSE(contents[0].empty());
  EXPECT_EQ(contents[0], contents[1]);
  testing::write_file(dir / "bad.gguf", std::string("GGUF") + std::string(60, '\x01'));
  const auto bad = testing::run_command(blend.string() + " model import-gguf --model " +
                                        (dir / "bad.gguf").string() + " --out " +
                                        (dir / "bad").string() + " 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("bad.gguf"), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(dir / "bad"));
}

// A quantized file (`blend model quantize`) runs: in --deterministic mode a line's tokens and
// log-probabilities are the same alone or beside others, and its first token's
// log-probabilities are near the f32 folder's it was quantized from. Q8_0 runs on the int8
// kernels of q8_gemm.h; Q4_K_M (on this model's 64-wide rows mostly Q5_0 and Q8_0, ffn_down
// Q4_K / Q6_K) on those of kquant_gemm.h, its blocks kept as the file has them.
TEST(GgufCli, QuantizedFilesAreBatchInvariantAndNearTheirFolder) {
  const fs::path blend = BLEND_BINARY;
  if (!fs::exists(blend)) GTEST_SKIP() << "blend binary not built: " << blend;
  testing::TempDir dir;
  ModelConfig c = *find_model_preset("tiny");
  c.tie_word_embeddings = false;  // an lm_head of its own: logits not peaked at the input token
  c.intermediate_size = 256;      // ffn_down's rows whole K-quant blocks
  write_random_model(c, dir / "m", init_options(DType::kF32));
  auto line = [](const std::string& id, int first) {
    std::string ids;
    for (int k = 0; k < 12; ++k) ids += (k ? "," : "") + std::to_string(first + 37 * k);
    return R"({"custom_id":")" + id +
           R"(","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":[)" + ids +
           R"(],"max_tokens":6,"ignore_eos":true,"temperature":0,"logprobs":5}})" + "\n";
  };
  testing::write_file(dir / "three.jsonl", line("a", 100) + line("b", 5000) + line("c", 90000));
  testing::write_file(dir / "one.jsonl", line("b", 5000));
  const std::string env = "BLEND_GGUF_CACHE=" + (dir / "cache").string() + " ";
  auto run = [&](const std::string& model, const std::string& input) {
    const fs::path out = dir / (model + "." + input + ".out");
    const auto r =
        testing::run_command(env + blend.string() + " batch --deterministic --model " +
                             (dir / model).string() + " --input " + (dir / input).string() +
                             " --output " + out.string() + " --threads 2 --quiet 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::map<std::string, json> by_id;
    std::istringstream in(testing::read_file(out));
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) {
        const json j = json::parse(l);
        by_id[j["custom_id"]] = j["response"]["body"]["choices"][0]["logprobs"];
      }
    return by_id;
  };
  const auto f32 = run("m", "one.jsonl");
  ASSERT_EQ(f32.size(), 1u);
  struct Case {
    QuantPreset preset;
    const char* file;
    double tolerance;  // |delta logprob| of the first token's top 5 against f32
  };
  // Q8_0: ~2^-8 relative error a weight; Q4_K_M's Q5_0 rows have an 8x coarser step.
  for (const Case& k : {Case{QuantPreset::kQ8_0, "m.q8.gguf", 0.05},
                        Case{QuantPreset::kQ4_K_M, "m.q4km.gguf", 0.2}}) {
    SCOPED_TRACE(k.file);
    GgufExportOptions options;
    options.quantization = k.preset;
    export_gguf(dir / "m", dir / k.file, options);
    const auto three = run(k.file, "three.jsonl");
    const auto one = run(k.file, "one.jsonl");
    ASSERT_EQ(three.size(), 3u);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(three.at("b"), one.at("b"));  // tokens, log-probabilities, top-5: every bit
    const json& q = one.at("b")["top_logprobs"][0];
    const json& f = f32.at("b")["top_logprobs"][0];
    int shared = 0;
    double worst = 0;
    for (const auto& [token, lp] : f.items())
      if (q.contains(token)) {
        ++shared;
        worst = std::max(worst, std::fabs(q[token].get<double>() - lp.get<double>()));
      }
    EXPECT_GE(shared, 3);
    EXPECT_LE(worst, k.tolerance);  // measured: 0.012 (Q8_0), 0.072 (Q4_K_M)
  }
  // `model info` counts the Q8_0 matrices: 7 a layer, the embedding and the untied lm_head.
  const auto info = testing::run_command(env + blend.string() + " model info --model " +
                                         (dir / "m.q8.gguf").string());
  ASSERT_EQ(info.exit_code, 0) << info.output;
  const json j = json::parse(info.output);
  EXPECT_EQ(j["q8_0_tensors"], 7 * c.num_layers + 2);
  EXPECT_EQ(j["block_tensors"], json({{"Q8_0", 7 * c.num_layers + 2}}));
  EXPECT_EQ(j["dtype"], "F32");
  // The Q4_K_M file's folder keeps each of its four block types.
  const auto q4 = testing::run_command(env + blend.string() + " model info --model " +
                                       (dir / "m.q4km.gguf").string());
  ASSERT_EQ(q4.exit_code, 0) << q4.output;
  const json types = json::parse(q4.output)["block_tensors"];
  for (const char* t : {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}) EXPECT_TRUE(types.contains(t)) << types;
}

}  // namespace
}  // namespace blend
