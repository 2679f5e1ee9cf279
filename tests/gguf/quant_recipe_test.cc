#include "gguf/quant_recipe.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace blend {
namespace {

constexpr GgmlType kQ4K = GgmlType::kQ4_K, kQ6K = GgmlType::kQ6_K, kQ5K = GgmlType::kQ5_K,
                   kQ5_0 = GgmlType::kQ5_0, kQ8_0 = GgmlType::kQ8_0, kF16 = GgmlType::kF16,
                   kF32 = GgmlType::kF32, kBF16 = GgmlType::kBF16;

// A dense model's tensors in the order export_gguf writes them: embedding, then per layer the
// norm, q, k, v, o, the FFN norm, gate, up, down; the final norm and (untied) output last.
std::vector<QuantTensor> llama_tensors(int layers, int64_t hidden, int64_t ffn, bool tied) {
  std::vector<QuantTensor> t;
  t.push_back({"token_embd.weight", {hidden, 1000}, kBF16});
  for (int i = 0; i < layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    t.push_back({b + "attn_norm.weight", {hidden}, kF32});
    for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"})
      t.push_back({b + m + ".weight", {hidden, hidden}, kBF16});
    t.push_back({b + "ffn_norm.weight", {hidden}, kF32});
    t.push_back({b + "ffn_gate.weight", {hidden, ffn}, kBF16});
    t.push_back({b + "ffn_up.weight", {hidden, ffn}, kBF16});
    t.push_back({b + "ffn_down.weight", {ffn, hidden}, kBF16});
  }
  t.push_back({"output_norm.weight", {hidden}, kF32});
  if (!tied) t.push_back({"output.weight", {hidden, 1000}, kBF16});
  return t;
}

GgmlType type_of(const std::vector<QuantTensor>& tensors, const std::vector<GgmlType>& types,
                 const std::string& name) {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == name) return types[i];
  ADD_FAILURE() << "no tensor " << name;
  return kF32;
}

// llama.cpp's use_more_bits for 16 layers picks layers 0, 1 (first eighth), 14, 15 (last
// eighth) and 4, 7, 10, 13 (every third from the eighth): attn_v and ffn_down are Q6_K there,
// Q4_K elsewhere; q, k, o, gate and up always Q4_K; the untied output Q6_K, the embedding Q4_K.
TEST(QuantRecipe, Q4_K_MGivesSensitiveLayersAndTheOutputSixBits) {
  const auto tensors = llama_tensors(16, 256, 512, /*tied=*/false);
  const auto types = llama_quantize_types(QuantPreset::kQ4_K_M, {"llama", 16, 8, 8}, tensors);
  const std::vector<int> more_bits = {0, 1, 4, 7, 10, 13, 14, 15};
  for (int i = 0; i < 16; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    const bool more = std::find(more_bits.begin(), more_bits.end(), i) != more_bits.end();
    EXPECT_EQ(type_of(tensors, types, b + "attn_v.weight"), more ? kQ6K : kQ4K) << i;
    EXPECT_EQ(type_of(tensors, types, b + "ffn_down.weight"), more ? kQ6K : kQ4K) << i;
    for (const char* m : {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"})
      EXPECT_EQ(type_of(tensors, types, b + m + ".weight"), kQ4K) << b << m;
    EXPECT_EQ(type_of(tensors, types, b + "attn_norm.weight"), kF32);  // never quantized
  }
  EXPECT_EQ(type_of(tensors, types, "output.weight"), kQ6K);
  EXPECT_EQ(type_of(tensors, types, "token_embd.weight"), kQ4K);
  EXPECT_EQ(type_of(tensors, types, "output_norm.weight"), kF32);
}

// Without output.weight the embedding is the output and gets its type.
TEST(QuantRecipe, ATiedEmbeddingIsQuantizedAsTheOutput) {
  const auto tensors = llama_tensors(2, 256, 512, /*tied=*/true);
  const auto types = llama_quantize_types(QuantPreset::kQ4_K_M, {"llama", 2, 4, 2}, tensors);
  EXPECT_EQ(type_of(tensors, types, "token_embd.weight"), kQ6K);
  // The output's rows not whole 256-blocks: Q8_0.
  const auto narrow = llama_tensors(2, 576, 1536, /*tied=*/true);
  const auto narrow_types = llama_quantize_types(QuantPreset::kQ4_K_M, {"llama", 2, 9, 3}, narrow);
  EXPECT_EQ(type_of(narrow, narrow_types, "token_embd.weight"), kQ8_0);
}

// SmolLM-135M's width 576 is not a multiple of 256: every Q4_K falls back to Q5_0 and every Q6_K
// to Q8_0; ffn_down's rows (1,536) are whole 256-blocks and keep the K-quants. A width that is
// not a multiple of 32 either falls back to F16.
TEST(QuantRecipe, RowsThatAreNotWholeBlocksFallBack) {
  const auto tensors = llama_tensors(2, 576, 1536, /*tied=*/false);
  const auto types = llama_quantize_types(QuantPreset::kQ4_K_M, {"llama", 2, 9, 3}, tensors);
  // Two layers: use_more_bits is false for layer 0 and true for layer 1 (the last eighth).
  EXPECT_EQ(type_of(tensors, types, "blk.0.attn_v.weight"), kQ5_0);
  EXPECT_EQ(type_of(tensors, types, "blk.1.attn_v.weight"), kQ8_0);
  EXPECT_EQ(type_of(tensors, types, "blk.0.attn_q.weight"), kQ5_0);
  EXPECT_EQ(type_of(tensors, types, "blk.0.ffn_down.weight"), kQ4K);
  EXPECT_EQ(type_of(tensors, types, "blk.1.ffn_down.weight"), kQ6K);
  EXPECT_EQ(type_of(tensors, types, "output.weight"), kQ8_0);

  const auto odd = llama_tensors(2, 48, 96, /*tied=*/false);
  const auto odd_types = llama_quantize_types(QuantPreset::kQ4_K_M, {"llama", 2, 4, 2}, odd);
  EXPECT_EQ(type_of(odd, odd_types, "blk.0.attn_q.weight"), kF16);     // 48: not 32-blocks
  EXPECT_EQ(type_of(odd, odd_types, "blk.0.ffn_down.weight"), kQ5_0);  // 96: 32-blocks
  const auto q8_types = llama_quantize_types(QuantPreset::kQ8_0, {"llama", 2, 4, 2}, odd);
  EXPECT_EQ(type_of(odd, q8_types, "blk.0.attn_q.weight"), kF16);
  EXPECT_EQ(type_of(odd, q8_types, "blk.0.ffn_down.weight"), kQ8_0);
}

// Q8_0 is Q8_0 everywhere it fits, output and embedding included.
TEST(QuantRecipe, Q8_0QuantizesEveryMatrixToQ8_0) {
  const auto tensors = llama_tensors(4, 256, 512, /*tied=*/false);
  const auto types = llama_quantize_types(QuantPreset::kQ8_0, {"llama", 4, 4, 2}, tensors);
  for (size_t i = 0; i < tensors.size(); ++i)
    EXPECT_EQ(types[i], tensors[i].ne.size() == 2 ? kQ8_0 : kF32) << tensors[i].name;
}

// Phi-3's fused attn_qkv counts as attn_v (llama.cpp's category_is_attn_v); a Llama with 80
// layers and grouped KV heads (llama.cpp's "70B" type) gets Q5_K where attn_v would be Q4_K.
TEST(QuantRecipe, FusedQkvAndThe70BShapeFollowTheAttnVRule) {
  std::vector<QuantTensor> phi;
  for (int i = 0; i < 8; ++i)
    phi.push_back({"blk." + std::to_string(i) + ".attn_qkv.weight", {256, 768}, kBF16});
  const auto phi_types = llama_quantize_types(QuantPreset::kQ4_K_M, {"phi3", 8, 4, 4}, phi);
  // 8 layers: more bits at 0 (first eighth), 7 (last eighth), 3 and 6 ((i - 1) % 3 == 2).
  const std::vector<GgmlType> want = {kQ6K, kQ4K, kQ4K, kQ6K, kQ4K, kQ4K, kQ6K, kQ6K};
  EXPECT_EQ(phi_types, want);

  const auto big = llama_tensors(80, 256, 512, /*tied=*/false);
  const auto gqa = llama_quantize_types(QuantPreset::kQ4_K_M, {"llama", 80, 64, 8}, big);
  const auto mha = llama_quantize_types(QuantPreset::kQ4_K_M, {"llama", 80, 64, 64}, big);
  const auto qwen = llama_quantize_types(QuantPreset::kQ4_K_M, {"qwen2", 80, 64, 8}, big);
  EXPECT_EQ(type_of(big, gqa, "blk.11.attn_v.weight"), kQ5K);  // not a more-bits layer
  EXPECT_EQ(type_of(big, gqa, "blk.0.attn_v.weight"), kQ6K);
  EXPECT_EQ(type_of(big, mha, "blk.11.attn_v.weight"), kQ4K);
  EXPECT_EQ(type_of(big, qwen, "blk.11.attn_v.weight"), kQ4K);
  EXPECT_EQ(type_of(big, gqa, "blk.11.attn_q.weight"), kQ4K);
}

TEST(QuantRecipe, PresetNamesAreLlamaQuantizes) {
  EXPECT_EQ(parse_quant_preset("Q4_K_M"), QuantPreset::kQ4_K_M);
  EXPECT_EQ(parse_quant_preset("Q8_0"), QuantPreset::kQ8_0);
  EXPECT_EQ(parse_quant_preset("q4_k_m"), QuantPreset::kQ4_K_M);
  EXPECT_FALSE(parse_quant_preset("Q4_K_S"));
  EXPECT_EQ(quant_preset_file_type(QuantPreset::kQ4_K_M), GgufFileType::kMostlyQ4_K_M);
  EXPECT_EQ(static_cast<int>(GgufFileType::kMostlyQ4_K_M), 15);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
}

}  // namespace
}  // namespace blend
