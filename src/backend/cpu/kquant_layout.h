// KQuantMatrix's packed layout (kquant_gemm.h): how a group of 16 rows keeps each type's levels
// and scales, and the code that writes it from a file's blocks. The kernels (kquant_gemm.cc) read
// exactly these bytes; the constants are the one place the two agree on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/kquant_gemm.h"
#include "core/dtype.h"

namespace blend::cpu::kquant {

constexpr int64_t kGroup = 16;   // weight rows interleaved together
constexpr int64_t kXBlock = 32;  // x's quantization block (one d_x)
constexpr int64_t kSub16 = 16;   // Q6_K's and the byte groups' sub-block
constexpr int64_t kSuper = 256;  // a K-quant super-block

// A group's bytes, per 256 values (Q4_K, Q6_K) or per 16 (the byte groups), 16 rows each:
//   Q4_K: levels as nibbles, 8 blocks of 32 values x 4 chunks of 64 bytes (chunk t's byte
//         r * 4 + e: value t * 8 + e of row r in the low nibble, t * 8 + 4 + e in the high one);
//         then sc[8][16] and m[8][16] (u8), d[16] and dmin[16] (f16, as the file has them).
//   Q6_K: per 16 values two 64-byte nibble registers (register u: chunk u's low 4 bits in the
//         low nibbles, chunk u + 2's in the high ones; chunk c's byte r * 4 + e is value
//         c * 4 + e of row r) and one 64-byte register of the high 2 bits (chunk c's at bits
//         2c, 2c + 1); then sc[16][16] (i8) and d[16] (f16).
//   Q5_0: per 32 values four 64-byte nibble registers (register u: chunk u's low 4 bits in the
//         low nibbles, chunk u + 4's in the high ones), one 64-byte register of the fifth bits
//         (chunk c's at bit c), then S[16] (f32: d).
//   bytes (Q8_0): per 16 values 4 chunks of 64 bytes of levels, then S[16] (f32).
constexpr int64_t kQ4KSuperBytes = 2048 + 128 + 128 + 32 + 32;
constexpr int64_t kQ6KSubBytes = 192;
constexpr int64_t kQ6KSuperBytes = 16 * kQ6KSubBytes + 256 + 32;
constexpr int64_t kQ50BlockBytes = 256 + 64 + 64;
constexpr int64_t kByteSubBytes = 256 + 64;

// Q4_K, Q6_K, Q5_0 or Q8_0: the types a KQuantMatrix stacks.
bool kept_type(DType t);

inline uint16_t half_bits(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// One row of a kept type: a level a value and its sub-block numbers.
struct DecodedRow {
  std::vector<uint8_t> levels;
  std::vector<uint8_t> sc, mn;    // Q4_K: per 32; Q6_K: sc per 16 (i8 bits)
  std::vector<uint16_t> d, dmin;  // Q4_K, Q6_K: per 256 (f16 bits)
  std::vector<float> scale;       // bytes: S per 16
  float offset_ratio = 0;         // bytes: O / S
};

// Decodes row `row` (k values of type t, whole blocks) into `out`.
void decode_row(DType t, const std::byte* row, int64_t k, DecodedRow& out);

// Writes lane `lane` (0-15) of a group of format f, `out` its group_bytes(f, k) bytes (zeroed
// before the first lane).
void pack_lane(KQuantFormat f, const DecodedRow& row, int64_t k, int64_t lane, uint8_t* out);

// Bytes of one group of format f over k values.
int64_t group_bytes(KQuantFormat f, int64_t k);

}  // namespace blend::cpu::kquant
