// Linear layers on a Q4_K_M file's matrices kept quantized: Q4_K, Q6_K and Q5_0 parts (and Q8_0
// parts beside them, Q6_K's fallback), y = x W^T. Every one of these types is an affine map of
// small unsigned integer levels within a sub-block of a row:
//   Q4_K  w = (d sc) q - (dmin m)   q in [0, 15], sc and m per 32 values
//   Q6_K  w = (d sc) (q - 32)       q in [0, 63], sc per 16 values
//   Q5_0  w = d (q - 16)            q in [0, 31], d per 32 values
//   Q8_0  w = d (q + 128 - 128)     q + 128 in [0, 255], d per 32 values
// so with x quantized as q8_gemm.h quantizes it (int8 values x_q, one scale d_x per 32), a
// sub-block adds d_x (S dot(q, x_q) - O sum(x_q)) with S and O its scale and offset (exact f32
// products of the file's f16 and 6-bit numbers): an exact integer dot product of u8 levels and
// s8 values (one VNNI instruction per four) and one correction by the sum of x's values.
//
// Layout: rows in groups of 16 (one type a group), values interleaved so that one 64-byte load
// holds four values of each of 16 rows. A Q4_K group keeps its levels as nibbles and the file's
// own numbers (6-bit sc and m per 32 values, f16 d and dmin per 256), S and O formed as the
// kernel goes; a Q6_K group its 6-bit levels (a nibble and two bits), i8 sc per 16 and f16 d per
// 256, O = 32 S; a Q5_0 group its 5-bit levels (a nibble and a bit) and S = d per 32 values as
// f32, O = 16 S; a Q8_0 group a byte a level and S per 16 values as f32, O = 128 S. Bytes a
// weight: Q4_K 0.58, Q6_K 0.82, Q5_0 0.75, Q8_0 1.25 (the file's 0.56, 0.82, 0.69, 1.06).
//
// Batch invariance: each output element is one fixed sequence of operations (per sub-block,
// acc = fma(dot, S d_x, acc), then acc = fma(-sum, O d_x, acc), in order) whatever the number of
// rows, threads or ISA; the AVX-512 VNNI, AVX2 and portable kernels give the same bits.
//
// Not thread-safe: one forward at a time (the kernel itself runs on the OpenMP threads).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/memory.h"
#include "core/dtype.h"

namespace blend {
struct TensorView;
}

namespace blend::cpu {

// How a group of 16 rows keeps its levels and scales (kquant_layout.h has the byte layouts).
enum class KQuantFormat { kQ4K, kQ6K, kQ50, kBytes };

class KQuantMatrix {
 public:
  // True when `parts` can be stacked here: each Q4_K, Q6_K, Q5_0 or Q8_0, at least one of the
  // first three, and each part but the last a whole number of 16-row groups (a group is one type).
  static bool takes(const std::vector<const TensorView*>& parts);
  // Stacks the [n_i, k] matrices `parts` along the output dimension (takes(parts) must hold).
  explicit KQuantMatrix(const std::vector<const TensorView*>& parts);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  size_t bytes() const { return bytes_; }  // levels, scales and offsets held

  // y[m][n] (+)= x[m][k] W^T (+ bias[n] unless null). x holds m rows of f32 or bf16 values.
  void forward(const void* x, DType x_dtype, int64_t m, const float* bias, float* y,
               bool accumulate) const;

 private:
  struct Group {
    KQuantFormat format = KQuantFormat::kBytes;
    bool wide = false;       // bytes: levels up to 255 (a Q8_0 group)
    float offset_ratio = 0;  // bytes: O = offset_ratio x S
    size_t offset = 0;       // of its bytes in data_
  };
  int64_t n_ = 0, k_ = 0;
  std::vector<Group> groups_;
  Buffer data_;
  size_t bytes_ = 0;
};

}  // namespace blend::cpu
