// Which ggml type each tensor of a GGUF file gets under one of llama-quantize's presets: the
// choice llama.cpp's llama_tensor_get_type makes (src/llama-quant.cpp, without an importance
// matrix, --pure or per-tensor overrides), so that `blend model quantize --type Q4_K_M` writes
// the file `llama-quantize F32.gguf Q4_K_M` writes.
//
// Q4_K_M, for the dense architectures blend exports:
//  - every matrix Q4_K, except:
//  - output.weight, or token_embd.weight when the embedding is tied (no output.weight): Q6_K,
//    or Q8_0 when its rows are not whole 256-element blocks;
//  - attn_v (and fused attn_qkv) and ffn_down: Q6_K in the layers use_more_bits picks
//    (the first and last eighth, and every third between), counted in file order;
//  - attn_v of a Llama with 80 layers and grouped KV heads (llama.cpp's "70B" type): Q5_K where
//    it would be Q4_K;
//  - then a type whose block does not divide a row falls back (Q4_K -> Q5_0, Q5_K -> Q5_1,
//    Q6_K -> Q8_0), and to F16 when that block does not divide it either.
// Q8_0: every matrix Q8_0 (F16 for rows that are not whole 32-element blocks).
// Tensors llama-quantize never quantizes (1-D tensors, names ending in "_norm.weight" or not in
// "weight", MoE routers "ffn_gate_inp.weight") keep the type they were planned with.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace blend {

enum class QuantPreset { kQ8_0, kQ4_K_M };

// "Q8_0" | "Q4_K_M" in any case (as llama-quantize reads them), or nullopt.
std::optional<QuantPreset> parse_quant_preset(const std::string& name);
const char* quant_preset_name(QuantPreset preset);
// general.file_type for the preset (llama_ftype: 7 and 15).
GgufFileType quant_preset_file_type(QuantPreset preset);

// What the recipe reads of the model: llama.cpp's architecture name, layers and heads.
struct QuantModelShape {
  std::string arch;  // "llama", "qwen2", ...
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
};

// One tensor of the file, in file order: its GGUF name, dimensions (ggml order: ne[0] is the row
// length) and the type it would have unquantized.
struct QuantTensor {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType planned = GgmlType::kF32;
};

// The type of each tensor, index for index.
std::vector<GgmlType> llama_quantize_types(QuantPreset preset, const QuantModelShape& model,
                                           const std::vector<QuantTensor>& tensors);

}  // namespace blend
