// The element-wise and per-row operations of the cpu forward pass: RMSNorm, RoPE (with
// Llama-3 and linear frequency scaling), SwiGLU, and the f32 -> GEMM-input conversion.
//
// Every function treats each row on its own, with a fixed order of arithmetic inside the row,
// so a row's result does not depend on the other rows or on how rows are split among threads
// (the batch invariance of the deterministic mode rests on this). Rows are spread over
// `threads` OpenMP threads. Hot loops are compiled for several ISAs and picked at run time.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace blend::cpu {

// exp(x) to about 1 ulp for x in [-87, 88] (clamped outside), written so that compilers can
// vectorise it: Cody-Waite range reduction, degree-6 polynomial, exponent by bit arithmetic.
inline float exp_approx(float x) {
  x = std::max(-87.0f, std::min(x, 88.0f));  // min/max, not branches: one vector path
  constexpr float kRound = 12582912.0f;      // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// Writes n floats as `dtype` (F32 copy or BF16 round-to-nearest-even) to out.
void store_row(const float* in, int64_t n, DType dtype, void* out);

// out[r] = weight * x[r] / sqrt(mean(x[r]^2) + eps) for rows r < rows; x rows are x_stride
// floats apart, out rows dim elements of `out_dtype`.
void rmsnorm(const float* x, int64_t x_stride, int64_t rows, int64_t dim, const float* weight,
             float eps, DType out_dtype, void* out, int threads);

// out[r][i] = silu(gate_up[r][i]) * gate_up[r][f + i] for i < f (gate and up halves of one row).
void swiglu(const float* gate_up, int64_t rows, int64_t f, DType out_dtype, void* out, int threads);

// GELU with the tanh approximation, as torch's gelu(approximate="tanh") computes it in f32
// (transformers' gelu_pytorch_tanh): 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

// out[r][i] = gelu_tanh(gate_up[r][i]) * gate_up[r][f + i] (Gemma's GeGLU), as swiglu.
void geglu_tanh(const float* gate_up, int64_t rows, int64_t f, DType out_dtype, void* out,
                int threads);

// Soft-capping (Gemma 2): x[i] = cap * tanh(x[i] / cap), computed as transformers does it (a
// division, tanh, a product), each element on its own.
inline float softcap(float x, float cap) {
  return std::tanh(x / cap) * cap;
}

// tanh in plain arithmetic that vectorises, within 2e-6 of tanh relative (tested): an odd
// Taylor polynomial below |y| = 1/16, (1 - e) / (1 + e) with e = exp(-2|y|) above.
inline float tanh_approx(float y) {
  const float a = std::abs(y);
  const float y2 = y * y;
  const float small = y * (1.0f + y2 * (-1.0f / 3 + y2 * (2.0f / 15 + y2 * (-17.0f / 315))));
  const float e = exp_approx(-2.0f * a);
  const float large = std::copysign((1.0f - e) / (1.0f + e), y);
  return a < 0.0625f ? small : large;
}

// softcap() over `rows` rows of `cols` (the final logits), with tanh_approx below |x / cap| = 4
// and tanh above: a scalar tanh on each logit of a 128K vocabulary cost more than a tiny
// model's layers. Each row is computed alone, so its bits do not depend on the rows beside it.
void softcap_rows(float* x, int64_t rows, int64_t cols, float cap, int threads);

// cos and sin of position * inv_freq[i], [n][half] each, computed in double then rounded.
// Both are multiplied by `scale` first (longrope's attention factor; 1 leaves them exact).
void rope_tables(const int32_t* positions, int64_t n, const std::vector<double>& inv_freq,
                 float* cos, float* sin, int threads, double scale = 1.0);

// Rotates `heads` consecutive head vectors of length 2 * half in place, Hugging Face
// rotate_half convention: element i pairs with element i + half.
void rope_apply(float* x, int64_t heads, int64_t half, const float* cos, const float* sin);
// The same on heads `stride` floats apart, of which the first 2 * half rotate and the rest
// pass unchanged (partial RoPE, Phi-3's partial_rotary_factor).
void rope_apply(float* x, int64_t heads, int64_t stride, int64_t half, const float* cos,
                const float* sin);

}  // namespace blend::cpu
