#include "core/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

// Bit-exactness with ggml depends on every a * b + c rounding twice, as ggml's reference C does
// on the targets it is built for. GCC contracts such expressions into one fused multiply-add in
// C++ whenever the target has FMA (-march=native), and clang does within an expression, which
// would change the last bit of a dequantized value and the choices the quantizers make. Placed
// after the includes so that it covers only this file's functions.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace blend {

namespace {

// Every float expression below keeps ggml's operand order, float (never double) arithmetic and
// int -> float conversion points, so that each value rounds as ggml's scalar reference rounds it.

constexpr int kSuperBlockElems = 256;   // QK_K
constexpr float kGroupMaxEps = 1e-15f;  // below this a group counts as all zero (GROUP_MAX_EPS)

// An f16 as ggml reads it. f16_to_f32 is exact, but it passes a signalling NaN through
// unchanged, while ggml converts with float arithmetic (or F16C), which quiets it.
float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const float v = f16_to_f32(h);
  return std::isnan(v) ? std::bit_cast<float>(std::bit_cast<uint32_t>(v) | 0x400000u) : v;
}

void store_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);  // round to nearest even, as GGML_FP32_TO_FP16
  std::memcpy(p, &h, 2);
}

// ---- Dequantization: ggml's dequantize_row_*, one block at a time.

void dequantize_q4_0(const uint8_t* b, float* y) {
  const float d = load_half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void dequantize_q4_1(const uint8_t* b, float* y) {
  const float d = load_half(b), m = load_half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: the fifth bit of element j is bit j of the little-endian u32 qh.
template <bool kHasMin>
void dequantize_q5(const uint8_t* b, float* y) {
  const float d = load_half(b), m = kHasMin ? load_half(b + 2) : 0.0f;
  const uint8_t* p = b + (kHasMin ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) << 4) & 0x10);
    const int hi = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
    if constexpr (kHasMin) {
      y[j] = static_cast<float>(lo) * d + m;
      y[j + 16] = static_cast<float>(hi) * d + m;
    } else {
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + 16] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequantize_q8_0(const uint8_t* b, float* y) {
  const float d = load_half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: scales[16] (low nibble scale, high nibble min of each 16 elements), qs[64], d, dmin.
// Each 32 bytes of qs hold 128 elements, four 2-bit planes of 32; a plane's first and second 16
// elements are separate sub-blocks with their own scale.
void dequantize_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = load_half(b + 80), dmin = load_half(b + 82);
  int sub = 0;
  for (int half_block = 0; half_block < 2; ++half_block, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = scales[sub++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>((q[16 * part + l] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K: hmask[32] (third bit, one bit plane per 32 elements), qs[64] (two low bits, laid out
// as Q2_K's), 16 6-bit scales in 12 bytes, d. Scale i has its low nibble in byte i (i < 8) or
// the high nibble of byte i - 8, and its top two bits at bit 2 * (i / 4) of byte 8 + i % 4:
// what ggml's kmask1/kmask2 word shuffle produces.
void dequantize_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* packed = b + 96;
  const float d_all = load_half(b + 108);
  int scales[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? packed[i] & 0xF : packed[i - 8] >> 4;
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = (low | (high << 4)) - 32;
  }
  int sub = 0;
  uint8_t plane_bit = 1;
  for (int half_block = 0; half_block < 2; ++half_block, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, plane_bit = static_cast<uint8_t>(plane_bit << 1)) {
      for (int part = 0; part < 2; ++part) {
        const float dl = d_all * static_cast<float>(scales[sub++]);
        for (int l = 0; l < 16; ++l) {
          const int k = 16 * part + l;
          const int v = ((q[k] >> shift) & 3) - ((hmask[k] & plane_bit) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
    }
  }
}

// The inverse of unpack_q4_k_scale_min, OR-ing into zeroed bytes (scale, min <= 63).
void pack_scale_min(int j, uint8_t scale, uint8_t min, uint8_t* packed) {
  if (j < 4) {
    packed[j] |= scale;
    packed[j + 4] |= min;
  } else {
    packed[j + 4] |= static_cast<uint8_t>((scale & 0xF) | ((min & 0xF) << 4));
    packed[j - 4] |= static_cast<uint8_t>((scale >> 4) << 6);
    packed[j] |= static_cast<uint8_t>((min >> 4) << 6);
  }
}

// Q4_K / Q5_K (kHasHighBits): d, dmin, scales[12], [Q5_K: qh[32]], qs[128]. Each 32 bytes of
// qs hold 64 elements: two sub-blocks, low nibbles then high nibbles. Q5_K's fifth bit of
// sub-block s is bit s of qh[l].
template <bool kHasHighBits>
void dequantize_q45_k(const uint8_t* b, float* y) {
  const float d = load_half(b), dmin = load_half(b + 2);
  const uint8_t* packed = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + (kHasHighBits ? 48 : 16);
  for (int sub = 0; sub < 8; sub += 2, q += 32) {
    uint8_t sc, mn;
    unpack_q4_k_scale_min(sub, packed, sc, mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    unpack_q4_k_scale_min(sub + 1, packed, sc, mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l) {
      const int high = kHasHighBits && ((qh[l] >> sub) & 1) ? 16 : 0;
      *y++ = d1 * static_cast<float>((q[l] & 0xF) + high) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int high = kHasHighBits && ((qh[l] >> (sub + 1)) & 1) ? 16 : 0;
      *y++ = d2 * static_cast<float>((q[l] >> 4) + high) - m2;
    }
  }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (one per 16 elements), d.
// Per 128 elements: ql[l] holds elements l (low nibble) and l + 64 (high), ql[l + 32] elements
// l + 32 and l + 96, and qh[l] the high bits of l, l + 32, l + 64, l + 96 at bits 0, 2, 4, 6.
void dequantize_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_half(b + 208);
  for (int half_block = 0; half_block < 2; ++half_block, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// ---- Quantization: ggml's quantize_row_*_ref, one block at a time.

// ggml's nearest_int: adding 1.5 * 2^23 leaves round-half-even(v) in the low mantissa bits. The
// bit arithmetic (not lrintf) is kept because ggml's bytes for |v| > 2^22, inf and NaN are what
// these bits give, and the K-quant searches can meet such values.
int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<uint32_t>(shifted) & 0x7fffffu) - 0x400000;
}

// C's float -> int8_t conversion as ggml's Q8_0 / Q4_0 quantizers use it. In range it truncates;
// out of range C leaves it undefined (reachable only from inf/NaN input or a block of subnormals,
// whose inverse scale overflows), and x86 yields INT32_MIN, whose low byte is 0: pinned here.
int8_t truncate_to_int8(float v) {
  if (!(v > -2147483648.0f && v < 2147483648.0f)) return 0;
  return static_cast<int8_t>(static_cast<int32_t>(v));
}

// Q8_0: d = max|x| / 127; each value x / d rounded half away from zero.
void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = std::fabs(x[j]);
    amax = amax > a ? amax : a;  // ggml's MAX(amax, a), whose NaN handling differs from std::max
  }
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(b, d);
  for (int j = 0; j < 32; ++j)
    b[2 + j] = static_cast<uint8_t>(truncate_to_int8(std::round(x[j] * id)));
}

// The first of a block's 32 elements of largest magnitude, with its sign (Q4_0's and Q5_0's
// scale is it over minus their lowest level).
float signed_absmax32(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// Q4_0: the element of largest magnitude, with its sign, becomes level 0 (-8 * d); the others
// round to nearest (truncation of x / d + 8.5), the top level 16 clamped to 15.
void quantize_q4_0(const float* x, uint8_t* b) {
  const float d = signed_absmax32(x) / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(b, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, static_cast<int>(truncate_to_int8(x[j] * id + 8.5f)));
    const int hi = std::min(15, static_cast<int>(truncate_to_int8(x[j + 16] * id + 8.5f)));
    b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// Q5_0: as Q4_0 with 32 levels: the element of largest magnitude, with its sign, becomes level 0
// (-16 * d); the others round to nearest (truncation of x / d + 16.5), the top level 32 clamped
// to 31. The low four bits go to qs as Q4_0 packs them, the fifth bit of element j to bit j of qh.
void quantize_q5_0(const float* x, uint8_t* b) {
  const float d = signed_absmax32(x) / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(b, d);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(31, static_cast<int>(truncate_to_int8(x[j] * id + 16.5f)));
    const int hi = std::min(31, static_cast<int>(truncate_to_int8(x[j + 16] * id + 16.5f)));
    b[6 + j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
    qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
  }
  std::memcpy(b + 2, &qh, 4);  // little-endian, as ggml's memcpy of its uint32_t
}

// ggml's make_qkx2_quants for one 32-element sub-block, without the mean-absolute-error option
// Q4_K/Q5_K don't use. Fits x[i] ~ scale * level[i] - min_out (level in [0, nmax], min_out >= 0)
// minimizing the weighted squared error: it starts from the grid spanning [min(x, 0), max(x)],
// then tries nstep + 1 grids of nmax + rmin + 0.1 k steps over that range; for each, the levels
// fixed, scale and offset solve the weighted least-squares normal equations (the offset pinned
// to 0 when it would go positive), and the grid with the least error wins. Returns the scale.
float fit_scale_and_min(int nmax, const float* x, const float* weights, uint8_t* levels,
                        float* min_out, float rmin, int nstep) {
  constexpr int n = 32;
  constexpr float rdelta = 0.1f;
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;  // the offset only ever shifts down: levels start at min(x, 0)
  if (max == min) {
    std::fill(levels, levels + n, uint8_t{0});
    *min_out = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    levels[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * static_cast<float>(levels[i]) + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  uint8_t trial[n];
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float wl = weights[i] * static_cast<float>(l);
      sum_l += wl;
      sum_l2 += wl * static_cast<float>(l);
      sum_xl += wl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) continue;  // all levels equal: the normal equations are singular
    float trial_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float trial_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (trial_min > 0) {
      trial_min = 0;
      trial_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = trial_scale * static_cast<float>(trial[i]) + trial_min - x[i];
      error += weights[i] * (diff * diff);
    }
    if (error < best_error) {
      std::copy(trial, trial + n, levels);
      best_error = error;
      scale = trial_scale;
      min = trial_min;
    }
  }
  *min_out = -min;
  return scale;
}

// ggml's make_qx_quants as Q6_K calls it (16 elements, levels -32..31 stored +32, weights x^2):
// fits x ~ scale * level symmetrically. The element of largest magnitude sets the first grid;
// 18 grids of 32 +- 0.1 k steps are tried, each scored by the weighted least-squares scale's
// explained energy sumlx^2 / suml2. Returns the scale (negative when the extreme is positive).
float fit_symmetric_scale(const float* x, uint8_t* levels) {
  constexpr int kN = 16, kNmax = 32;
  float amax = 0, max = 0;
  for (int i = 0; i < kN; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(levels, levels + kN, uint8_t{0});
    return 0.0f;
  }
  // Sums over the grid of inverse scale `iscale`, optionally storing its levels.
  auto score = [&](float iscale, float& sumlx, float& suml2, bool store) {
    sumlx = suml2 = 0;
    for (int i = 0; i < kN; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -kNmax, kNmax - 1);
      if (store) levels[i] = static_cast<uint8_t>(l + kNmax);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * static_cast<float>(l);
      suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
  };
  float sumlx, suml2;
  score(static_cast<float>(-kNmax) / max, sumlx, suml2, true);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    const float iscale = -(static_cast<float>(kNmax) + 0.1f * static_cast<float>(step)) / max;
    score(iscale, sumlx, suml2, false);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      score(iscale, sumlx, suml2, true);  // the same sums again, now keeping the levels
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q4_K / Q5_K (quantize_row_q4_K_ref / q5_K_ref): fit every 32-element sub-block with weights
// rms(sub-block) + |x|, quantize the 8 scales and 8 mins to 6 bits against the largest of each
// (d = max_scale / 63, dmin = max_min / 63), then requantize each element against the 6-bit
// scale and min it will be decoded with. Writes d, dmin, the packed scales (b[0..15]) and the
// levels (0..nmax); a sub-block whose decoded scale is 0 keeps the levels of its own fit.
void quantize_scales_and_levels_k(const float* x, int nmax, float rmin, int nstep, uint8_t* b,
                                  uint8_t* levels) {
  float scales[8], mins[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    float weights[32];
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_scale_and_min(nmax, xs, weights, levels + 32 * j, &mins[j], rmin, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* packed = b + 4;
  std::memset(packed, 0, 12);
  for (int j = 0; j < 8; ++j) {
    // ggml narrows to uint8_t before clamping, so a stray negative wraps high and clamps to 63.
    const uint8_t ls =
        std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    pack_scale_min(j, ls, lm, packed);
  }
  store_half(b, max_scale / 63.f);
  store_half(b + 2, max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, mn;
    unpack_q4_k_scale_min(j, packed, sc, mn);
    const float d = load_half(b) * static_cast<float>(sc);
    if (d == 0) continue;
    const float dm = load_half(b + 2) * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l)
      levels[32 * j + l] =
          static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
  }
}

void quantize_q4_k(const float* x, uint8_t* b) {
  uint8_t levels[kSuperBlockElems];
  quantize_scales_and_levels_k(x, 15, -1.0f, 20, b, levels);
  uint8_t* q = b + 16;
  for (int j = 0; j < kSuperBlockElems; j += 64, q += 32)
    for (int l = 0; l < 32; ++l)
      q[l] = static_cast<uint8_t>(levels[j + l] | (levels[j + l + 32] << 4));
}

void quantize_q5_k(const float* x, uint8_t* b) {
  uint8_t levels[kSuperBlockElems];
  quantize_scales_and_levels_k(x, 31, -0.5f, 15, b, levels);
  uint8_t* qh = b + 16;
  uint8_t* q = b + 48;
  std::memset(qh, 0, 32);
  for (int j = 0, sub = 0; j < kSuperBlockElems; j += 64, sub += 2, q += 32) {
    for (int l = 0; l < 32; ++l) {
      const int lo = levels[j + l], hi = levels[j + l + 32];
      qh[l] |= static_cast<uint8_t>(((lo >> 4) << sub) | ((hi >> 4) << (sub + 1)));
      q[l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
    }
  }
}

// Q6_K (quantize_row_q6_K_ref): fit each 16 elements symmetrically, quantize the 16 scales to
// int8 against the one of largest magnitude (which becomes -128, clamped to 127 by sign), then
// requantize each element against its decoded scale.
void quantize_q6_k(const float* x, uint8_t* b) {
  uint8_t levels[kSuperBlockElems];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int s = 0; s < 16; ++s) {
    scales[s] = fit_symmetric_scale(x + 16 * s, levels + 16 * s);
    if (std::fabs(scales[s]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[s]);
      max_scale = scales[s];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(b, 0, 210);
    return;
  }
  const float iscale = -128.f / max_scale;
  store_half(b + 208, 1 / iscale);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s)
    sc[s] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[s])));
  for (int s = 0; s < 16; ++s) {
    const float d = load_half(b + 208) * static_cast<float>(sc[s]);
    if (d == 0) continue;
    for (int l = 0; l < 16; ++l)
      levels[16 * s + l] =
          static_cast<uint8_t>(std::clamp(nearest_int(x[16 * s + l] / d), -32, 31) + 32);
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int j = 0; j < kSuperBlockElems; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* lv = levels + j + l;  // the four elements l, l + 32, l + 64, l + 96
      ql[l] = static_cast<uint8_t>((lv[0] & 0xF) | ((lv[64] & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((lv[32] & 0xF) | ((lv[96] & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((lv[0] >> 4) | ((lv[32] >> 4) << 2) | ((lv[64] >> 4) << 4) |
                                   ((lv[96] >> 4) << 6));
    }
  }
}

void dequantize_f32(const uint8_t* b, float* y) {
  std::memcpy(y, b, 4);
}

void dequantize_f16(const uint8_t* b, float* y) {
  *y = load_half(b);
}

void dequantize_bf16(const uint8_t* b, float* y) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  *y = bf16_to_f32(h);  // ggml's bf16 -> f32 is the same shift, NaNs included
}

// What this file knows of a type: its block layout, and how to read and (where ggml's reference
// quantizer is implemented here) write one block.
struct TypeCodec {
  GgmlType type;
  GgmlBlockLayout layout;
  void (*dequantize_block)(const uint8_t* block, float* out);
  void (*quantize_block)(const float* in, uint8_t* block);  // nullptr: not implemented
};

constexpr TypeCodec kCodecs[] = {
    {GgmlType::kF32, {1, 4, "F32"}, dequantize_f32, nullptr},
    {GgmlType::kF16, {1, 2, "F16"}, dequantize_f16, nullptr},
    {GgmlType::kBF16, {1, 2, "BF16"}, dequantize_bf16, nullptr},
    {GgmlType::kQ4_0, {32, 18, "Q4_0"}, dequantize_q4_0, quantize_q4_0},
    {GgmlType::kQ4_1, {32, 20, "Q4_1"}, dequantize_q4_1, nullptr},
    {GgmlType::kQ5_0, {32, 22, "Q5_0"}, dequantize_q5<false>, quantize_q5_0},
    {GgmlType::kQ5_1, {32, 24, "Q5_1"}, dequantize_q5<true>, nullptr},
    {GgmlType::kQ8_0, {32, 34, "Q8_0"}, dequantize_q8_0, quantize_q8_0},
    {GgmlType::kQ2_K, {256, 84, "Q2_K"}, dequantize_q2_k, nullptr},
    {GgmlType::kQ3_K, {256, 110, "Q3_K"}, dequantize_q3_k, nullptr},
    {GgmlType::kQ4_K, {256, 144, "Q4_K"}, dequantize_q45_k<false>, quantize_q4_k},
    {GgmlType::kQ5_K, {256, 176, "Q5_K"}, dequantize_q45_k<true>, quantize_q5_k},
    {GgmlType::kQ6_K, {256, 210, "Q6_K"}, dequantize_q6_k, quantize_q6_k},
};

const TypeCodec* find_codec(uint32_t type) {
  for (const TypeCodec& codec : kCodecs)
    if (static_cast<uint32_t>(codec.type) == type) return &codec;
  return nullptr;
}

// "ggml type 16 (IQ2_XS)", for errors.
std::string describe_type(uint32_t type) {
  return "ggml type " + std::to_string(type) + " (" + ggml_type_display_name(type) + ")";
}

int64_t whole_blocks(const GgmlBlockLayout& layout, int64_t n) {
  if (n < 0 || n % layout.block_elems != 0)
    throw Error("gguf: " + std::to_string(n) + " elements are not whole " + layout.name +
                " blocks of " + std::to_string(layout.block_elems));
  return n / layout.block_elems;
}

}  // namespace

// The 6-bit scale and min of sub-block j (of 8) in a Q4_K / Q5_K super-block's 12 packed bytes:
// for j < 4 the low 6 bits of bytes j and j + 4; for j >= 4 the nibbles of byte j + 4, topped by
// the spare two high bits of bytes j - 4 (scale) and j (min).
void unpack_q4_k_scale_min(int j, const uint8_t* packed, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = packed[j] & 63;
    min = packed[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

std::optional<GgmlBlockLayout> ggml_block_layout(uint32_t type) {
  if (const TypeCodec* codec = find_codec(type)) return codec->layout;
  return std::nullopt;
}

const char* ggml_type_display_name(uint32_t type) {
  // ggml.h's enum ggml_type by number, spelled as gguf-py's GGMLQuantizationType; numbers 4, 5
  // (Q4_2, Q4_3) and 31-33, 36-38 (the repacked Q4_0 / IQ4_NL variants) were removed from ggml.
  static const char* const kNames[] = {
      "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
      "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
      "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
      "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
      "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
      "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",    "NVFP4",    "Q1_0",
      "Q2_0"};
  return type < std::size(kNames) ? kNames[type] : "unknown";
}

void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n) {
  const TypeCodec* codec = find_codec(type);
  if (!codec) throw Error("gguf: cannot dequantize " + describe_type(type));
  const int64_t blocks = whole_blocks(codec->layout, n);
  const uint8_t* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < blocks; ++i) {
    codec->dequantize_block(b, dst);
    b += codec->layout.block_bytes;
    dst += codec->layout.block_elems;
  }
}

void quantize_row(uint32_t type, const float* src, void* dst, int64_t n) {
  const TypeCodec* codec = find_codec(type);
  if (!codec || !codec->quantize_block)
    throw Error("gguf: cannot quantize to " + describe_type(type) +
                " (supported: Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)");
  const int64_t blocks = whole_blocks(codec->layout, n);
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < blocks; ++i) {
    codec->quantize_block(src, b);
    src += codec->layout.block_elems;
    b += codec->layout.block_bytes;
  }
}

}  // namespace blend
