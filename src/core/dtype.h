// Element types of weights and activations, and exact scalar conversions between them.
// bf16 and f16 are stored as raw uint16_t; conversion to f32 is exact, conversion from f32
// rounds to nearest even (what PyTorch and safetensors writers do).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace blend {

enum class DType : uint8_t { kF32, kBF16, kF16 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: F32, BF16, F16
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

}  // namespace blend
