// ggml's block-quantized tensor types (ggml-common.h block_q4_0 ... block_q6_K): their layouts,
// dequantization following ggml's reference dequantize_row_* (ggml-quants.c) operation by
// operation, and the reference quantizers of Q8_0, Q4_0, Q5_0, Q4_K, Q5_K and Q6_K.
//
// Layouts (little-endian, ggml_fp16_t = IEEE half):
//   Q4_0  32 elems, 18 B: f16 d; u8 qs[16]          x = d * ((q & 15) - 8)
//   Q4_1  32 elems, 20 B: f16 d, m; u8 qs[16]        x = d * (q & 15) + m
//   Q5_0  32 elems, 22 B: f16 d; u8 qh[4]; qs[16]    x = d * (q5 - 16)
//   Q5_1  32 elems, 24 B: f16 d, m; u8 qh[4]; qs[16] x = d * q5 + m
//   Q8_0  32 elems, 34 B: f16 d; i8 qs[32]           x = d * q
//   Q2_K 256 elems, 84 B; Q3_K 256, 110 B; Q4_K 256, 144 B; Q5_K 256, 176 B; Q6_K 256, 210 B
//   (the K-quants' super-block scales and 6-bit packed sub-block scales/mins as ggml packs them).
// In the 32-element types, byte j of qs holds element j in its low nibble and element j + 16 in
// its high nibble.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace blend {

// The ggml tensor types this code reads (ggml.h enum ggml_type numbering; the block-quantized
// ones are laid out above). export_gguf (gguf/) writes F32, F16, BF16 and, quantized, Q8_0,
// Q4_K and Q6_K.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// How a type stores a row: `block_elems` elements in `block_bytes` bytes (1 and 4 for F32, 1 and
// 2 for F16/BF16). A row of n elements (n a multiple of block_elems) takes
// n / block_elems * block_bytes bytes.
struct GgmlBlockLayout {
  uint32_t block_elems = 1;
  uint32_t block_bytes = 4;
  const char* name = "F32";  // gguf-py's spelling: "Q4_K", "BF16" (ggml_type_name: "q4_K")
};

// The layout of ggml type `type`, or nullopt for a type this code cannot read.
std::optional<GgmlBlockLayout> ggml_block_layout(uint32_t type);

// A printable name for any ggml type number ("Q4_K", "IQ2_XS"; "unknown" for a number ggml does
// not assign), for error messages.
const char* ggml_type_display_name(uint32_t type);

// The 6-bit scale and min of sub-block j (of 8) of a Q4_K / Q5_K super-block, from its 12 packed
// scale bytes (the bytes after d and dmin), as ggml's get_scale_min_k4.
void unpack_q4_k_scale_min(int j, const uint8_t* packed, uint8_t& scale, uint8_t& min);

// Dequantizes `n` elements (a multiple of the type's block_elems) of type `type` from `src` into
// `dst`, producing exactly the floats ggml's dequantize_row_* (and, for F16/BF16/F32, its
// conversions) produce. `type` must have a layout (ggml_block_layout); throws blend::Error
// otherwise or when n is not a whole number of blocks.
void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);

// ggml's reference quantizers quantize_row_{q8_0,q4_0,q5_0,q4_K,q5_K,q6_K}_ref, byte for byte: `n`
// floats (a multiple of the type's block_elems) into blocks written at `dst`. Throws blend::Error
// for any other type or a partial block.
void quantize_row(uint32_t type, const float* src, void* dst, int64_t n);

}  // namespace blend
