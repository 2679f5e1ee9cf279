#include "backend/cpu/ops.h"

#include <atomic>
#include <cmath>
#include <numbers>

#include "backend/cpu/simd.h"
#include "core/error.h"

namespace blend::cpu {
namespace {

std::atomic<bool> g_force_portable{false};

BLEND_MULTIVERSION void store_f32_as_bf16(const float* in, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(in[i]);
}

// Sum of squares with 16 lane-wise partial sums combined by a fixed tree: vectorises without
// reassociation, and the order is a function of n only.
BLEND_MULTIVERSION float sum_squares(const float* x, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += x[i + l] * x[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += x[i] * x[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

BLEND_MULTIVERSION void scale_row(const float* x, const float* w, float inv, int64_t n,
                                  float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

BLEND_MULTIVERSION void swiglu_row(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp_approx(-g)) * up[i];
  }
}

BLEND_MULTIVERSION void geglu_tanh_row(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

// Near saturation (|y| >= 4) tanh itself: there the capped logits round to the cap or one ulp
// below it, where many ids tie, and the greedy token must be the one tanh's rounding picks.
BLEND_MULTIVERSION void softcap_row(float* x, int64_t n, float cap) {
  constexpr int64_t kPiece = 1024;
  float y[kPiece];
  for (int64_t i0 = 0; i0 < n; i0 += kPiece) {
    const int64_t m = std::min(kPiece, n - i0);
    float* xs = x + i0;
    for (int64_t i = 0; i < m; ++i) {
      y[i] = xs[i] / cap;
      xs[i] = tanh_approx(y[i]) * cap;
    }
    for (int64_t i = 0; i < m; ++i)
      if (std::abs(y[i]) >= 4.0f) xs[i] = std::tanh(y[i]) * cap;
  }
}

// out[r] = act(gate, up) of each row's halves, rounded to out_dtype in pieces that keep the
// bf16 scratch on the stack.
template <typename Row>
void gated(const float* gate_up, int64_t rows, int64_t f, DType out_dtype, void* out, int threads,
           Row row) {
  const size_t esize = dtype_size(out_dtype);
  constexpr int64_t kPiece = 2048;  // columns per step
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * f;
    auto* o = static_cast<std::byte*>(out) + r * f * esize;
    if (out_dtype == DType::kF32) {
      row(g, g + f, f, reinterpret_cast<float*>(o));
      continue;
    }
    float tmp[kPiece];
    for (int64_t i = 0; i < f; i += kPiece) {
      const int64_t n = std::min(kPiece, f - i);
      row(g + i, g + f + i, n, tmp);
      store_f32_as_bf16(tmp, n, reinterpret_cast<uint16_t*>(o) + i);
    }
  }
}

BLEND_MULTIVERSION void rope_head(float* x, int64_t half, const float* cos, const float* sin) {
  float* a = x;
  float* b = x + half;
  for (int64_t i = 0; i < half; ++i) {
    const float xa = a[i], xb = b[i];
    a[i] = xa * cos[i] - xb * sin[i];
    b[i] = xb * cos[i] + xa * sin[i];
  }
}

// Per-thread row scratch for ops whose output dtype is bf16 (compute in f32, then round).
constexpr int64_t kMaxStackRow = 16384;

}  // namespace

bool use_avx512() {
#if BLEND_HAVE_AVX512_DISPATCH
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return has && !g_force_portable.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void set_force_portable_kernels(bool force) {
  g_force_portable = force;
}

void store_row(const float* in, int64_t n, DType dtype, void* out) {
  if (dtype == DType::kF32) {
    std::copy(in, in + n, static_cast<float*>(out));
  } else {
    store_f32_as_bf16(in, n, static_cast<uint16_t*>(out));
  }
}

void rmsnorm(const float* x, int64_t x_stride, int64_t rows, int64_t dim, const float* weight,
             float eps, DType out_dtype, void* out, int threads) {
  if (dim > kMaxStackRow) throw Error("cpu backend: hidden size too large");
  const size_t esize = dtype_size(out_dtype);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    const float inv = 1.0f / std::sqrt(sum_squares(xr, dim) / static_cast<float>(dim) + eps);
    void* o = static_cast<std::byte*>(out) + r * dim * esize;
    if (out_dtype == DType::kF32) {
      scale_row(xr, weight, inv, dim, static_cast<float*>(o));
    } else {
      float tmp[kMaxStackRow];
      scale_row(xr, weight, inv, dim, tmp);
      store_f32_as_bf16(tmp, dim, static_cast<uint16_t*>(o));
    }
  }
}

void swiglu(const float* gate_up, int64_t rows, int64_t f, DType out_dtype, void* out,
            int threads) {
  gated(gate_up, rows, f, out_dtype, out, threads, swiglu_row);
}

void geglu_tanh(const float* gate_up, int64_t rows, int64_t f, DType out_dtype, void* out,
                int threads) {
  gated(gate_up, rows, f, out_dtype, out, threads, geglu_tanh_row);
}

void softcap_rows(float* x, int64_t rows, int64_t cols, float cap, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) softcap_row(x + r * cols, cols, cap);
}

void rope_tables(const int32_t* positions, int64_t n, const std::vector<double>& inv_freq,
                 float* cos, float* sin, int threads, double scale) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq[i];
      cos[t * half + i] = static_cast<float>(std::cos(angle) * scale);
      sin[t * half + i] = static_cast<float>(std::sin(angle) * scale);
    }
  }
}

void rope_apply(float* x, int64_t heads, int64_t half, const float* cos, const float* sin) {
  for (int64_t h = 0; h < heads; ++h) rope_head(x + h * 2 * half, half, cos, sin);
}

void rope_apply(float* x, int64_t heads, int64_t stride, int64_t half, const float* cos,
                const float* sin) {
  for (int64_t h = 0; h < heads; ++h) rope_head(x + h * stride, half, cos, sin);
}

}  // namespace blend::cpu
