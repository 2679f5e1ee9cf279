#include "model/presets.h"

#include <algorithm>
#include <cmath>

namespace blend {
namespace {

// Shape-only presets: what the cost model reads (dimensions, vocabulary, context), with the
// architecture's own vocabulary; no token ids, default norm epsilon.
ModelConfig shape(std::string arch, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t ffn, int64_t vocab, double theta, int64_t max_pos) {
  ModelConfig c;
  c.architecture = std::move(arch);
  c.model_type = c.architecture == "Qwen2ForCausalLM"    ? "qwen2"
                 : c.architecture == "Qwen3ForCausalLM"  ? "qwen3"
                 : c.architecture == "Phi3ForCausalLM"   ? "phi3"
                 : c.architecture == "Gemma2ForCausalLM" ? "gemma2"
                 : c.architecture == "Gemma3ForCausalLM" ? "gemma3_text"
                                                         : "llama";
  c.hidden_size = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.intermediate_size = ffn;
  c.vocab_size = vocab;
  c.rope_theta = theta;
  c.max_position_embeddings = max_pos;
  c.attention_bias = c.architecture == "Qwen2ForCausalLM";
  c.qk_norm = c.architecture == "Qwen3ForCausalLM";
  c.fused_checkpoint_projections = c.architecture == "Phi3ForCausalLM";
  if (c.fused_checkpoint_projections) c.rms_norm_eps = 1e-5;  // Phi3Config's
  return c;
}

// The Llama-3 tokenizer's norm epsilon and token ids on a config.
ModelConfig with_llama3_tokens(ModelConfig c) {
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};  // end_of_text, eom, eot (Llama-3 instruct)
  return c;
}

// The materialisable presets: Llama-3 architecture and tokenizer (its vocabulary, RoPE base,
// context, norm epsilon and token ids) on a shape.
ModelConfig llama_like(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn,
                       bool tied) {
  ModelConfig c = shape("LlamaForCausalLM", hidden, layers, heads, kv_heads, ffn, kLlama3VocabSize,
                        500000.0, 8192);
  c.tie_word_embeddings = tied;
  return with_llama3_tokens(c);
}

// A Qwen3 shape (head_dim apart from hidden / heads, per-head q/k norms), materialisable with
// the Llama-3 tokenizer: Qwen3's layers, RoPE base, context and norm epsilon on the Llama-3
// vocabulary and token ids.
ModelConfig qwen3_like(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                       int64_t head_dim, int64_t ffn, bool tied) {
  ModelConfig c = shape("Qwen3ForCausalLM", hidden, layers, heads, kv_heads, ffn, kLlama3VocabSize,
                        1000000.0, 40960);
  c.head_dim = head_dim;
  c.tie_word_embeddings = tied;
  c = with_llama3_tokens(c);
  c.rms_norm_eps = 1e-6;
  return c;
}

// Gemma 2 / Gemma 3 on a shape: head_dim, query_pre_attn_scalar, the window and which layers
// slide (Gemma 2 alternates, starting with a sliding layer; Gemma 3 makes every `pattern`-th
// layer global), Gemma 3's q/k norms and local RoPE base, tied embeddings (both families'
// checkpoints have no lm_head).
ModelConfig gemma_shape(bool gemma3, int64_t hidden, int64_t layers, int64_t heads,
                        int64_t kv_heads, int64_t head_dim, int64_t ffn, int64_t vocab,
                        int64_t window, double query_pre_attn_scalar) {
  ModelConfig c = shape(gemma3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM", hidden, layers, heads,
                        kv_heads, ffn, vocab, gemma3 ? 1000000.0 : 10000.0, gemma3 ? 131072 : 8192);
  c.head_dim = head_dim;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.qk_norm = gemma3;
  GemmaSettings& g = c.gemma;
  g.enabled = true;
  g.query_pre_attn_scalar = query_pre_attn_scalar;
  g.sliding_window = window;
  const int64_t pattern = gemma3 ? 6 : 2;
  for (int64_t i = 0; i < layers; ++i) g.sliding_layers.push_back((i + 1) % pattern != 0);
  if (gemma3) {
    g.rope_local_theta = 10000.0;
  } else {
    g.attn_logit_softcapping = 50.0;
    g.final_logit_softcapping = 30.0;
  }
  return c;
}

// The materialisable Gemma presets: the shape on the Llama-3 vocabulary and token ids (the
// families' SentencePiece tokenizers are not read yet), Gemma's norm epsilon.
ModelConfig gemma_like(ModelConfig c) {
  c.vocab_size = kLlama3VocabSize;
  c = with_llama3_tokens(c);
  c.rms_norm_eps = 1e-6;
  return c;
}

// tiny-gemma2: 2 layers (sliding, global), a window of 12 (so a prompt crosses it mid-block)
// and soft caps small enough to bend a random model's scores and logits (Gemma 2's own 50 / 30
// would leave them linear). query_pre_attn_scalar is head_dim, as llama.cpp (the independent
// check) assumes on every Gemma shape but the 27B; the tests vary it.
ModelConfig tiny_gemma2() {
  ModelConfig c = gemma_like(gemma_shape(false, 64, 2, 4, 2, 32, 128, 0, 12, 32));
  c.gemma.attn_logit_softcapping = 5.0;
  c.gemma.final_logit_softcapping = 3.0;
  return c;
}

// tiny-gemma3: 2 layers (sliding with the local RoPE base, then global), q/k norms, and the
// linear rope_scaling of the larger Gemma 3 models, which applies to the global layer only.
ModelConfig tiny_gemma3() {
  ModelConfig c = gemma_like(gemma_shape(true, 64, 2, 4, 2, 32, 128, 0, 12, 32));
  c.gemma.sliding_layers = {true, false};
  c.rope_scaling = {.type = "linear", .factor = 8.0};
  return c;
}

// A shape-only preset `model init --allow-large` can write: the Llama architecture with the
// Llama-3 vocabulary, so the Llama-3 tokenizer fits it.
bool large_materialisable(const ModelPreset& p) {
  return !p.materialisable && p.config.architecture == "LlamaForCausalLM" &&
         p.config.vocab_size == kLlama3VocabSize;
}

// A Qwen2 shape (Q/K/V bias), materialisable with the Llama-3 tokenizer: Qwen2's RoPE base,
// context and norm epsilon on the Llama-3 vocabulary and token ids.
ModelConfig qwen2_like(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn,
                       bool tied) {
  ModelConfig c = shape("Qwen2ForCausalLM", hidden, layers, heads, kv_heads, ffn, kLlama3VocabSize,
                        1000000.0, 32768);
  c.tie_word_embeddings = tied;
  c = with_llama3_tokens(c);
  c.rms_norm_eps = 1e-6;
  return c;
}

ModelConfig llama_3_2_1b() {
  ModelConfig c = llama_like(2048, 16, 32, 8, 8192, true);
  c.max_position_embeddings = 131072;
  c.rope_scaling = {.type = "llama3",
                    .factor = 32.0,
                    .low_freq_factor = 1.0,
                    .high_freq_factor = 4.0,
                    .original_max_position_embeddings = 8192};
  return c;
}

// Phi-3's longrope on a shape: `half` short and long factors (stand-ins with the published
// ones' range, 1 to ~1.1 short and 1 to ~40 long, rising with the wavelength, not their values)
// and the attention factor transformers derives from max / original lengths.
ModelConfig with_longrope(ModelConfig c, int64_t original_max) {
  const int64_t half = c.rotary_dim() / 2;
  RopeScaling& s = c.rope_scaling;
  s.type = "longrope";
  s.original_max_position_embeddings = original_max;
  for (int64_t i = 0; i < half; ++i) {
    const double t = static_cast<double>(i) / static_cast<double>(std::max<int64_t>(half - 1, 1));
    s.short_factor.push_back(1.0 + 0.1 * t * t);
    s.long_factor.push_back(std::pow(40.0, t));
  }
  s.factor = static_cast<double>(c.max_position_embeddings) / static_cast<double>(original_max);
  s.attention_factor =
      std::sqrt(1.0 + std::log(s.factor) / std::log(static_cast<double>(original_max)));
  return c;
}

// A Phi-3 / Phi-4-mini shape (fused qkv_proj and gate_up_proj, partial RoPE, longrope) with the
// Llama-3 tokenizer: Phi's RoPE base and norm epsilon on the Llama-3 vocabulary and token ids
// (the families' own tokenizers are not shipped yet).
ModelConfig phi3_like(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn,
                      bool tied, double partial_rotary, int64_t max_pos, int64_t original_max) {
  ModelConfig c = shape("Phi3ForCausalLM", hidden, layers, heads, kv_heads, ffn, kLlama3VocabSize,
                        10000.0, max_pos);
  c.tie_word_embeddings = tied;
  c.partial_rotary_factor = partial_rotary;
  c = with_llama3_tokens(c);
  return with_longrope(c, original_max);
}

// Qwen3's published shapes: head_dim 128, its vocabulary and context.
ModelConfig qwen3_shape(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                        int64_t ffn) {
  ModelConfig c =
      shape("Qwen3ForCausalLM", hidden, layers, heads, kv_heads, ffn, 151936, 1000000, 40960);
  c.head_dim = 128;
  c.rms_norm_eps = 1e-6;
  return c;
}

ModelConfig phi3_mini_shape() {
  ModelConfig c = shape("Phi3ForCausalLM", 3072, 32, 32, 32, 8192, 32064, 10000, 4096);
  c.sliding_window = 2047;
  return c;
}

std::vector<ModelPreset> build_table() {
  const char* llama = "LlamaForCausalLM";
  const char* qwen2 = "Qwen2ForCausalLM";
  return {
      // Untied so the separate lm_head path is exercised by the tests.
      {"tiny", true,
       llama_like(/*hidden=*/64, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2,
                  /*ffn=*/128, /*tied=*/false)},
      {"smollm-135m", true, llama_like(576, 30, 9, 3, 1536, true)},
      {"llama-3.2-1b", true, llama_3_2_1b()},
      // head_dim 32 over hidden 64 with 4 heads: q is twice as wide as the residual stream.
      {"tiny-qwen3", true,
       qwen3_like(/*hidden=*/64, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2, /*head_dim=*/32,
                  /*ffn=*/128, /*tied=*/false)},
      {"qwen3-0.6b", true, qwen3_like(1024, 28, 16, 8, 128, 3072, true)},
      // Q/K/V bias (random, like the weights), so the llama.cpp comparison covers it.
      {"tiny-qwen2", true,
       qwen2_like(/*hidden=*/64, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2, /*ffn=*/128,
                  /*tied=*/false)},
      {"qwen2.5-0.5b", true, qwen2_like(896, 24, 14, 2, 4864, true)},
      // Partial RoPE (12 of 16 dims) and longrope; its 4096 context over an original 1024
      // selects the long factors unless served with --max-model-len 1024 or less.
      {"tiny-phi3", true,
       phi3_like(/*hidden=*/64, /*layers=*/2, /*heads=*/4, /*kv_heads=*/2, /*ffn=*/128,
                 /*tied=*/false, /*partial_rotary=*/0.75, /*max_pos=*/4096,
                 /*original_max=*/1024)},
      // Phi-4-mini's layers (3072 wide, 24 heads over 8 KV heads, 3/4 of each head rotated,
      // 131072 positions over an original 4096, tied) on the Llama-3 vocabulary.
      {"phi4-mini", true, phi3_like(3072, 32, 24, 8, 8192, true, 0.75, 131072, 4096)},
      {"tiny-gemma2", true, tiny_gemma2()},
      {"tiny-gemma3", true, tiny_gemma3()},
      // Gemma 3 1B's layers (hidden 1152, 4 heads of 256 over 1 KV head, window 512) at 6 of its
      // 26 layers: five local, one global.
      {"gemma3-1b-6l", true, gemma_like(gemma_shape(true, 1152, 6, 4, 1, 256, 6912, 0, 512, 256))},
      {"llama-3-8b", false, shape(llama, 4096, 32, 32, 8, 14336, 128256, 500000, 8192)},
      {"llama-3-70b", false, shape(llama, 8192, 80, 64, 8, 28672, 128256, 500000, 8192)},
      {"llama-2-7b", false, shape(llama, 4096, 32, 32, 32, 11008, 32000, 10000, 4096)},
      {"qwen2.5-7b", false, shape(qwen2, 3584, 28, 28, 4, 18944, 152064, 1000000, 32768)},
      {"qwen2.5-72b", false, shape(qwen2, 8192, 80, 64, 8, 29568, 152064, 1000000, 32768)},
      {"qwen3-8b", false, qwen3_shape(4096, 36, 32, 8, 12288)},
      // Phi-3-mini-4k: full RoPE, no scaling, a 2047-token window, its 32064-token vocabulary.
      {"phi3-mini", false, phi3_mini_shape()},
      {"gemma2-9b", false, gemma_shape(false, 3584, 42, 16, 8, 256, 14336, 256000, 4096, 256)},
      {"gemma3-27b", false, gemma_shape(true, 5376, 62, 32, 16, 128, 21504, 262208, 1024, 168)},
      {"deepseek-67b", false, shape(llama, 8192, 95, 64, 8, 22016, 102400, 10000, 4096)},
  };
}

const ModelPreset* find(std::string_view name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> table = build_table();
  return table;
}

std::optional<ModelConfig> find_model_preset(std::string_view name) {
  const ModelPreset* p = find(name);
  if (!p || !p->materialisable) return std::nullopt;
  return p->config;
}

std::optional<ModelConfig> find_large_model_preset(std::string_view name) {
  const ModelPreset* p = find(name);
  if (!p) return std::nullopt;
  if (p->materialisable) return p->config;
  if (!large_materialisable(*p)) return std::nullopt;
  return with_llama3_tokens(p->config);
}

std::optional<ModelConfig> find_model_shape(std::string_view name) {
  const ModelPreset* p = find(name);
  if (!p) return std::nullopt;
  return p->config;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets())
    if (p.materialisable) names.push_back(p.name);
  return names;
}

std::vector<std::string> shape_only_preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets())
    if (!p.materialisable) names.push_back(p.name);
  return names;
}

std::vector<std::string> large_model_preset_names() {
  std::vector<std::string> names;
  for (const ModelPreset& p : model_presets())
    if (large_materialisable(p)) names.push_back(p.name);
  return names;
}

}  // namespace blend
