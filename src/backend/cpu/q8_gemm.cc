#include "backend/cpu/q8_gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "core/error.h"
#include "model/safetensors.h"

namespace blend::cpu {
namespace {

constexpr int64_t kBlock = kQ8_0BlockElems;  // 32 values a block
constexpr int64_t kGroup = 16;               // weight rows interleaved together
constexpr int64_t kSteps = kBlock / 4;       // 4-value steps a block
constexpr int64_t kGroupBlockBytes = kGroup * kBlock;
constexpr int kMaxRows = 4;  // rows of x a kernel call takes at once

std::atomic<int> g_cap{static_cast<int>(Q8Kernel::kAvx512Vnni)};

// Rows of x quantized: q the int8 values, u the same plus 128 as u8 (for the u8 x s8 VNNI
// products, corrected by the weights' block sums), d the scales.
struct XRows {
  const int8_t* q;
  const uint8_t* u;
  const float* d;
  int64_t k, blocks;
};

// Rows [i0, i0 + mr) of x against one group of 16 weight rows: out[i * 16 + r].
using GroupKernel = void (*)(const XRows& x, int64_t i0, int mr, const int8_t* wq, const float* wd,
                             const int32_t* ws, float* out);

void group_portable(const XRows& x, int64_t i0, int mr, const int8_t* wq, const float* wd,
                    const int32_t* /*ws*/, float* out) {
  for (int i = 0; i < mr; ++i) {
    const int8_t* xq = x.q + (i0 + i) * x.k;
    const float* xd = x.d + (i0 + i) * x.blocks;
    for (int64_t r = 0; r < kGroup; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < x.blocks; ++b) {
        const int8_t* wb = wq + b * kGroupBlockBytes + r * 4;
        int32_t sum = 0;
        for (int64_t t = 0; t < kSteps; ++t)
          for (int64_t e = 0; e < 4; ++e)
            sum += int32_t{xq[b * kBlock + t * 4 + e]} * int32_t{wb[t * kGroup * 4 + e]};
        acc = std::fma(static_cast<float>(sum), xd[b] * wd[b * kGroup + r], acc);
      }
      out[i * kGroup + r] = acc;
    }
  }
}

#if defined(__x86_64__)
// GCC 12 reads the self-initialised _mm512_undefined_* inside the AVX-512 intrinsics as
// uninitialised (a false positive of the header, not of this code).
#pragma GCC diagnostic push
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#define BLEND_Q8_AVX2 __attribute__((target("avx2,fma")))
#define BLEND_Q8_AVXVNNI __attribute__((target("avx2,fma,avxvnni")))
#define BLEND_Q8_AVX512VNNI \
  __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))

inline int32_t load4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// AVX-512 VNNI: a step's 64 bytes are one register; (x + 128) u8 times w s8, four products a
// lane, then 128 x the block sum taken off: the exact integer sum.
template <int MR>
BLEND_Q8_AVX512VNNI void group_avx512vnni_rows(const XRows& x, int64_t i0, const int8_t* wq,
                                               const float* wd, const int32_t* ws, float* out) {
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.blocks; ++b) {
    __m512i sum[MR];
    for (int i = 0; i < MR; ++i) sum[i] = _mm512_setzero_si512();
    const int8_t* wb = wq + b * kGroupBlockBytes;
    for (int64_t t = 0; t < kSteps; ++t) {
      const __m512i w = _mm512_loadu_si512(wb + t * 64);
      for (int i = 0; i < MR; ++i) {
        const __m512i xb = _mm512_set1_epi32(load4(x.u + (i0 + i) * x.k + b * kBlock + t * 4));
        sum[i] = _mm512_dpbusd_epi32(sum[i], xb, w);
      }
    }
    const __m512i corr = _mm512_loadu_si512(ws + b * kGroup);
    const __m512 dw = _mm512_loadu_ps(wd + b * kGroup);
    for (int i = 0; i < MR; ++i) {
      const __m512 d = _mm512_mul_ps(_mm512_set1_ps(x.d[(i0 + i) * x.blocks + b]), dw);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum[i], corr)), d, acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out + i * kGroup, acc[i]);
}

// 256-bit kernels: a step's 64 bytes are two registers (rows 0-7 and 8-15). AVX-VNNI takes the
// u8 + correction route; AVX2 |w| (u8) times x with w's sign (s8), whose pair sums cannot
// saturate (x is within +-127, |w| at most 128). (A macro, not one template: an intrinsic
// compiles only inside a function of its target.)
#define BLEND_Q8_GROUP_256(NAME, TARGET, kVnni)                                                    \
  template <int MR>                                                                                \
  TARGET void NAME(const XRows& x, int64_t i0, const int8_t* wq, const float* wd,                  \
                   const int32_t* ws, float* out) {                                                \
    __m256 acc[MR][2];                                                                             \
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();                      \
    const __m256i ones = _mm256_set1_epi16(1);                                                     \
    for (int64_t b = 0; b < x.blocks; ++b) {                                                       \
      __m256i sum[MR][2];                                                                          \
      for (int i = 0; i < MR; ++i) sum[i][0] = sum[i][1] = _mm256_setzero_si256();                 \
      const int8_t* wb = wq + b * kGroupBlockBytes;                                                \
      for (int64_t t = 0; t < kSteps; ++t) {                                                       \
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + t * 64));      \
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + t * 64 + 32)); \
        if constexpr (kVnni) {                                                                     \
          for (int i = 0; i < MR; ++i) {                                                           \
            const __m256i xb =                                                                     \
                _mm256_set1_epi32(load4(x.u + (i0 + i) * x.k + b * kBlock + t * 4));               \
            sum[i][0] = _mm256_dpbusd_avx_epi32(sum[i][0], xb, w0);                                \
            sum[i][1] = _mm256_dpbusd_avx_epi32(sum[i][1], xb, w1);                                \
          }                                                                                        \
        } else {                                                                                   \
          const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);                        \
          for (int i = 0; i < MR; ++i) {                                                           \
            const __m256i xb =                                                                     \
                _mm256_set1_epi32(load4(x.q + (i0 + i) * x.k + b * kBlock + t * 4));               \
            const __m256i p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0));                 \
            const __m256i p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1));                 \
            sum[i][0] = _mm256_add_epi32(sum[i][0], _mm256_madd_epi16(p0, ones));                  \
            sum[i][1] = _mm256_add_epi32(sum[i][1], _mm256_madd_epi16(p1, ones));                  \
          }                                                                                        \
        }                                                                                          \
      }                                                                                            \
      for (int h = 0; h < 2; ++h) {                                                                \
        const __m256 dw = _mm256_loadu_ps(wd + b * kGroup + h * 8);                                \
        const __m256i corr =                                                                       \
            kVnni ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + b * kGroup + h * 8))  \
                  : _mm256_setzero_si256();                                                        \
        for (int i = 0; i < MR; ++i) {                                                             \
          const __m256 d = _mm256_mul_ps(_mm256_set1_ps(x.d[(i0 + i) * x.blocks + b]), dw);        \
          acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sum[i][h], corr)), d,    \
                                      acc[i][h]);                                                  \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
    for (int i = 0; i < MR; ++i) {                                                                 \
      _mm256_storeu_ps(out + i * kGroup, acc[i][0]);                                               \
      _mm256_storeu_ps(out + i * kGroup + 8, acc[i][1]);                                           \
    }                                                                                              \
  }

BLEND_Q8_GROUP_256(group_avxvnni_rows, BLEND_Q8_AVXVNNI, true)
BLEND_Q8_GROUP_256(group_avx2_rows, BLEND_Q8_AVX2, false)
#undef BLEND_Q8_GROUP_256

// mr rows as calls of the fixed-size kernels (an output's operations never depend on mr).
template <template <int> class K>
void by_rows(const XRows& x, int64_t i0, int mr, const int8_t* wq, const float* wd,
             const int32_t* ws, float* out) {
  switch (mr) {
    case 4:
      return K<4>::run(x, i0, wq, wd, ws, out);
    case 3:
      return K<3>::run(x, i0, wq, wd, ws, out);
    case 2:
      return K<2>::run(x, i0, wq, wd, ws, out);
    default:
      return K<1>::run(x, i0, wq, wd, ws, out);
  }
}
template <int MR>
struct Avx512Vnni {
  static void run(const XRows& x, int64_t i0, const int8_t* wq, const float* wd, const int32_t* ws,
                  float* out) {
    group_avx512vnni_rows<MR>(x, i0, wq, wd, ws, out);
  }
};
template <int MR>
struct AvxVnni {
  static void run(const XRows& x, int64_t i0, const int8_t* wq, const float* wd, const int32_t* ws,
                  float* out) {
    group_avxvnni_rows<MR>(x, i0, wq, wd, ws, out);
  }
};
template <int MR>
struct Avx2 {
  static void run(const XRows& x, int64_t i0, const int8_t* wq, const float* wd, const int32_t* ws,
                  float* out) {
    group_avx2_rows<MR>(x, i0, wq, wd, ws, out);
  }
};
#pragma GCC diagnostic pop
#endif

GroupKernel kernel_for(Q8Kernel k) {
  switch (k) {
#if defined(__x86_64__)
    case Q8Kernel::kAvx512Vnni:
      return by_rows<Avx512Vnni>;
    case Q8Kernel::kAvxVnni:
      return by_rows<AvxVnni>;
    case Q8Kernel::kAvx2:
      return by_rows<Avx2>;
#else
    case Q8Kernel::kAvx512Vnni:
    case Q8Kernel::kAvxVnni:
    case Q8Kernel::kAvx2:
#endif
    case Q8Kernel::kPortable:
      break;
  }
  return group_portable;
}

// Rows of x quantized, reused across calls (one forward at a time on the calling thread).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<uint8_t> u;
  std::vector<float> d;
};

}  // namespace

bool q8_kernel_runs_here(Q8Kernel k) {
#if defined(__x86_64__)
  switch (k) {
    case Q8Kernel::kAvx512Vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
    case Q8Kernel::kAvxVnni: {
      // CPUID leaf 7, sub-leaf 1, EAX bit 4 (clang 14's __builtin_cpu_supports has no
      // "avxvnni"); the AVX2 check covers the OS saving the ymm registers.
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      const bool vnni = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4));
      return vnni && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    case Q8Kernel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Q8Kernel::kPortable:
      return true;
  }
  return false;
#else
  return k == Q8Kernel::kPortable;
#endif
}

Q8Kernel best_q8_kernel() {
  // The kernels are not nested by CPU: Zen 4 runs AVX-512 VNNI but not AVX-VNNI. So a cap
  // picks the best kernel at or below it that this CPU runs, never the cap itself unchecked.
  static const std::array<bool, 3> runs = {q8_kernel_runs_here(Q8Kernel::kAvx512Vnni),
                                           q8_kernel_runs_here(Q8Kernel::kAvxVnni),
                                           q8_kernel_runs_here(Q8Kernel::kAvx2)};
  for (size_t k = static_cast<size_t>(g_cap.load(std::memory_order_relaxed)); k < runs.size(); ++k)
    if (runs[k]) return static_cast<Q8Kernel>(k);
  return Q8Kernel::kPortable;
}

void cap_q8_kernel(Q8Kernel cap) {
  g_cap = static_cast<int>(cap);
}

std::string q8_kernel_name(Q8Kernel k) {
  switch (k) {
    case Q8Kernel::kAvx512Vnni:
      return "avx512-vnni";
    case Q8Kernel::kAvxVnni:
      return "avx-vnni";
    case Q8Kernel::kAvx2:
      return "avx2";
    case Q8Kernel::kPortable:
      return "portable";
  }
  return "?";
}

void quantize_row_q8(const float* x, int64_t k, int8_t* q, float* d) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    d[b] = f16_to_f32(f32_to_f16(amax / 127.0f));
    for (int64_t j = 0; j < kBlock; ++j) {
      // Within +-127 for finite x; inf and NaN (a model gone wrong) must not reach the cast.
      const float v = std::nearbyint(xb[j] * inverse);
      q[b * kBlock + j] = static_cast<int8_t>(v >= -127.0f && v <= 127.0f ? v : v > 0 ? 127 : 0);
    }
  }
}

void quantize_x_row(const void* x, DType x_dtype, int64_t i, int64_t k, int8_t* q, float* d) {
  if (x_dtype == DType::kF32) return quantize_row_q8(static_cast<const float*>(x) + i * k, k, q, d);
  std::vector<float> row(static_cast<size_t>(k));
  const auto* h = static_cast<const uint16_t*>(x) + i * k;
  for (int64_t j = 0; j < k; ++j) row[static_cast<size_t>(j)] = bf16_to_f32(h[j]);
  quantize_row_q8(row.data(), k, q, d);
}

void store_group_outputs(const float* out, int64_t i0, int mr, int64_t j0, int64_t cols, int64_t n,
                         const float* bias, float* y, bool accumulate) {
  for (int i = 0; i < mr; ++i) {
    float* yr = y + (i0 + i) * n + j0;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = bias ? out[i * kGroup + c] + bias[j0 + c] : out[i * kGroup + c];
      yr[c] = accumulate ? yr[c] + v : v;
    }
  }
}

Q8Matrix::Q8Matrix(const std::vector<const TensorView*>& parts) {
  if (parts.empty()) throw Error("cpu gemm: a linear layer needs a weight");
  k_ = parts[0]->shape.at(1);
  for (const TensorView* p : parts) {
    if (p->dtype != DType::kQ8_0)
      throw Error("cpu gemm: weight '" + p->name + "' is " + std::string(dtype_name(p->dtype)) +
                  " beside Q8_0 parts of the same layer; a fused layer takes one type");
    if (p->shape.size() != 2 || p->shape[1] != k_ || k_ % kBlock != 0)
      throw Error("cpu gemm: weight '" + p->name + "' has shape " + shape_string(p->shape) +
                  ", expected [*, " + std::to_string(k_) + "] in whole Q8_0 blocks");
    n_ += p->shape[0];
  }
  groups_ = (n_ + kGroup - 1) / kGroup;
  const int64_t blocks = k_ / kBlock;
  const size_t cells = static_cast<size_t>(groups_ * blocks * kGroup);
  quants_ = allocate_buffer(cells * kBlock);
  scales_ = allocate_buffer(cells * sizeof(float));
  sums_ = allocate_buffer(cells * sizeof(int32_t));
  bytes_ = cells * (kBlock + sizeof(float) + sizeof(int32_t));
  auto* q = reinterpret_cast<int8_t*>(quants_.get());
  auto* d = reinterpret_cast<float*>(scales_.get());
  auto* sum = reinterpret_cast<int32_t*>(sums_.get());
  std::memset(q, 0, cells * kBlock);
  std::fill(d, d + cells, 0.0f);
  std::fill(sum, sum + cells, 0);
  // Row j of the stacked matrix: its part and the row within it.
  std::vector<std::pair<const TensorView*, int64_t>> source;
  for (const TensorView* p : parts)
    for (int64_t r = 0; r < p->shape[0]; ++r) source.emplace_back(p, r);
  const size_t row_bytes = static_cast<size_t>(blocks * kQ8_0BlockBytes);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n_; ++j) {
    const auto [part, r] = source[static_cast<size_t>(j)];
    const int64_t g = j / kGroup, lane = j % kGroup;
    const std::byte* src = part->data + static_cast<size_t>(r) * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const std::byte* block = src + b * kQ8_0BlockBytes;
      uint16_t h;
      std::memcpy(&h, block, 2);
      const size_t cell = static_cast<size_t>((g * blocks + b) * kGroup + lane);
      d[cell] = f16_to_f32(h);
      int8_t* dst = q + (g * blocks + b) * kGroupBlockBytes + lane * 4;
      int32_t total = 0;
      for (int64_t e = 0; e < kBlock; ++e) {
        const auto v = static_cast<int8_t>(block[2 + e]);
        dst[e / 4 * kGroup * 4 + e % 4] = v;
        total += v;
      }
      sum[cell] = 128 * total;
    }
  }
}

void Q8Matrix::forward(const void* x, DType x_dtype, int64_t m, const float* bias, float* y,
                       bool accumulate) const {
  if (m <= 0) return;
  if (x_dtype != DType::kF32 && x_dtype != DType::kBF16)
    throw Error("cpu gemm: Q8_0 layers take f32 or bf16 activations");
  const int64_t blocks = k_ / kBlock;
  const Q8Kernel which = best_q8_kernel();
  // The u8 copy only for the VNNI kernels, which read it instead of q.
  const bool unsigned_rows = which == Q8Kernel::kAvx512Vnni || which == Q8Kernel::kAvxVnni;
  thread_local QuantizedRows xr;
  xr.q.resize(static_cast<size_t>(m * k_));
  xr.u.resize(unsigned_rows ? static_cast<size_t>(m * k_) : 0);
  xr.d.resize(static_cast<size_t>(m * blocks));
  // (Pointers, not xr: inside the parallel loops xr would be each OpenMP thread's own.)
  int8_t* const xq = xr.q.data();
  uint8_t* const xu = xr.u.data();
  float* const xd = xr.d.data();
  // A decode step's few rows are quantized on this thread: a parallel region of its own would
  // cost more than the rows (one region a layer's GEMV already, at ~100 us each).
#pragma omp parallel for schedule(static) if (m * k_ > 32768)
  for (int64_t i = 0; i < m; ++i) {
    quantize_x_row(x, x_dtype, i, k_, xq + i * k_, xd + i * blocks);
    if (unsigned_rows)
      for (int64_t j = i * k_; j < (i + 1) * k_; ++j)
        xu[j] = static_cast<uint8_t>(static_cast<int32_t>(xq[j]) + 128);
  }
  const GroupKernel kernel = kernel_for(which);
  const XRows rows{xq, xu, xd, k_, blocks};
  const auto* q = reinterpret_cast<const int8_t*>(quants_.get());
  const auto* d = reinterpret_cast<const float*>(scales_.get());
  const auto* sum = reinterpret_cast<const int32_t*>(sums_.get());
  // A group's 16 weight rows (16 k bytes) stay in L1/L2 while every row of x streams past.
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups_; ++g) {
    const int64_t j0 = g * kGroup;
    const int64_t cols = std::min(kGroup, n_ - j0);
    const size_t cell = static_cast<size_t>(g * blocks * kGroup);
    float out[kMaxRows * kGroup];
    for (int64_t i0 = 0; i0 < m; i0 += kMaxRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, m - i0));
      kernel(rows, i0, mr, q + cell * kBlock, d + cell, sum + cell, out);
      store_group_outputs(out, i0, mr, j0, cols, n_, bias, y, accumulate);
    }
  }
}

}  // namespace blend::cpu
