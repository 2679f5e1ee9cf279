// Element types of weights and activations, and exact scalar conversions between them.
// bf16 and f16 are stored as raw uint16_t; conversion to f32 is exact, conversion from f32
// rounds to nearest even (what PyTorch and safetensors writers do).
//
// kQ8_0, kQ5_0, kQ4_K and kQ6_K are block types, ggml's (a weight matrix kept quantized from a
// GGUF file; layouts in core/quant.h): each row is cut into blocks (32 elements in 34 bytes for
// Q8_0, 32 in 22 for Q5_0, 256 in 144 for Q4_K, 256 in 210 for Q6_K) read as ggml's
// dequantize_row_* reads them. A block type has no element size: dtype_size throws for it, and
// code that reads elements must ask tensor_bytes / is_block_type first.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace blend {

enum class GgmlType : uint32_t;  // core/quant.h

enum class DType : uint8_t { kF32, kBF16, kF16, kQ8_0, kQ5_0, kQ4_K, kQ6_K };

inline constexpr int64_t kQ8_0BlockElems = 32;
inline constexpr int64_t kQ8_0BlockBytes = 34;

// Bytes of one element; throws blend::Error for a block type.
size_t dtype_size(DType t);
bool is_block_type(DType t);
// A block type's elements and bytes a block (1 and dtype_size for the others).
int64_t block_elems(DType t);
int64_t block_bytes(DType t);
// Bytes of one row of `cols` elements (whole blocks, else blend::Error).
int64_t row_bytes(DType t, int64_t cols);
// ggml's type of `t` (core/quant.h), for its codec and GGUF files.
GgmlType ggml_type_of(DType t);
// Bytes of a tensor of `shape` (row-major; a block type's rows are whole blocks of the last
// dimension, else blend::Error).
uint64_t tensor_bytes(DType t, const std::vector<int64_t>& shape);
std::string_view dtype_name(DType t);  // safetensors spelling: F32, BF16, F16 (Q8_0...: ggml's)
// F32, BF16, F16 only: a safetensors file stores block types as U8 bytes (model/safetensors.h).
std::optional<DType> parse_dtype(std::string_view safetensors_name);
// A block type by ggml's name ("Q8_0", "Q5_0", "Q4_K", "Q6_K").
std::optional<DType> parse_block_dtype(std::string_view ggml_name);

inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(uint32_t{h} << 16);
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Element i of a block-type row (its blocks from the row's first byte), and the whole row of
// `cols` elements, as ggml's dequantize_row_* gives them.
float block_row_element(DType t, const std::byte* row, int64_t i);
void dequantize_block_row(DType t, const std::byte* row, int64_t cols, float* out);

}  // namespace blend
