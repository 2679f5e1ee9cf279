#include "core/dtype.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "core/quant.h"

namespace blend {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kQ8_0:
    case DType::kQ5_0:
    case DType::kQ4_K:
    case DType::kQ6_K:
      break;
  }
  throw Error("dtype " + std::string(dtype_name(t)) + " is a block type: it has no element size");
}

bool is_block_type(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ5_0 || t == DType::kQ4_K || t == DType::kQ6_K;
}

GgmlType ggml_type_of(DType t) {
  switch (t) {
    case DType::kQ8_0:
      return GgmlType::kQ8_0;
    case DType::kQ5_0:
      return GgmlType::kQ5_0;
    case DType::kQ4_K:
      return GgmlType::kQ4_K;
    case DType::kQ6_K:
      return GgmlType::kQ6_K;
    case DType::kF32:
      return GgmlType::kF32;
    case DType::kF16:
      return GgmlType::kF16;
    case DType::kBF16:
      return GgmlType::kBF16;
  }
  return GgmlType::kF32;
}

int64_t block_elems(DType t) {
  return is_block_type(t) ? ggml_block_layout(static_cast<uint32_t>(ggml_type_of(t)))->block_elems
                          : 1;
}

int64_t block_bytes(DType t) {
  return is_block_type(t) ? ggml_block_layout(static_cast<uint32_t>(ggml_type_of(t)))->block_bytes
                          : static_cast<int64_t>(dtype_size(t));
}

int64_t row_bytes(DType t, int64_t cols) {
  const int64_t elems = block_elems(t);
  if (cols % elems != 0)
    throw Error("a " + std::string(dtype_name(t)) + " tensor's rows hold whole blocks of " +
                std::to_string(elems) + " elements, not " + std::to_string(cols));
  return cols / elems * block_bytes(t);
}

uint64_t tensor_bytes(DType t, const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  if (!is_block_type(t)) return n * dtype_size(t);
  const int64_t cols = shape.empty() ? 1 : shape.back();
  if (cols == 0) return 0;
  return n / static_cast<uint64_t>(cols) * static_cast<uint64_t>(row_bytes(t, cols));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ5_0:
      return "Q5_0";
    case DType::kQ4_K:
      return "Q4_K";
    case DType::kQ6_K:
      return "Q6_K";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  return std::nullopt;
}

std::optional<DType> parse_block_dtype(std::string_view name) {
  for (DType t : {DType::kQ8_0, DType::kQ5_0, DType::kQ4_K, DType::kQ6_K})
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (incl. rounding up) -> inf
  if (abs < 0x38800000u) {                        // result is subnormal or zero
    if (abs < 0x33000000u) return sign;           // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (113 - exp) - ... keeps 10 bits after shift
    const uint32_t shifted = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = shifted;
    if (rem > half || (rem == half && (shifted & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u) - (uint32_t(127 - 15) << 23);
  return sign | static_cast<uint16_t>(r >> 13);
}

float block_row_element(DType t, const std::byte* row, int64_t i) {
  const int64_t elems = block_elems(t);
  float block[256];  // the largest block (the K-quants' 256)
  dequantize_row(static_cast<uint32_t>(ggml_type_of(t)), row + i / elems * block_bytes(t), block,
                 elems);
  return block[i % elems];
}

void dequantize_block_row(DType t, const std::byte* row, int64_t cols, float* out) {
  dequantize_row(static_cast<uint32_t>(ggml_type_of(t)), row, out, cols);
}

}  // namespace blend
