// Element types of weights and activations, and exact scalar conversions between them.
// bf16 and f16 are stored as raw uint16_t; conversion to f32 is exact, conversion from f32
// rounds to nearest even (what PyTorch and safetensors writers do).
//
// kQ8_0 is a block type, ggml's Q8_0 (a weight matrix kept quantized from a GGUF file): each row
// is cut into blocks of 32 elements, each block 34 bytes (an f16 scale d, then 32 int8 q), and
// element i is d * q[i]. It has no element size: dtype_size throws for it, and code that reads
// elements must ask tensor_bytes / is_block_type first.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace blend {

enum class DType : uint8_t { kF32, kBF16, kF16, kQ8_0 };

inline constexpr int64_t kQ8_0BlockElems = 32;
inline constexpr int64_t kQ8_0BlockBytes = 34;

// Bytes of one element; throws blend::Error for a block type.
size_t dtype_size(DType t);
bool is_block_type(DType t);
// Bytes of a tensor of `shape` (row-major; a block type's rows are whole blocks of the last
// dimension, else blend::Error).
uint64_t tensor_bytes(DType t, const std::vector<int64_t>& shape);
std::string_view dtype_name(DType t);  // safetensors spelling: F32, BF16, F16 (Q8_0: ggml's)
// F32, BF16, F16 only: a safetensors file stores Q8_0 as U8 bytes (model/safetensors.h).
std::optional<DType> parse_dtype(std::string_view safetensors_name);

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

// Element i of a Q8_0 row (its blocks from the row's first byte), and the whole row of `cols`
// elements: d * q, as ggml's dequantize_row_q8_0.
float q8_0_element(const std::byte* row, int64_t i);
void dequantize_q8_0_row(const std::byte* row, int64_t cols, float* out);

}  // namespace blend
