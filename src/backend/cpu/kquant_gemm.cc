#include "backend/cpu/kquant_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/kquant_layout.h"
#include "backend/cpu/q8_gemm.h"
#include "core/error.h"
#include "model/safetensors.h"

namespace blend::cpu {
namespace {

using namespace kquant;  // the layout's constants

constexpr int kMaxRows = 4;  // rows of x a kernel call takes at once

// Rows of x quantized: q the int8 values, d the scales (per 32), s16 / s32 the sums of q per 16
// and per 32 values (exact integers as floats).
struct XRows {
  const int8_t* q;
  const float* d;
  const float* s16;
  const float* s32;
  int64_t k;
};

// Rows [i0, i0 + mr) of x against one group's bytes: out[i * 16 + r].
using GroupKernel = void (*)(const XRows& x, int64_t i0, int mr, const uint8_t* w, float ratio,
                             float* out);

// The portable kernels: the same operations, one output at a time. S d_x and O d_x are products
// of f32 values, as the vector kernels form them.
void q4k_portable(const XRows& x, int64_t i0, int mr, const uint8_t* w, float /*ratio*/,
                  float* out) {
  const int64_t blocks = x.k / 32;
  for (int i = 0; i < mr; ++i) {
    const int8_t* xq = x.q + (i0 + i) * x.k;
    for (int64_t r = 0; r < kGroup; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* s = w + b / 8 * kQ4KSuperBytes;
        const int64_t j = b % 8;
        int32_t dot = 0;
        for (int64_t t = 0; t < 4; ++t)
          for (int64_t e = 0; e < 4; ++e) {
            const uint8_t byte = s[(j * 4 + t) * 64 + r * 4 + e];
            dot += int32_t{byte & 0xF} * xq[b * 32 + t * 8 + e];
            dot += int32_t{byte >> 4} * xq[b * 32 + t * 8 + 4 + e];
          }
        const float d = f16_to_f32(half_bits(s + 2304 + r * 2));
        const float dmin = f16_to_f32(half_bits(s + 2336 + r * 2));
        const float scale = d * static_cast<float>(s[2048 + j * kGroup + r]);
        const float offset = dmin * static_cast<float>(s[2176 + j * kGroup + r]);
        const float dx = x.d[(i0 + i) * blocks + b];
        acc = std::fma(static_cast<float>(dot), scale * dx, acc);
        acc = std::fma(-x.s32[(i0 + i) * blocks + b], offset * dx, acc);
      }
      out[i * kGroup + r] = acc;
    }
  }
}

void q6k_portable(const XRows& x, int64_t i0, int mr, const uint8_t* w, float /*ratio*/,
                  float* out) {
  const int64_t subs = x.k / kSub16, blocks = x.k / kXBlock;
  for (int i = 0; i < mr; ++i) {
    const int8_t* xq = x.q + (i0 + i) * x.k;
    for (int64_t r = 0; r < kGroup; ++r) {
      float acc = 0.0f;
      for (int64_t j = 0; j < subs; ++j) {
        const uint8_t* s = w + j / 16 * kQ6KSuperBytes;
        const uint8_t* sub = s + j % 16 * kQ6KSubBytes;
        int32_t dot = 0;
        for (int64_t c = 0; c < 4; ++c)
          for (int64_t e = 0; e < 4; ++e) {
            const uint8_t nib = sub[(c % 2) * 64 + r * 4 + e];
            const int level =
                (c < 2 ? nib & 0xF : nib >> 4) | (((sub[128 + r * 4 + e] >> (2 * c)) & 3) << 4);
            dot += level * xq[j * 16 + c * 4 + e];
          }
        const float d = f16_to_f32(half_bits(s + 16 * kQ6KSubBytes + 256 + r * 2));
        const auto sc = static_cast<int8_t>(s[16 * kQ6KSubBytes + j % 16 * kGroup + r]);
        const float scale = d * static_cast<float>(sc);
        const float dx = x.d[(i0 + i) * blocks + j / 2];
        acc = std::fma(static_cast<float>(dot), scale * dx, acc);
        acc = std::fma(-x.s16[(i0 + i) * subs + j], (scale * 32.0f) * dx, acc);
      }
      out[i * kGroup + r] = acc;
    }
  }
}

void q50_portable(const XRows& x, int64_t i0, int mr, const uint8_t* w, float /*ratio*/,
                  float* out) {
  const int64_t blocks = x.k / kXBlock;
  for (int i = 0; i < mr; ++i) {
    const int8_t* xq = x.q + (i0 + i) * x.k;
    for (int64_t r = 0; r < kGroup; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = w + b * kQ50BlockBytes;
        int32_t dot = 0;
        for (int64_t c = 0; c < 8; ++c)
          for (int64_t e = 0; e < 4; ++e) {
            const uint8_t nib = blk[(c % 4) * 64 + r * 4 + e];
            const int level =
                (c < 4 ? nib & 0xF : nib >> 4) | (((blk[256 + r * 4 + e] >> c) & 1) << 4);
            dot += level * xq[b * 32 + c * 4 + e];
          }
        float scale;
        std::memcpy(&scale, blk + 320 + r * 4, 4);
        const float dx = x.d[(i0 + i) * blocks + b];
        acc = std::fma(static_cast<float>(dot), scale * dx, acc);
        acc = std::fma(-x.s32[(i0 + i) * blocks + b], (scale * 16.0f) * dx, acc);
      }
      out[i * kGroup + r] = acc;
    }
  }
}

void bytes_portable(const XRows& x, int64_t i0, int mr, const uint8_t* w, float ratio, float* out) {
  const int64_t subs = x.k / kSub16, blocks = x.k / kXBlock;
  for (int i = 0; i < mr; ++i) {
    const int8_t* xq = x.q + (i0 + i) * x.k;
    for (int64_t r = 0; r < kGroup; ++r) {
      float acc = 0.0f;
      for (int64_t j = 0; j < subs; ++j) {
        const uint8_t* sub = w + j * kByteSubBytes;
        int32_t dot = 0;
        for (int64_t t = 0; t < 4; ++t)
          for (int64_t e = 0; e < 4; ++e)
            dot += int32_t{sub[t * 64 + r * 4 + e]} * xq[j * 16 + t * 4 + e];
        float scale;
        std::memcpy(&scale, sub + 256 + r * 4, 4);
        const float dx = x.d[(i0 + i) * blocks + j / 2];
        acc = std::fma(static_cast<float>(dot), scale * dx, acc);
        acc = std::fma(-x.s16[(i0 + i) * subs + j], (scale * ratio) * dx, acc);
      }
      out[i * kGroup + r] = acc;
    }
  }
}

#if defined(__x86_64__)
#pragma GCC diagnostic push
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#define BLEND_KQ_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BLEND_KQ_AVX512VNNI \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni")))

inline int32_t load4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- AVX-512 VNNI: a 64-byte chunk is one register, 16 rows x 4 values.

// Sixteen u8 / i8 numbers (one a row) as f32, and sixteen f16.
BLEND_KQ_AVX512VNNI inline __m512 u8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
BLEND_KQ_AVX512VNNI inline __m512 i8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
BLEND_KQ_AVX512VNNI inline __m512 f16x16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int MR>
BLEND_KQ_AVX512VNNI void q4k_avx512(const XRows& x, int64_t i0, const uint8_t* w, float* out) {
  const int64_t blocks = x.k / 32;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < blocks / 8; ++sb) {
    const uint8_t* s = w + sb * kQ4KSuperBytes;
    const __m512 d = f16x16(s + 2304), dmin = f16x16(s + 2336);
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t b = sb * 8 + j;
      __m512i dot[MR];
      for (int i = 0; i < MR; ++i) dot[i] = _mm512_setzero_si512();
      for (int64_t t = 0; t < 4; ++t) {
        const __m512i v = _mm512_loadu_si512(s + (j * 4 + t) * 64);
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int i = 0; i < MR; ++i) {
          const int8_t* xq = x.q + (i0 + i) * x.k + b * 32 + t * 8;
          dot[i] = _mm512_dpbusd_epi32(dot[i], lo, _mm512_set1_epi32(load4(xq)));
          dot[i] = _mm512_dpbusd_epi32(dot[i], hi, _mm512_set1_epi32(load4(xq + 4)));
        }
      }
      const __m512 scale = _mm512_mul_ps(d, u8x16(s + 2048 + j * kGroup));
      const __m512 offset = _mm512_mul_ps(dmin, u8x16(s + 2176 + j * kGroup));
      for (int i = 0; i < MR; ++i) {
        const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * blocks + b]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), _mm512_mul_ps(scale, dx), acc[i]);
        acc[i] = _mm512_fnmadd_ps(_mm512_set1_ps(x.s32[(i0 + i) * blocks + b]),
                                  _mm512_mul_ps(offset, dx), acc[i]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out + i * kGroup, acc[i]);
}

template <int MR>
BLEND_KQ_AVX512VNNI void q6k_avx512(const XRows& x, int64_t i0, const uint8_t* w, float* out) {
  const int64_t subs = x.k / kSub16, blocks = x.k / kXBlock;
  const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  const __m512 c32 = _mm512_set1_ps(32.0f);
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < subs / 16; ++sb) {
    const uint8_t* s = w + sb * kQ6KSuperBytes;
    const __m512 d = f16x16(s + 16 * kQ6KSubBytes + 256);
    for (int64_t js = 0; js < 16; ++js) {
      const int64_t j = sb * 16 + js;
      const uint8_t* sub = s + js * kQ6KSubBytes;
      const __m512i n0 = _mm512_loadu_si512(sub), n1 = _mm512_loadu_si512(sub + 64);
      const __m512i hb = _mm512_loadu_si512(sub + 128);
      // Chunk c: its low 4 bits from a nibble register, bits 2c, 2c + 1 of hb moved to 4, 5.
      const __m512i level[4] = {_mm512_or_si512(_mm512_and_si512(n0, low),
                                                _mm512_and_si512(_mm512_slli_epi16(hb, 4), top)),
                                _mm512_or_si512(_mm512_and_si512(n1, low),
                                                _mm512_and_si512(_mm512_slli_epi16(hb, 2), top)),
                                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n0, 4), low),
                                                _mm512_and_si512(hb, top)),
                                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n1, 4), low),
                                                _mm512_and_si512(_mm512_srli_epi16(hb, 2), top))};
      __m512i dot[MR];
      for (int i = 0; i < MR; ++i) dot[i] = _mm512_setzero_si512();
      for (int64_t c = 0; c < 4; ++c)
        for (int i = 0; i < MR; ++i)
          dot[i] = _mm512_dpbusd_epi32(
              dot[i], level[c], _mm512_set1_epi32(load4(x.q + (i0 + i) * x.k + j * 16 + c * 4)));
      const __m512 scale = _mm512_mul_ps(d, i8x16(s + 16 * kQ6KSubBytes + js * kGroup));
      const __m512 offset = _mm512_mul_ps(scale, c32);
      for (int i = 0; i < MR; ++i) {
        const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * blocks + j / 2]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), _mm512_mul_ps(scale, dx), acc[i]);
        acc[i] = _mm512_fnmadd_ps(_mm512_set1_ps(x.s16[(i0 + i) * subs + j]),
                                  _mm512_mul_ps(offset, dx), acc[i]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out + i * kGroup, acc[i]);
}

template <int MR>
BLEND_KQ_AVX512VNNI void q50_avx512(const XRows& x, int64_t i0, const uint8_t* w, float* out) {
  const int64_t blocks = x.k / kXBlock;
  const __m512i low = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
  const __m512 c16 = _mm512_set1_ps(16.0f);
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kQ50BlockBytes;
    const __m512i n0 = _mm512_loadu_si512(blk), n1 = _mm512_loadu_si512(blk + 64);
    const __m512i n2 = _mm512_loadu_si512(blk + 128), n3 = _mm512_loadu_si512(blk + 192);
    const __m512i p = _mm512_loadu_si512(blk + 256);
    // Chunk c: its low 4 bits from a nibble register, bit c of p moved to bit 4.
    const __m512i level[8] = {_mm512_or_si512(_mm512_and_si512(n0, low),
                                              _mm512_and_si512(_mm512_slli_epi16(p, 4), fifth)),
                              _mm512_or_si512(_mm512_and_si512(n1, low),
                                              _mm512_and_si512(_mm512_slli_epi16(p, 3), fifth)),
                              _mm512_or_si512(_mm512_and_si512(n2, low),
                                              _mm512_and_si512(_mm512_slli_epi16(p, 2), fifth)),
                              _mm512_or_si512(_mm512_and_si512(n3, low),
                                              _mm512_and_si512(_mm512_slli_epi16(p, 1), fifth)),
                              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n0, 4), low),
                                              _mm512_and_si512(p, fifth)),
                              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n1, 4), low),
                                              _mm512_and_si512(_mm512_srli_epi16(p, 1), fifth)),
                              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n2, 4), low),
                                              _mm512_and_si512(_mm512_srli_epi16(p, 2), fifth)),
                              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n3, 4), low),
                                              _mm512_and_si512(_mm512_srli_epi16(p, 3), fifth))};
    __m512i dot[MR];
    for (int i = 0; i < MR; ++i) dot[i] = _mm512_setzero_si512();
    for (int64_t c = 0; c < 8; ++c)
      for (int i = 0; i < MR; ++i)
        dot[i] = _mm512_dpbusd_epi32(
            dot[i], level[c], _mm512_set1_epi32(load4(x.q + (i0 + i) * x.k + b * 32 + c * 4)));
    const __m512 scale = _mm512_loadu_ps(blk + 320);
    const __m512 offset = _mm512_mul_ps(scale, c16);
    for (int i = 0; i < MR; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * blocks + b]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), _mm512_mul_ps(scale, dx), acc[i]);
      acc[i] = _mm512_fnmadd_ps(_mm512_set1_ps(x.s32[(i0 + i) * blocks + b]),
                                _mm512_mul_ps(offset, dx), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out + i * kGroup, acc[i]);
}

template <int MR>
BLEND_KQ_AVX512VNNI void bytes_avx512(const XRows& x, int64_t i0, const uint8_t* w, float ratio,
                                      float* out) {
  const int64_t subs = x.k / kSub16, blocks = x.k / kXBlock;
  const __m512 c = _mm512_set1_ps(ratio);
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < subs; ++j) {
    const uint8_t* sub = w + j * kByteSubBytes;
    __m512i dot[MR];
    for (int i = 0; i < MR; ++i) dot[i] = _mm512_setzero_si512();
    for (int64_t t = 0; t < 4; ++t) {
      const __m512i v = _mm512_loadu_si512(sub + t * 64);
      for (int i = 0; i < MR; ++i)
        dot[i] = _mm512_dpbusd_epi32(
            dot[i], v, _mm512_set1_epi32(load4(x.q + (i0 + i) * x.k + j * 16 + t * 4)));
    }
    const __m512 scale = _mm512_loadu_ps(sub + 256);
    const __m512 offset = _mm512_mul_ps(scale, c);
    for (int i = 0; i < MR; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * blocks + j / 2]);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]), _mm512_mul_ps(scale, dx), acc[i]);
      acc[i] = _mm512_fnmadd_ps(_mm512_set1_ps(x.s16[(i0 + i) * subs + j]),
                                _mm512_mul_ps(offset, dx), acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out + i * kGroup, acc[i]);
}

// ---- AVX2: a chunk is two registers (rows 0-7, 8-15); u8 levels x s8 values by maddubs, whose
// pair sums stay within int16 for levels up to 63 (a Q8_0 group's, up to 255, are split as
// (l & 127) + 128 (l >> 7)), then madd by ones.

BLEND_KQ_AVX2 inline __m256i dot4(__m256i levels, __m256i xb) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(levels, xb), _mm256_set1_epi16(1));
}
BLEND_KQ_AVX2 inline __m256 u8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
BLEND_KQ_AVX2 inline __m256 i8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
BLEND_KQ_AVX2 inline __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
BLEND_KQ_AVX2 inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// The per-sub-block float step of every 256-bit kernel: acc += dot (S d_x) - sum (O d_x).
#define BLEND_KQ_ACC_256(SCALE, OFFSET, DX_INDEX, SUM)                                       \
  for (int i = 0; i < MR; ++i) {                                                             \
    const __m256 dx = _mm256_set1_ps(x.d[(i0 + i) * blocks + (DX_INDEX)]);                   \
    const __m256 sum = _mm256_set1_ps(SUM);                                                  \
    acc[i][h] =                                                                              \
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][h]), _mm256_mul_ps(SCALE, dx), acc[i][h]); \
    acc[i][h] = _mm256_fnmadd_ps(sum, _mm256_mul_ps(OFFSET, dx), acc[i][h]);                 \
  }

template <int MR>
BLEND_KQ_AVX2 void q4k_avx2(const XRows& x, int64_t i0, const uint8_t* w, float* out) {
  const int64_t blocks = x.k / 32;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < blocks / 8; ++sb) {
    const uint8_t* s = w + sb * kQ4KSuperBytes;
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t b = sb * 8 + j;
      // The block's eight pair sums a lane add up in int16 before one madd: each is at most
      // 2 x 15 x 127 = 3810 in magnitude, eight at most 30480.
      __m256i sum16[MR][2];
      for (int i = 0; i < MR; ++i) sum16[i][0] = sum16[i][1] = _mm256_setzero_si256();
      for (int64_t t = 0; t < 4; ++t)
        for (int h = 0; h < 2; ++h) {
          const __m256i v = load32(s + (j * 4 + t) * 64 + h * 32);
          const __m256i lo = _mm256_and_si256(v, low);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          for (int i = 0; i < MR; ++i) {
            const int8_t* xq = x.q + (i0 + i) * x.k + b * 32 + t * 8;
            sum16[i][h] = _mm256_add_epi16(sum16[i][h],
                                           _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load4(xq))));
            sum16[i][h] = _mm256_add_epi16(
                sum16[i][h], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load4(xq + 4))));
          }
        }
      __m256i dot[MR][2];
      for (int i = 0; i < MR; ++i)
        for (int h = 0; h < 2; ++h) dot[i][h] = _mm256_madd_epi16(sum16[i][h], ones);
      for (int h = 0; h < 2; ++h) {
        const __m256 scale =
            _mm256_mul_ps(f16x8(s + 2304 + h * 16), u8x8(s + 2048 + j * kGroup + h * 8));
        const __m256 offset =
            _mm256_mul_ps(f16x8(s + 2336 + h * 16), u8x8(s + 2176 + j * kGroup + h * 8));
        BLEND_KQ_ACC_256(scale, offset, b, x.s32[(i0 + i) * blocks + b])
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(out + i * kGroup, acc[i][0]);
    _mm256_storeu_ps(out + i * kGroup + 8, acc[i][1]);
  }
}

template <int MR>
BLEND_KQ_AVX2 void q6k_avx2(const XRows& x, int64_t i0, const uint8_t* w, float* out) {
  const int64_t subs = x.k / kSub16, blocks = x.k / kXBlock;
  const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  const __m256 c32 = _mm256_set1_ps(32.0f);
  __m256 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < subs / 16; ++sb) {
    const uint8_t* s = w + sb * kQ6KSuperBytes;
    for (int64_t js = 0; js < 16; ++js) {
      const int64_t j = sb * 16 + js;
      const uint8_t* sub = s + js * kQ6KSubBytes;
      __m256i dot[MR][2];
      for (int i = 0; i < MR; ++i) dot[i][0] = dot[i][1] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i n0 = load32(sub + h * 32), n1 = load32(sub + 64 + h * 32);
        const __m256i hb = load32(sub + 128 + h * 32);
        const __m256i level[4] = {_mm256_or_si256(_mm256_and_si256(n0, low),
                                                  _mm256_and_si256(_mm256_slli_epi16(hb, 4), top)),
                                  _mm256_or_si256(_mm256_and_si256(n1, low),
                                                  _mm256_and_si256(_mm256_slli_epi16(hb, 2), top)),
                                  _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), low),
                                                  _mm256_and_si256(hb, top)),
                                  _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), low),
                                                  _mm256_and_si256(_mm256_srli_epi16(hb, 2), top))};
        for (int64_t c = 0; c < 4; ++c)
          for (int i = 0; i < MR; ++i)
            dot[i][h] = _mm256_add_epi32(
                dot[i][h],
                dot4(level[c], _mm256_set1_epi32(load4(x.q + (i0 + i) * x.k + j * 16 + c * 4))));
      }
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = _mm256_mul_ps(f16x8(s + 16 * kQ6KSubBytes + 256 + h * 16),
                                           i8x8(s + 16 * kQ6KSubBytes + js * kGroup + h * 8));
        const __m256 offset = _mm256_mul_ps(scale, c32);
        BLEND_KQ_ACC_256(scale, offset, j / 2, x.s16[(i0 + i) * subs + j])
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(out + i * kGroup, acc[i][0]);
    _mm256_storeu_ps(out + i * kGroup + 8, acc[i][1]);
  }
}

template <int MR>
BLEND_KQ_AVX2 void q50_avx2(const XRows& x, int64_t i0, const uint8_t* w, float* out) {
  const int64_t blocks = x.k / kXBlock;
  const __m256i low = _mm256_set1_epi8(0x0F), fifth = _mm256_set1_epi8(0x10);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 c16 = _mm256_set1_ps(16.0f);
  __m256 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kQ50BlockBytes;
    __m256i dot[MR][2];
    for (int i = 0; i < MR; ++i) dot[i][0] = dot[i][1] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i n0 = load32(blk + h * 32), n1 = load32(blk + 64 + h * 32);
      const __m256i n2 = load32(blk + 128 + h * 32), n3 = load32(blk + 192 + h * 32);
      const __m256i p = load32(blk + 256 + h * 32);
      const __m256i level[8] = {_mm256_or_si256(_mm256_and_si256(n0, low),
                                                _mm256_and_si256(_mm256_slli_epi16(p, 4), fifth)),
                                _mm256_or_si256(_mm256_and_si256(n1, low),
                                                _mm256_and_si256(_mm256_slli_epi16(p, 3), fifth)),
                                _mm256_or_si256(_mm256_and_si256(n2, low),
                                                _mm256_and_si256(_mm256_slli_epi16(p, 2), fifth)),
                                _mm256_or_si256(_mm256_and_si256(n3, low),
                                                _mm256_and_si256(_mm256_slli_epi16(p, 1), fifth)),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), low),
                                                _mm256_and_si256(p, fifth)),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), low),
                                                _mm256_and_si256(_mm256_srli_epi16(p, 1), fifth)),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n2, 4), low),
                                                _mm256_and_si256(_mm256_srli_epi16(p, 2), fifth)),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n3, 4), low),
                                                _mm256_and_si256(_mm256_srli_epi16(p, 3), fifth))};
      // Four pair sums a lane add up in int16 before a madd: each at most 2 x 31 x 127 = 7874
      // in magnitude, four at most 31496.
      for (int64_t half = 0; half < 2; ++half)
        for (int i = 0; i < MR; ++i) {
          __m256i sum16 = _mm256_setzero_si256();
          for (int64_t c = half * 4; c < half * 4 + 4; ++c)
            sum16 = _mm256_add_epi16(
                sum16, _mm256_maddubs_epi16(level[c], _mm256_set1_epi32(load4(x.q + (i0 + i) * x.k +
                                                                              b * 32 + c * 4))));
          dot[i][h] = _mm256_add_epi32(dot[i][h], _mm256_madd_epi16(sum16, ones));
        }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(blk + 320) + h * 8);
      const __m256 offset = _mm256_mul_ps(scale, c16);
      BLEND_KQ_ACC_256(scale, offset, b, x.s32[(i0 + i) * blocks + b])
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(out + i * kGroup, acc[i][0]);
    _mm256_storeu_ps(out + i * kGroup + 8, acc[i][1]);
  }
}

template <int MR, bool kWide>
BLEND_KQ_AVX2 void bytes_avx2(const XRows& x, int64_t i0, const uint8_t* w, float ratio,
                              float* out) {
  const int64_t subs = x.k / kSub16, blocks = x.k / kXBlock;
  const __m256i seven = _mm256_set1_epi8(0x7F), one = _mm256_set1_epi8(1);
  const __m256 c = _mm256_set1_ps(ratio);
  __m256 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t j = 0; j < subs; ++j) {
    const uint8_t* sub = w + j * kByteSubBytes;
    __m256i dot[MR][2];
    for (int i = 0; i < MR; ++i) dot[i][0] = dot[i][1] = _mm256_setzero_si256();
    for (int64_t t = 0; t < 4; ++t)
      for (int h = 0; h < 2; ++h) {
        const __m256i v = load32(sub + t * 64 + h * 32);
        for (int i = 0; i < MR; ++i) {
          const __m256i xb = _mm256_set1_epi32(load4(x.q + (i0 + i) * x.k + j * 16 + t * 4));
          if constexpr (kWide) {
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(v, 7), one);
            const __m256i part = _mm256_add_epi32(dot4(_mm256_and_si256(v, seven), xb),
                                                  _mm256_slli_epi32(dot4(high, xb), 7));
            dot[i][h] = _mm256_add_epi32(dot[i][h], part);
          } else {
            dot[i][h] = _mm256_add_epi32(dot[i][h], dot4(v, xb));
          }
        }
      }
    for (int h = 0; h < 2; ++h) {
      const __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(sub + 256) + h * 8);
      const __m256 offset = _mm256_mul_ps(scale, c);
      BLEND_KQ_ACC_256(scale, offset, j / 2, x.s16[(i0 + i) * subs + j])
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(out + i * kGroup, acc[i][0]);
    _mm256_storeu_ps(out + i * kGroup + 8, acc[i][1]);
  }
}
#undef BLEND_KQ_ACC_256
#pragma GCC diagnostic pop

// mr rows as calls of the fixed-size kernels (an output's operations never depend on mr).
#define BLEND_KQ_BY_ROWS(NAME, CALL)                                                         \
  void NAME(const XRows& x, int64_t i0, int mr, const uint8_t* w, float ratio, float* out) { \
    (void)ratio;                                                                             \
    switch (mr) {                                                                            \
      case 4:                                                                                \
        return CALL(4);                                                                      \
      case 3:                                                                                \
        return CALL(3);                                                                      \
      case 2:                                                                                \
        return CALL(2);                                                                      \
      default:                                                                               \
        return CALL(1);                                                                      \
    }                                                                                        \
  }
#define BLEND_KQ_Q4K512(R) q4k_avx512<R>(x, i0, w, out)
#define BLEND_KQ_Q6K512(R) q6k_avx512<R>(x, i0, w, out)
#define BLEND_KQ_Q50512(R) q50_avx512<R>(x, i0, w, out)
#define BLEND_KQ_BYTE512(R) bytes_avx512<R>(x, i0, w, ratio, out)
#define BLEND_KQ_Q4K2(R) q4k_avx2<R>(x, i0, w, out)
#define BLEND_KQ_Q6K2(R) q6k_avx2<R>(x, i0, w, out)
#define BLEND_KQ_Q502(R) q50_avx2<R>(x, i0, w, out)
#define BLEND_KQ_BYTE2(R) bytes_avx2<R, false>(x, i0, w, ratio, out)
#define BLEND_KQ_WIDE2(R) bytes_avx2<R, true>(x, i0, w, ratio, out)
BLEND_KQ_BY_ROWS(q4k_avx512_rows, BLEND_KQ_Q4K512)
BLEND_KQ_BY_ROWS(q6k_avx512_rows, BLEND_KQ_Q6K512)
BLEND_KQ_BY_ROWS(q50_avx512_rows, BLEND_KQ_Q50512)
BLEND_KQ_BY_ROWS(bytes_avx512_rows, BLEND_KQ_BYTE512)
BLEND_KQ_BY_ROWS(q4k_avx2_rows, BLEND_KQ_Q4K2)
BLEND_KQ_BY_ROWS(q6k_avx2_rows, BLEND_KQ_Q6K2)
BLEND_KQ_BY_ROWS(q50_avx2_rows, BLEND_KQ_Q502)
BLEND_KQ_BY_ROWS(bytes_avx2_rows, BLEND_KQ_BYTE2)
BLEND_KQ_BY_ROWS(wide_avx2_rows, BLEND_KQ_WIDE2)
#undef BLEND_KQ_BY_ROWS
#undef BLEND_KQ_Q4K512
#undef BLEND_KQ_Q6K512
#undef BLEND_KQ_Q50512
#undef BLEND_KQ_BYTE512
#undef BLEND_KQ_Q4K2
#undef BLEND_KQ_Q6K2
#undef BLEND_KQ_Q502
#undef BLEND_KQ_BYTE2
#undef BLEND_KQ_WIDE2
#endif

GroupKernel kernel_for(Q8Kernel k, KQuantFormat f, bool wide) {
#if defined(__x86_64__)
  switch (k) {
    case Q8Kernel::kAvx512Vnni:
      return f == KQuantFormat::kQ4K   ? q4k_avx512_rows
             : f == KQuantFormat::kQ6K ? q6k_avx512_rows
             : f == KQuantFormat::kQ50 ? q50_avx512_rows
                                       : bytes_avx512_rows;
    case Q8Kernel::kAvxVnni:  // the AVX2 kernels (the same bits; no 256-bit VNNI variant yet)
    case Q8Kernel::kAvx2:
      return f == KQuantFormat::kQ4K   ? q4k_avx2_rows
             : f == KQuantFormat::kQ6K ? q6k_avx2_rows
             : f == KQuantFormat::kQ50 ? q50_avx2_rows
             : wide                    ? wide_avx2_rows
                                       : bytes_avx2_rows;
    case Q8Kernel::kPortable:
      break;
  }
#else
  (void)k;
  (void)wide;
#endif
  return f == KQuantFormat::kQ4K   ? q4k_portable
         : f == KQuantFormat::kQ6K ? q6k_portable
         : f == KQuantFormat::kQ50 ? q50_portable
                                   : bytes_portable;
}

struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s16, s32;
};

}  // namespace

bool KQuantMatrix::takes(const std::vector<const TensorView*>& parts) {
  if (parts.empty()) return false;
  bool any_k = false;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorView* p = parts[i];
    if (!kept_type(p->dtype) || p->shape.size() != 2 || p->shape[1] != parts[0]->shape[1])
      return false;
    if (i + 1 < parts.size() && p->shape[0] % kGroup != 0) return false;
    any_k = any_k || p->dtype != DType::kQ8_0;
  }
  return any_k;  // each type's rows are whole blocks of it (32 or 256 values): k fits x's 32
}

KQuantMatrix::KQuantMatrix(const std::vector<const TensorView*>& parts) {
  if (!takes(parts)) throw Error("cpu gemm: these weights are not Q4_K / Q6_K / Q5_0 matrices");
  k_ = parts[0]->shape[1];
  for (const TensorView* p : parts) n_ += p->shape[0];
  struct Source {
    const TensorView* part;
    int64_t row;
  };
  std::vector<Source> source;
  for (const TensorView* p : parts)
    for (int64_t r = 0; r < p->shape[0]; ++r) source.push_back({p, r});
  const int64_t groups = (n_ + kGroup - 1) / kGroup;
  size_t total = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const DType t = source[static_cast<size_t>(g * kGroup)].part->dtype;
    Group& gr = groups_.emplace_back();
    gr.format = t == DType::kQ4_K   ? KQuantFormat::kQ4K
                : t == DType::kQ6_K ? KQuantFormat::kQ6K
                : t == DType::kQ5_0 ? KQuantFormat::kQ50
                                    : KQuantFormat::kBytes;
    gr.wide = t == DType::kQ8_0;
    gr.offset_ratio = t == DType::kQ5_0 ? 16.0f : 128.0f;
    gr.offset = total;
    total += static_cast<size_t>(group_bytes(gr.format, k_));
  }
  data_ = allocate_buffer(total);
  bytes_ = total;
  auto* data = reinterpret_cast<uint8_t*>(data_.get());
  std::memset(data, 0, total);  // padding rows: zero levels and scales
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const Group& gr = groups_[static_cast<size_t>(g)];
    DecodedRow row;
    for (int64_t lane = 0; lane < kGroup && g * kGroup + lane < n_; ++lane) {
      const Source& s = source[static_cast<size_t>(g * kGroup + lane)];
      const DType t = s.part->dtype;
      decode_row(t, s.part->data + s.row * row_bytes(t, k_), k_, row);
      pack_lane(gr.format, row, k_, lane, data + gr.offset);
    }
  }
}

void KQuantMatrix::forward(const void* x, DType x_dtype, int64_t m, const float* bias, float* y,
                           bool accumulate) const {
  if (m <= 0) return;
  if (x_dtype != DType::kF32 && x_dtype != DType::kBF16)
    throw Error("cpu gemm: quantized layers take f32 or bf16 activations");
  const int64_t blocks = k_ / kXBlock, subs = k_ / kSub16;
  thread_local QuantizedRows xr;
  xr.q.resize(static_cast<size_t>(m * k_));
  xr.d.resize(static_cast<size_t>(m * blocks));
  xr.s16.resize(static_cast<size_t>(m * subs));
  xr.s32.resize(static_cast<size_t>(m * blocks));
  // (Pointers, not xr: inside the parallel loops xr would be each OpenMP thread's own.)
  int8_t* const xq = xr.q.data();
  float* const xd = xr.d.data();
  float* const s16 = xr.s16.data();
  float* const s32 = xr.s32.data();
#pragma omp parallel for schedule(static) if (m * k_ > 32768)
  for (int64_t i = 0; i < m; ++i) {
    quantize_x_row(x, x_dtype, i, k_, xq + i * k_, xd + i * blocks);
    for (int64_t j = 0; j < subs; ++j) {
      int32_t sum = 0;
      for (int64_t e = 0; e < kSub16; ++e) sum += xq[i * k_ + j * kSub16 + e];
      s16[i * subs + j] = static_cast<float>(sum);
    }
    for (int64_t b = 0; b < blocks; ++b)
      s32[i * blocks + b] = s16[i * subs + 2 * b] + s16[i * subs + 2 * b + 1];
  }
  const Q8Kernel which = best_q8_kernel();
  const XRows rows{xq, xd, s16, s32, k_};
  const auto* data = reinterpret_cast<const uint8_t*>(data_.get());
  const int64_t groups = static_cast<int64_t>(groups_.size());
  // A group's 16 weight rows stay in L1/L2 while every row of x streams past.
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const Group& gr = groups_[static_cast<size_t>(g)];
    const GroupKernel kernel = kernel_for(which, gr.format, gr.wide);
    const int64_t j0 = g * kGroup;
    const int64_t cols = std::min(kGroup, n_ - j0);
    float out[kMaxRows * kGroup];
    for (int64_t i0 = 0; i0 < m; i0 += kMaxRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, m - i0));
      kernel(rows, i0, mr, data + gr.offset, gr.offset_ratio, out);
      store_group_outputs(out, i0, mr, j0, cols, n_, bias, y, accumulate);
    }
  }
}

}  // namespace blend::cpu
