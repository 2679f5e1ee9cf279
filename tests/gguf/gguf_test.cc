#include "gguf/gguf.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "gguf/export.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

RandomInitOptions init_options(DType dtype = DType::kBF16) {
  RandomInitOptions o;
  o.seed = 3;
  o.dtype = dtype;
  o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  return o;
}

json load_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::string tensor_bytes(const std::filesystem::path& file, const GgufFile& g,
                         const GgufTensorInfo& t) {
  std::ifstream in(file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(g.data_offset + t.offset));
  std::string s(t.nbytes, '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  EXPECT_TRUE(in.good()) << t.name;
  return s;
}

float element(const std::string& bytes, uint32_t ggml_type, size_t i) {
  if (ggml_type == static_cast<uint32_t>(GgmlType::kF32)) {
    float f;
    std::memcpy(&f, bytes.data() + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + i * 2, 2);
  return ggml_type == static_cast<uint32_t>(GgmlType::kBF16) ? bf16_to_f32(h) : f16_to_f32(h);
}

// One tiny model (untied, bf16) and its default export, shared by the tests below.
class GgufExport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    config_ = *find_model_preset("tiny");
    write_random_model(config_, model_dir(), init_options());
    summary_ = export_gguf(model_dir(), gguf_path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::filesystem::path model_dir() { return *dir_ / "tiny"; }
  static std::filesystem::path gguf_path() { return *dir_ / "tiny.gguf"; }

  static testing::TempDir* dir_;
  static ModelConfig config_;
  static GgufExportSummary summary_;
};

testing::TempDir* GgufExport::dir_ = nullptr;
ModelConfig GgufExport::config_;
GgufExportSummary GgufExport::summary_;

TEST_F(GgufExport, HeaderAndHyperParameters) {
  const GgufFile g = read_gguf(gguf_path());
  EXPECT_EQ(g.version, 3u);
  const auto specs = llama_tensor_specs(config_);
  EXPECT_EQ(g.tensors.size(), specs.size());  // tiny: no rope_freqs, lm_head untied
  EXPECT_EQ(summary_.tensor_count, specs.size());
  EXPECT_EQ(summary_.metadata_count, g.metadata.size());
  EXPECT_EQ(summary_.file_bytes, g.file_size);
  EXPECT_EQ(summary_.dtype, DType::kBF16);
  EXPECT_EQ(g.at("general.architecture").s, "llama");
  EXPECT_EQ(g.at("general.name").s, "tiny");
  EXPECT_EQ(g.at("general.alignment").u, 32u);
  EXPECT_EQ(g.at("general.file_type").u, 32u);  // MOSTLY_BF16
  EXPECT_EQ(g.at("general.quantization_version").u, 2u);
  EXPECT_EQ(g.at("llama.block_count").u, 2u);
  EXPECT_EQ(g.at("llama.context_length").u, 8192u);
  EXPECT_EQ(g.at("llama.embedding_length").u, 64u);
  EXPECT_EQ(g.at("llama.feed_forward_length").u, 128u);
  EXPECT_EQ(g.at("llama.attention.head_count").u, 4u);
  EXPECT_EQ(g.at("llama.attention.head_count_kv").u, 2u);
  EXPECT_EQ(g.at("llama.attention.head_count").type, GgufType::kUint32);
  EXPECT_EQ(g.at("llama.rope.freq_base").type, GgufType::kFloat32);
  EXPECT_EQ(g.at("llama.rope.freq_base").f, 500000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(g.at("llama.attention.layer_norm_rms_epsilon").f), 1e-5f);
  EXPECT_EQ(g.at("llama.rope.dimension_count").u, 16u);
  EXPECT_EQ(g.at("llama.vocab_size").u, 128256u);
  EXPECT_EQ(g.at("llama.attention.key_length").u, 16u);  // config.json names head_dim
  EXPECT_EQ(g.at("llama.attention.value_length").u, 16u);
  EXPECT_EQ(g.find("llama.rope.scaling.type"), nullptr);
}

TEST_F(GgufExport, TensorNamesShapesTypesAndLayout) {
  const GgufFile g = read_gguf(gguf_path());
  auto expect = [&](const std::string& name, std::vector<uint64_t> ne, GgmlType type) {
    const GgufTensorInfo* t = g.tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->ne, ne) << name;
    EXPECT_EQ(t->type, static_cast<uint32_t>(type)) << name;
  };
  expect("token_embd.weight", {64, 128256}, GgmlType::kBF16);
  expect("output.weight", {64, 128256}, GgmlType::kBF16);
  expect("output_norm.weight", {64}, GgmlType::kF32);
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    expect(b + "attn_norm.weight", {64}, GgmlType::kF32);
    expect(b + "ffn_norm.weight", {64}, GgmlType::kF32);
    expect(b + "attn_q.weight", {64, 64}, GgmlType::kBF16);
    expect(b + "attn_k.weight", {64, 32}, GgmlType::kBF16);
    expect(b + "attn_v.weight", {64, 32}, GgmlType::kBF16);
    expect(b + "attn_output.weight", {64, 64}, GgmlType::kBF16);
    expect(b + "ffn_gate.weight", {64, 128}, GgmlType::kBF16);
    expect(b + "ffn_up.weight", {64, 128}, GgmlType::kBF16);
    expect(b + "ffn_down.weight", {128, 64}, GgmlType::kBF16);
  }
  EXPECT_EQ(g.tensor("rope_freqs.weight"), nullptr);
  // Data starts aligned; tensors are aligned, in order, without overlap; the file ends padded.
  EXPECT_EQ(g.data_offset % 32, 0u);
  uint64_t end = 0;
  for (const auto& t : g.tensors) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_GE(t.offset, end) << t.name;
    EXPECT_LT(t.offset - end, 32u) << t.name;
    end = t.offset + t.nbytes;
  }
  EXPECT_EQ(g.file_size, g.data_offset + (end + 31) / 32 * 32);
}

TEST_F(GgufExport, QueryAndKeyRowsArePermutedLikeTheConverter) {
  const GgufFile g = read_gguf(gguf_path());
  const TensorStore store = TensorStore::open_dir(model_dir());
  // LlamaModel.permute: w.reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2).reshape(w.shape)
  auto check = [&](const std::string& gguf_name, const std::string& hf_name, int64_t n_head) {
    const TensorView& src = store.get(hf_name);
    const GgufTensorInfo* t = g.tensor(gguf_name);
    ASSERT_NE(t, nullptr);
    const std::string bytes = tensor_bytes(gguf_path(), g, *t);
    const int64_t rows = src.shape[0], cols = src.shape[1], half = rows / n_head / 2;
    for (int64_t h = 0; h < n_head; ++h)
      for (int64_t i = 0; i < half; ++i)
        for (int64_t j = 0; j < 2; ++j)
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t out = ((h * half + i) * 2 + j) * cols + c;  // [h][i][j][c]
            const int64_t in = ((h * 2 + j) * half + i) * cols + c;   // [h][j][i][c]
            ASSERT_EQ(element(bytes, t->type, static_cast<size_t>(out)), src.at(in))
                << gguf_name << " h=" << h << " i=" << i << " j=" << j << " c=" << c;
          }
    EXPECT_EQ(gguf_permuted_source_row(1, n_head, rows), half);
    EXPECT_EQ(gguf_permuted_source_row(2, n_head, rows), 1);
  };
  check("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 4);
  check("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", 2);
  // Everything else is the checkpoint's bytes (bf16 -> bf16) or widened to F32 (norms).
  auto same = [&](const std::string& gguf_name, const std::string& hf_name) {
    const TensorView& src = store.get(hf_name);
    const GgufTensorInfo* t = g.tensor(gguf_name);
    ASSERT_NE(t, nullptr);
    const std::string bytes = tensor_bytes(gguf_path(), g, *t);
    for (int64_t i = 0; i < src.numel(); i += 7)
      ASSERT_EQ(element(bytes, t->type, static_cast<size_t>(i)), src.at(i)) << gguf_name << i;
  };
  same("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight");
  same("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight");
  same("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight");
  same("output_norm.weight", "model.norm.weight");
  same("token_embd.weight", "model.embed_tokens.weight");
  same("output.weight", "lm_head.weight");
}

TEST_F(GgufExport, TokenizerMatchesTokenizerJson) {
  const GgufFile g = read_gguf(gguf_path());
  const json tok = load_json(std::filesystem::path(BLEND_TEST_TOKENIZER_DIR) / "tokenizer.json");
  const json tcfg =
      load_json(std::filesystem::path(BLEND_TEST_TOKENIZER_DIR) / "tokenizer_config.json");
  EXPECT_EQ(g.at("tokenizer.ggml.model").s, "gpt2");
  EXPECT_EQ(g.at("tokenizer.ggml.pre").s, "llama-bpe");
  const GgufValue& tokens = g.at("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.array_type, GgufType::kString);
  ASSERT_EQ(tokens.strings.size(), 128256u);
  for (const auto& [text, id] : tok["model"]["vocab"].items())
    ASSERT_EQ(tokens.strings[id.get<size_t>()], text);
  const GgufValue& types = g.at("tokenizer.ggml.token_type");
  ASSERT_EQ(types.array_type, GgufType::kInt32);
  ASSERT_EQ(types.ints.size(), 128256u);
  for (const auto& a : tok["added_tokens"]) {
    const size_t id = a["id"].get<size_t>();
    EXPECT_EQ(tokens.strings[id], a["content"].get<std::string>());
    EXPECT_EQ(types.ints[id], 3);  // every Llama-3 added token is special: control
  }
  EXPECT_EQ(types.ints[0], 1);
  EXPECT_EQ(types.ints[127999], 1);
  EXPECT_EQ(tokens.strings[128009], "<|eot_id|>");
  const GgufValue& merges = g.at("tokenizer.ggml.merges");
  ASSERT_EQ(merges.strings.size(), tok["model"]["merges"].size());
  for (size_t i = 0; i < merges.strings.size(); ++i) {
    const json& m = tok["model"]["merges"][i];
    const std::string want = m.is_string()
                                 ? m.get<std::string>()
                                 : m[0].get<std::string>() + " " + m[1].get<std::string>();
    ASSERT_EQ(merges.strings[i], want) << i;
  }
  EXPECT_EQ(g.at("tokenizer.ggml.bos_token_id").u, 128000u);
  EXPECT_EQ(g.at("tokenizer.ggml.eos_token_id").u, 128001u);  // tokenizer_config eos_token
  EXPECT_EQ(g.at("tokenizer.ggml.eot_token_id").u, 128009u);
  EXPECT_EQ(g.at("tokenizer.chat_template").s, tcfg["chat_template"].get<std::string>());
}

TEST_F(GgufExport, ConvertsToF16AndF32) {
  const TensorStore store = TensorStore::open_dir(model_dir());
  const TensorView& embd = store.get("model.embed_tokens.weight");
  const TensorView& q = store.get("model.layers.0.self_attn.q_proj.weight");
  for (DType d : {DType::kF16, DType::kF32}) {
    const auto path = *dir_ / (std::string(dtype_name(d)) + ".gguf");
    GgufExportOptions o;
    o.dtype = d;
    EXPECT_EQ(export_gguf(model_dir(), path, o).dtype, d);
    const GgufFile g = read_gguf(path);
    const bool f16 = d == DType::kF16;
    EXPECT_EQ(g.at("general.file_type").u, f16 ? 1u : 0u);
    const GgufTensorInfo* t = g.tensor("token_embd.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, static_cast<uint32_t>(f16 ? GgmlType::kF16 : GgmlType::kF32));
    const std::string bytes = tensor_bytes(path, g, *t);
    for (int64_t i = 0; i < embd.numel(); i += 4099) {
      const float want = f16 ? f16_to_f32(f32_to_f16(embd.at(i))) : embd.at(i);
      ASSERT_EQ(element(bytes, t->type, static_cast<size_t>(i)), want) << i;
    }
    // Permutation with conversion: row 1 of the GGUF q is row head_dim/2 of the checkpoint.
    const GgufTensorInfo* tq = g.tensor("blk.0.attn_q.weight");
    ASSERT_NE(tq, nullptr);
    const std::string qb = tensor_bytes(path, g, *tq);
    for (int64_t c = 0; c < 64; ++c) {
      const float want = f16 ? f16_to_f32(f32_to_f16(q.at(8 * 64 + c))) : q.at(8 * 64 + c);
      ASSERT_EQ(element(qb, tq->type, static_cast<size_t>(64 + c)), want);
    }
    EXPECT_EQ(g.tensor("blk.0.attn_norm.weight")->type, static_cast<uint32_t>(GgmlType::kF32));
  }
}

TEST(GgufExportVariants, Llama3RopeScalingBecomesRopeFreqs) {
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
  const GgufFile g = read_gguf(dir / "m.gguf");
  EXPECT_EQ(g.tensor("output.weight"), nullptr);  // tied
  EXPECT_EQ(g.tensors.size(), llama_tensor_specs(c).size() + 1);
  const GgufTensorInfo* t = g.tensor("rope_freqs.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, std::vector<uint64_t>{8});
  EXPECT_EQ(t->type, static_cast<uint32_t>(GgmlType::kF32));
  const std::string bytes = tensor_bytes(dir / "m.gguf", g, *t);
  // The piecewise Llama-3 rule in double precision; the export computes in float32.
  bool saw_low = false, saw_high = false, saw_smooth = false;
  for (int i = 0; i < 8; ++i) {
    const double freq = 1.0 / std::pow(500000.0, 2.0 * i / 16.0);
    const double wavelen = 2 * M_PI / freq;
    double want;
    if (wavelen < 8192.0 / 4.0) {
      want = 1.0;
      saw_high = true;
    } else if (wavelen > 8192.0) {
      want = 32.0;
      saw_low = true;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = 1.0 / ((1 - smooth) / 32.0 + smooth);
      saw_smooth = true;
    }
    EXPECT_NEAR(element(bytes, t->type, i), want, 1e-4 * want) << i;
  }
  EXPECT_TRUE(saw_low && saw_high && saw_smooth);
  EXPECT_EQ(llama3_rope_factors(c).size(), 8u);
}

TEST(GgufExportVariants, Qwen2KeepsRowOrderAndWritesBiasesAsF32) {
  testing::TempDir dir;
  ModelConfig c = *find_model_preset("tiny");
  c.architecture = "Qwen2ForCausalLM";
  c.model_type = "qwen2";
  c.attention_bias = true;
  write_random_model(c, dir / "q", init_options());
  export_gguf(dir / "q", dir / "q.gguf");
  const GgufFile g = read_gguf(dir / "q.gguf");
  EXPECT_EQ(g.at("general.architecture").s, "qwen2");
  EXPECT_EQ(g.at("qwen2.block_count").u, 2u);
  const TensorStore store = TensorStore::open_dir(dir / "q");
  const GgufTensorInfo* qb = g.tensor("blk.0.attn_q.bias");
  ASSERT_NE(qb, nullptr);
  EXPECT_EQ(qb->type, static_cast<uint32_t>(GgmlType::kF32));
  EXPECT_EQ(qb->ne, std::vector<uint64_t>{64});
  const std::string bytes = tensor_bytes(dir / "q.gguf", g, *qb);
  const TensorView& src = store.get("model.layers.0.self_attn.q_proj.bias");
  for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(element(bytes, qb->type, i), src.at(i));
  const GgufTensorInfo* qw = g.tensor("blk.0.attn_q.weight");
  ASSERT_NE(qw, nullptr);
  const std::string wb = tensor_bytes(dir / "q.gguf", g, *qw);
  const TensorView& w = store.get("model.layers.0.self_attn.q_proj.weight");
  for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(element(wb, qw->type, i), w.at(i));
}

// Qwen3 as llama.cpp's converter writes it: architecture qwen3, the head norms as
// blk.N.attn_q_norm / attn_k_norm in f32, q/k rows in Hugging Face order, head_dim as key_length.
TEST(GgufExportVariants, Qwen3WritesHeadNormsAndItsHeadDim) {
  testing::TempDir dir;
  write_random_model(*find_model_preset("tiny-qwen3"), dir / "q", init_options());
  export_gguf(dir / "q", dir / "q.gguf");
  const GgufFile g = read_gguf(dir / "q.gguf");
  EXPECT_EQ(g.at("general.architecture").s, "qwen3");
  EXPECT_EQ(g.at("qwen3.attention.key_length").u, 32u);
  EXPECT_EQ(g.at("qwen3.embedding_length").u, 64u);
  const TensorStore store = TensorStore::open_dir(dir / "q");
  const GgufTensorInfo* kn = g.tensor("blk.1.attn_k_norm.weight");
  ASSERT_NE(kn, nullptr);
  EXPECT_EQ(kn->type, static_cast<uint32_t>(GgmlType::kF32));
  EXPECT_EQ(kn->ne, std::vector<uint64_t>{32});
  const std::string bytes = tensor_bytes(dir / "q.gguf", g, *kn);
  const TensorView& src = store.get("model.layers.1.self_attn.k_norm.weight");
  for (int64_t i = 0; i < 32; ++i) ASSERT_EQ(element(bytes, kn->type, i), src.at(i));
  ASSERT_NE(g.tensor("blk.0.attn_q_norm.weight"), nullptr);
  const GgufTensorInfo* qw = g.tensor("blk.0.attn_q.weight");
  ASSERT_NE(qw, nullptr);
  EXPECT_EQ(qw->ne, (std::vector<uint64_t>{64, 128}));
  const std::string wb = tensor_bytes(dir / "q.gguf", g, *qw);
  const TensorView& w = store.get("model.layers.0.self_attn.q_proj.weight");
  for (int64_t i = 0; i < w.numel(); i += 97) ASSERT_EQ(element(wb, qw->type, i), w.at(i));
}

// llama.cpp's llama graph has no sliding window: a Mistral whose window is shorter than its
// context is refused by name, not written as a file that computes another model past the window.
TEST(GgufExportErrors, SlidingWindowShorterThanTheContextIsRefused) {
  testing::TempDir dir;
  ModelConfig c = *find_model_preset("tiny");
  c.architecture = "MistralForCausalLM";
  c.model_type = "mistral";
  c.sliding_window = 32;
  write_random_model(c, dir / "m", init_options());
  try {
    export_gguf(dir / "m", dir / "m.gguf");
    ADD_FAILURE() << "exported a sliding-window model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window 32"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "m.gguf"));
  c.sliding_window = c.max_position_embeddings;  // a window as long as the context changes nothing
  write_random_model(c, dir / "w", init_options());
  export_gguf(dir / "w", dir / "w.gguf");
  EXPECT_EQ(read_gguf(dir / "w.gguf").at("general.architecture").s, "llama");
}

// Phi-3 as llama.cpp's converter writes it: architecture phi3, fused blk.N.attn_qkv and ffn_up
// (gate rows, then up rows) with the checkpoint's rows, longrope's factors as
// rope_factors_long / rope_factors_short, the rotated dims and the original context length.
TEST(GgufExportVariants, Phi3WritesFusedTensorsAndLongropeFactors) {
  testing::TempDir dir;
  const ModelConfig config = *find_model_preset("tiny-phi3");
  write_random_model(config, dir / "p", init_options());
  export_gguf(dir / "p", dir / "p.gguf");
  const GgufFile g = read_gguf(dir / "p.gguf");
  EXPECT_EQ(g.at("general.architecture").s, "phi3");
  EXPECT_EQ(g.at("phi3.rope.dimension_count").u, 12u);
  EXPECT_EQ(g.at("phi3.rope.scaling.original_context_length").u, 1024u);
  EXPECT_EQ(g.at("phi3.context_length").u, 4096u);
  EXPECT_EQ(g.at("phi3.attention.sliding_window").u, 0u);
  EXPECT_FLOAT_EQ(static_cast<float>(g.at("phi3.rope.scaling.attn_factor").f),
                  static_cast<float>(std::sqrt(1.0 + std::log(4.0) / std::log(1024.0))));
  const TensorStore store = TensorStore::open_dir(dir / "p");
  for (const auto& [gguf_name, hf_name, rows] :
       {std::tuple{"blk.1.attn_qkv.weight", "model.layers.1.self_attn.qkv_proj.weight", 128},
        std::tuple{"blk.0.ffn_up.weight", "model.layers.0.mlp.gate_up_proj.weight", 256}}) {
    const GgufTensorInfo* t = g.tensor(gguf_name);
    ASSERT_NE(t, nullptr) << gguf_name;
    EXPECT_EQ(t->ne, (std::vector<uint64_t>{64, static_cast<uint64_t>(rows)}));
    const std::string bytes = tensor_bytes(dir / "p.gguf", g, *t);
    const TensorView& w = store.get(hf_name);
    for (int64_t i = 0; i < w.numel(); i += 31) ASSERT_EQ(element(bytes, t->type, i), w.at(i));
  }
  EXPECT_EQ(g.tensor("blk.0.ffn_gate.weight"), nullptr);
  for (const auto& [name, factors] :
       {std::pair{"rope_factors_long.weight", &config.rope_scaling.long_factor},
        std::pair{"rope_factors_short.weight", &config.rope_scaling.short_factor}}) {
    const GgufTensorInfo* t = g.tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, static_cast<uint32_t>(GgmlType::kF32));
    ASSERT_EQ(t->ne, std::vector<uint64_t>{6});
    const std::string bytes = tensor_bytes(dir / "p.gguf", g, *t);
    for (int64_t i = 0; i < 6; ++i)
      EXPECT_EQ(element(bytes, t->type, i), static_cast<float>((*factors)[i]));
  }
}

// Gemma: llama.cpp's gemma2 / gemma3 names and keys, its norms stored as (1 + w) (what
// convert_hf_to_gguf.py writes, llama.cpp multiplying by the stored weight), the output's norms
// apart from the FFN's, which layers slide as one 0/1 per layer, no separate output head.
TEST(GgufExportVariants, GemmaWritesOnePlusNormsCapsAndLayerWindows) {
  testing::TempDir dir;
  write_random_model(*find_model_preset("tiny-gemma2"), dir / "g2", init_options());
  export_gguf(dir / "g2", dir / "g2.gguf");
  const GgufFile g = read_gguf(dir / "g2.gguf");
  EXPECT_EQ(g.at("general.architecture").s, "gemma2");
  EXPECT_FLOAT_EQ(g.at("gemma2.attn_logit_softcapping").f, 5.0);
  EXPECT_FLOAT_EQ(g.at("gemma2.final_logit_softcapping").f, 3.0);
  EXPECT_EQ(g.at("gemma2.attention.sliding_window").u, 12u);
  EXPECT_EQ(g.at("gemma2.attention.sliding_window_pattern").ints, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(g.tensor("output.weight"), nullptr);  // tied
  const TensorStore store = TensorStore::open_dir(dir / "g2");
  const std::pair<const char*, const char*> norms[] = {
      {"blk.1.post_attention_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
      {"blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"},
      {"blk.1.post_ffw_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"},
      {"output_norm.weight", "model.norm.weight"}};
  for (const auto& [gguf_name, hf_name] : norms) {
    const GgufTensorInfo* t = g.tensor(gguf_name);
    ASSERT_NE(t, nullptr) << gguf_name;
    const std::string bytes = tensor_bytes(dir / "g2.gguf", g, *t);
    const TensorView& src = store.get(hf_name);
    for (int64_t i = 0; i < src.numel(); ++i)
      ASSERT_EQ(element(bytes, t->type, i), 1.0f + src.at(i)) << gguf_name << " " << i;
  }

  write_random_model(*find_model_preset("tiny-gemma3"), dir / "g3", init_options());
  export_gguf(dir / "g3", dir / "g3.gguf");
  const GgufFile g3 = read_gguf(dir / "g3.gguf");
  EXPECT_EQ(g3.at("general.architecture").s, "gemma3");
  EXPECT_FLOAT_EQ(g3.at("gemma3.rope.freq_base_swa").f, 10000.0);
  EXPECT_FLOAT_EQ(g3.at("gemma3.rope.freq_base").f, 1000000.0);
  EXPECT_EQ(g3.at("gemma3.rope.scaling.type").s, "linear");
  EXPECT_EQ(g3.find("gemma3.attn_logit_softcapping"), nullptr);
  ASSERT_NE(g3.tensor("blk.0.attn_q_norm.weight"), nullptr);

  // A scale llama.cpp would not apply is refused rather than exported as another model.
  ModelConfig odd = *find_model_preset("tiny-gemma2");
  odd.gemma.query_pre_attn_scalar = 24;
  write_random_model(odd, dir / "odd", init_options());
  try {
    export_gguf(dir / "odd", dir / "odd.gguf");
    FAIL() << "exported query_pre_attn_scalar 24";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("query_pre_attn_scalar"), std::string::npos) << e.what();
  }
}

TEST(GgufExportErrors, BadModelFoldersAreErrorsAndLeaveNoFile) {
  testing::TempDir dir;
  EXPECT_THROW(export_gguf(dir / "missing", dir / "a.gguf"), Error);
  write_random_model(*find_model_preset("tiny"), dir / "m", init_options());

  // Truncated weights.
  std::filesystem::create_directories(dir / "trunc");
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(dir / "m" / f, dir / "trunc" / f);
  const std::string weights = testing::read_file(dir / "m" / "model.safetensors");
  testing::write_file(dir / "trunc" / "model.safetensors", weights.substr(0, weights.size() / 2));
  EXPECT_THROW(export_gguf(dir / "trunc", dir / "b.gguf"), Error);
  EXPECT_FALSE(std::filesystem::exists(dir / "b.gguf"));

  // No tokenizer.json.
  std::filesystem::remove(dir / "trunc" / "model.safetensors");
  std::filesystem::copy_file(dir / "m" / "model.safetensors", dir / "trunc" / "model.safetensors");
  std::filesystem::remove(dir / "trunc" / "tokenizer.json");
  EXPECT_THROW(export_gguf(dir / "trunc", dir / "c.gguf"), Error);
  EXPECT_FALSE(std::filesystem::exists(dir / "c.gguf"));
  EXPECT_FALSE(std::filesystem::exists(dir / "c.gguf.tmp"));

  // A SentencePiece-style (byte_fallback) tokenizer has no faithful GGUF "gpt2" equivalent.
  json tok = load_json(dir / "m" / "tokenizer.json");
  tok["model"]["byte_fallback"] = true;
  testing::write_file(dir / "trunc" / "tokenizer.json", tok.dump());
  EXPECT_THROW(export_gguf(dir / "trunc", dir / "d.gguf"), Error);
  EXPECT_FALSE(std::filesystem::exists(dir / "d.gguf"));
}

TEST(GgufReader, RejectsBadAndTruncatedFiles) {
  testing::TempDir dir;
  testing::write_file(dir / "bad.gguf", std::string(64, 'x'));
  EXPECT_THROW(read_gguf(dir / "bad.gguf"), Error);
  EXPECT_THROW(read_gguf(dir / "none.gguf"), Error);
  write_random_model(*find_model_preset("tiny"), dir / "m", init_options());
  export_gguf(dir / "m", dir / "m.gguf");
  const std::string full = testing::read_file(dir / "m.gguf");
  // Cut inside the metadata, and inside the tensor data.
  testing::write_file(dir / "t1.gguf", full.substr(0, 5000));
  EXPECT_THROW(read_gguf(dir / "t1.gguf"), Error);
  testing::write_file(dir / "t2.gguf", full.substr(0, full.size() - 1000));
  EXPECT_THROW(read_gguf(dir / "t2.gguf"), Error);
}

TEST(GgufCli, ExportGgufCommand) {
  const std::filesystem::path blend = BLEND_BINARY;
  if (!std::filesystem::exists(blend)) GTEST_SKIP() << "blend binary not built: " << blend;
  testing::TempDir dir;
  write_random_model(*find_model_preset("tiny"), dir / "m", init_options());
  const auto ok =
      testing::run_command(blend.string() + " model export-gguf --model " + (dir / "m").string() +
                           " --out " + (dir / "m.gguf").string() + " --dtype f16 2>&1");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("GGUF"), std::string::npos) << ok.output;
  const GgufFile g = read_gguf(dir / "m.gguf");
  EXPECT_EQ(g.at("general.file_type").u, 1u);
  const auto bad_dtype =
      testing::run_command(blend.string() + " model export-gguf --model " + (dir / "m").string() +
                           " --out " + (dir / "x.gguf").string() + " --dtype q4 2>&1");
  EXPECT_NE(bad_dtype.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(dir / "x.gguf"));
  const auto missing = testing::run_command(blend.string() + " model export-gguf --model " +
                                            (dir / "nope").string() + " --out " +
                                            (dir / "y.gguf").string() + " 2>&1");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("nope"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace blend
