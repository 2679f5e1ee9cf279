// Linear layers on Q8_0 weights (ggml's block type, kept quantized from a GGUF file): y = x W^T
// with W's rows in blocks of 32 int8 values and one scale each, as llama.cpp computes it. Each
// row of x is quantized the same way (ggml's quantize_row_q8_0 on x86: d = max|x| / 127 rounded
// to f16, q = x * 127 / max|x| rounded to nearest even), and each block pair contributes
// d_x d_w * sum(q_x q_w), the integer sum exact, to an f32 accumulator. Weights stay about 9/8
// bytes per value in memory instead of 4 (f32) or 2 (bf16), so a memory-bound decode step reads
// far fewer bytes.
//
// Layout: rows in groups of 16, a group's block stored as 8 steps of 16 rows x 4 bytes, so one
// 64-byte load holds four values of each of 16 rows and one u8 x s8 dot-product instruction
// (VNNI) adds four products into each row's lane while x's four values are broadcast.
//
// Batch invariance: every output element is one fixed sequence of operations (per block the
// exact integer sum, then acc = fma(sum, d_x d_w, acc), blocks in order) whatever the number of
// rows, the thread count or the ISA. The AVX-512 VNNI, AVX-VNNI, AVX2 and portable kernels give
// the same bits, so `--deterministic` needs nothing more, and tests compare them bit for bit.
//
// Not thread-safe: one forward at a time (the kernel itself runs on the OpenMP threads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/memory.h"
#include "core/dtype.h"

namespace blend {
struct TensorView;
}

namespace blend::cpu {

// The kernels, best first. The CPU decides at run time (__builtin_cpu_supports); tests may cap
// the choice to check the kernels against each other.
enum class Q8Kernel { kAvx512Vnni, kAvxVnni, kAvx2, kPortable };
Q8Kernel best_q8_kernel();             // the best this CPU runs at or below the cap
bool q8_kernel_runs_here(Q8Kernel k);  // this CPU has the instructions `k` uses
void cap_q8_kernel(Q8Kernel cap);      // tests: use at most `cap` (kAvx512Vnni lifts the cap)
std::string q8_kernel_name(Q8Kernel k);

class Q8Matrix {
 public:
  // Stacks the [n_i, k] Q8_0 matrices `parts` along the output dimension (rows kept as they
  // are: fused Q/K/V, gate/up), and unpacks their blocks into aligned int8 rows and f32 scales.
  explicit Q8Matrix(const std::vector<const TensorView*>& parts);

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  // Bytes held for the weights (int8 values and scales).
  size_t bytes() const { return bytes_; }

  // y[m][n] (+)= x[m][k] W^T (+ bias[n] unless null). x holds m rows of f32 or bf16 values.
  void forward(const void* x, DType x_dtype, int64_t m, const float* bias, float* y,
               bool accumulate) const;

 private:
  int64_t n_ = 0, k_ = 0;
  int64_t groups_ = 0;  // ceil(n / 16); the padding rows are zeros
  Buffer quants_;       // [groups][blocks][8 steps][16 rows][4] int8
  Buffer scales_;       // [groups][blocks][16] f32 (each exactly an f16 value)
  Buffer sums_;         // [groups][blocks][16] int32: 128 x the block's sum of values
  size_t bytes_ = 0;
};

// One row of x quantized as ggml's x86 quantize_row_q8_0, into int8 values and f32 scales (each
// exactly an f16 value). For the kernel and its tests.
void quantize_row_q8(const float* x, int64_t k, int8_t* q, float* d);

// Row i of x (rows of k values, f32 or bf16) quantized by quantize_row_q8 into q (k values) and
// d (k / 32 scales): how both quantized layers (this one, kquant_gemm.h) read activations.
void quantize_x_row(const void* x, DType x_dtype, int64_t i, int64_t k, int8_t* q, float* d);

// A kernel's output for rows [i0, i0 + mr) of x and one 16-row weight group (out[i * 16 + c])
// into y's rows (n columns) at columns [j0, j0 + cols), plus bias[j0 + c] unless null, added to
// y when `accumulate`.
void store_group_outputs(const float* out, int64_t i0, int mr, int64_t j0, int64_t cols, int64_t n,
                         const float* bias, float* y, bool accumulate);

}  // namespace blend::cpu
