#include "gguf/quant_recipe.h"

#include <cctype>

#include "core/error.h"
#include "core/quant.h"

namespace blend {

namespace {

// llama-quant.cpp's tensor categories, by name as it matches them (first match wins).
enum class Category { kOutput, kTokenEmbd, kAttnV, kAttnK, kAttnQ, kAttnOutput, kFfnDown, kOther };

Category category_of(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (name == "output.weight") return Category::kOutput;
  if (name == "token_embd.weight") return Category::kTokenEmbd;
  // attn_qkv and attn_kv_b count as attn_v ("more sensitive to quantization").
  if (has("attn_qkv.weight") || has("attn_kv_b.weight") || has("attn_v.weight"))
    return Category::kAttnV;
  if (has("attn_k.weight")) return Category::kAttnK;
  if (has("attn_q.weight")) return Category::kAttnQ;
  if (has("attn_output.weight")) return Category::kAttnOutput;
  if (has("ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

// tensor_allows_quantization, for the tensors blend's export writes.
bool allows_quantization(const QuantTensor& t) {
  if (t.ne.size() < 2) return false;
  const std::string& n = t.name;
  return n.ends_with("weight") && n.find("_norm.weight") == std::string::npos &&
         n.find("ffn_gate_inp.weight") == std::string::npos;
}

// The first and last eighth of the layers and every third one between them.
bool use_more_bits(int64_t i_layer, int64_t n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

int64_t block_elems(GgmlType type) {
  return ggml_block_layout(static_cast<uint32_t>(type))->block_elems;
}

// tensor_type_fallback: a type whose block does not divide the row length.
GgmlType fallback(GgmlType type, int64_t row) {
  if (row % block_elems(type) == 0) return type;
  GgmlType to = type;
  switch (type) {
    case GgmlType::kQ4_K:
      to = GgmlType::kQ5_0;
      break;
    case GgmlType::kQ5_K:
      to = GgmlType::kQ5_1;
      break;
    case GgmlType::kQ6_K:
      to = GgmlType::kQ8_0;
      break;
    default:
      if (block_elems(type) > 32)
        throw Error(std::string("gguf: no fallback for ") +
                    ggml_type_display_name(static_cast<uint32_t>(type)));
  }
  return row % block_elems(to) == 0 ? to : GgmlType::kF16;
}

}  // namespace

std::optional<QuantPreset> parse_quant_preset(const std::string& name) {
  std::string upper = name;  // llama-quantize takes q4_k_m too
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (upper == "Q8_0") return QuantPreset::kQ8_0;
  if (upper == "Q4_K_M") return QuantPreset::kQ4_K_M;
  return std::nullopt;
}

const char* quant_preset_name(QuantPreset preset) {
  return preset == QuantPreset::kQ8_0 ? "Q8_0" : "Q4_K_M";
}

GgufFileType quant_preset_file_type(QuantPreset preset) {
  return preset == QuantPreset::kQ8_0 ? GgufFileType::kMostlyQ8_0 : GgufFileType::kMostlyQ4_K_M;
}

std::vector<GgmlType> llama_quantize_types(QuantPreset preset, const QuantModelShape& model,
                                           const std::vector<QuantTensor>& tensors) {
  // init_quantize_state_counters: the attn_v-like tensors, and whether output.weight exists.
  int64_t n_attention_wv = 0;
  bool tied = true;
  for (const QuantTensor& t : tensors) {
    const Category c = category_of(t.name);
    if (c == Category::kAttnV) ++n_attention_wv;
    if (c == Category::kOutput) tied = false;
  }
  const bool llama_70b =
      model.arch == "llama" && model.n_layers == 80 && model.n_heads != model.n_kv_heads;
  const GgmlType base = preset == QuantPreset::kQ8_0 ? GgmlType::kQ8_0 : GgmlType::kQ4_K;
  const bool q4_k_m = preset == QuantPreset::kQ4_K_M;
  int64_t i_attention_wv = 0, i_ffn_down = 0;
  std::vector<GgmlType> types;
  types.reserve(tensors.size());
  for (const QuantTensor& t : tensors) {
    if (!allows_quantization(t)) {
      types.push_back(t.planned);
      continue;
    }
    const int64_t row = t.ne[0];
    GgmlType type = base;
    const Category c = category_of(t.name);
    if (c == Category::kOutput || (tied && c == Category::kTokenEmbd)) {
      if (row % block_elems(type) != 0)
        type = GgmlType::kQ8_0;
      else if (type != GgmlType::kQ8_0)
        type = GgmlType::kQ6_K;
    } else if (c == Category::kAttnV) {
      if (q4_k_m && use_more_bits(i_attention_wv, n_attention_wv)) type = GgmlType::kQ6_K;
      if (llama_70b && type == GgmlType::kQ4_K) type = GgmlType::kQ5_K;
      ++i_attention_wv;
    } else if (c == Category::kFfnDown) {
      if (q4_k_m && use_more_bits(i_ffn_down, model.n_layers)) type = GgmlType::kQ6_K;
      ++i_ffn_down;
    }
    types.push_back(fallback(type, row));
  }
  return types;
}

}  // namespace blend
