#include "gguf/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace blend {

namespace {

// Every expression below keeps ggml's operand order and float (not double) arithmetic, so that
// each element rounds as ggml's scalar reference rounds it.

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

void dequantize_q4_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 0x0F) - 8, x1 = (qs[j] >> 4) - 8;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}

void dequantize_q4_1(const uint8_t* b, float* y) {
  const float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: the fifth bit of element j is bit j of qh, of element j + 16 bit j + 16.
void dequantize_q5(const uint8_t* b, float* y, bool has_min) {
  const float d = half(b), m = has_min ? half(b + 2) : 0.0f;
  const uint8_t* p = b + (has_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    const int x0 = (qs[j] & 0x0F) | h0, x1 = (qs[j] >> 4) | h1;
    if (has_min) {
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    } else {
      y[j] = static_cast<float>(x0 - 16) * d;
      y[j + 16] = static_cast<float>(x1 - 16) * d;
    }
  }
}

void dequantize_q8_0(const uint8_t* b, float* y) {
  const float d = half(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// Q2_K: 16 sub-blocks of 16, each a 4-bit scale and 4-bit min (scales[16]), 2-bit values in
// qs[64] (four sub-blocks' worth of shifts per 32 bytes), then d and dmin.
void dequantize_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int part = 0; part < 2; ++part) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
      }
      shift += 2;
    }
    q += 32;
  }
}

// Q3_K: hmask[32] (the third bit), qs[64] (two low bits), 16 6-bit scales packed in 12 bytes
// (low 4 bits in bytes 0-7, high 2 bits in bytes 8-11), then d.
void dequantize_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const uint8_t* packed = b + 96;
  const float d_all = half(b + 108);
  int8_t scales[16];
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? packed[i] & 0xF : packed[i - 8] >> 4;
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = static_cast<int8_t>(low | (high << 4));
  }
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int part = 0; part < 2; ++part) {
        const float dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 0; l < 16; ++l) {
          const int k = l + 16 * part;
          const int v = ((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
      shift += 2;
      m = static_cast<uint8_t>(m << 1);
    }
    q += 32;
  }
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (12 packed bytes): for
// j < 4 the low 6 bits of bytes j and j + 4; above, 4 bits from byte j + 4 and 2 from the top of
// bytes j - 4 (scale) and j (min).
void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void dequantize_q4_k(const uint8_t* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int is = 0; is < 8; is += 2) {
    uint8_t sc, mn;
    scale_min_k4(is, scales, sc, mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    scale_min_k4(is + 1, scales, sc, mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
  }
}

void dequantize_q5_k(const uint8_t* b, float* y) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2) {
    uint8_t sc, mn;
    scale_min_k4(is, scales, sc, mn);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
    scale_min_k4(is + 1, scales, sc, mn);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l)
      *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    ql += 32;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 scales, d.
void dequantize_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int n = 0; n < 256; n += 128) {
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
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

void store_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// quantize_row_q8_0_ref: d = max|x| / 127, values rounded half away from zero.
void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(b, d);
  for (int j = 0; j < 32; ++j)
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

// quantize_row_q4_0_ref: the element of largest magnitude, with its sign, maps to -8.
void quantize_q4_0(const float* x, uint8_t* b) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(b, d);
  for (int j = 0; j < 16; ++j) {
    const int x0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int x1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[16 + j] * id + 8.5f)));
    b[2 + j] = static_cast<uint8_t>(x0 | (x1 << 4));
  }
}

}  // namespace

std::optional<GgmlBlockLayout> ggml_block_layout(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return GgmlBlockLayout{1, 4, "F32"};
    case GgmlType::kF16:
      return GgmlBlockLayout{1, 2, "F16"};
    case GgmlType::kBF16:
      return GgmlBlockLayout{1, 2, "BF16"};
    case GgmlType::kQ4_0:
      return GgmlBlockLayout{32, 18, "Q4_0"};
    case GgmlType::kQ4_1:
      return GgmlBlockLayout{32, 20, "Q4_1"};
    case GgmlType::kQ5_0:
      return GgmlBlockLayout{32, 22, "Q5_0"};
    case GgmlType::kQ5_1:
      return GgmlBlockLayout{32, 24, "Q5_1"};
    case GgmlType::kQ8_0:
      return GgmlBlockLayout{32, 34, "Q8_0"};
    case GgmlType::kQ2_K:
      return GgmlBlockLayout{256, 84, "Q2_K"};
    case GgmlType::kQ3_K:
      return GgmlBlockLayout{256, 110, "Q3_K"};
    case GgmlType::kQ4_K:
      return GgmlBlockLayout{256, 144, "Q4_K"};
    case GgmlType::kQ5_K:
      return GgmlBlockLayout{256, 176, "Q5_K"};
    case GgmlType::kQ6_K:
      return GgmlBlockLayout{256, 210, "Q6_K"};
  }
  return std::nullopt;
}

const char* ggml_type_display_name(uint32_t type) {
  if (std::optional<GgmlBlockLayout> l = ggml_block_layout(type)) return l->name;
  // ggml.h's other types, by number (removed numbers 4, 5 were Q4_2 and Q4_3).
  static const char* const kNames[] = {
      nullptr, nullptr,      nullptr,      nullptr,      "Q4_2",     "Q4_3",     nullptr,
      nullptr, nullptr,      "Q8_1",       nullptr,      nullptr,    nullptr,    nullptr,
      nullptr, "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
      "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
      "F64",   "IQ1_M",      nullptr,      "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
      "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
  if (type < sizeof kNames / sizeof kNames[0] && kNames[type]) return kNames[type];
  return "an unknown ggml type";
}

void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n) {
  const std::optional<GgmlBlockLayout> layout = ggml_block_layout(type);
  if (!layout)
    throw Error(std::string("gguf: cannot dequantize tensor type ") + ggml_type_display_name(type));
  if (n < 0 || n % layout->block_elems != 0)
    throw Error("gguf: " + std::to_string(n) + " elements are not whole " + layout->name +
                " blocks of " + std::to_string(layout->block_elems));
  const uint8_t* b = static_cast<const uint8_t*>(src);
  const int64_t blocks = n / layout->block_elems;
  for (int64_t i = 0; i < blocks; ++i, b += layout->block_bytes, dst += layout->block_elems) {
    switch (static_cast<GgmlType>(type)) {
      case GgmlType::kF32:
        std::memcpy(dst, b, 4);
        break;
      case GgmlType::kF16:
        *dst = half(b);
        break;
      case GgmlType::kBF16: {
        uint16_t h;
        std::memcpy(&h, b, 2);
        *dst = bf16_to_f32(h);
        break;
      }
      case GgmlType::kQ4_0:
        dequantize_q4_0(b, dst);
        break;
      case GgmlType::kQ4_1:
        dequantize_q4_1(b, dst);
        break;
      case GgmlType::kQ5_0:
        dequantize_q5(b, dst, false);
        break;
      case GgmlType::kQ5_1:
        dequantize_q5(b, dst, true);
        break;
      case GgmlType::kQ8_0:
        dequantize_q8_0(b, dst);
        break;
      case GgmlType::kQ2_K:
        dequantize_q2_k(b, dst);
        break;
      case GgmlType::kQ3_K:
        dequantize_q3_k(b, dst);
        break;
      case GgmlType::kQ4_K:
        dequantize_q4_k(b, dst);
        break;
      case GgmlType::kQ5_K:
        dequantize_q5_k(b, dst);
        break;
      case GgmlType::kQ6_K:
        dequantize_q6_k(b, dst);
        break;
    }
  }
}

void quantize_row(uint32_t type, const float* src, void* dst, int64_t n) {
  void (*quantize_block)(const float*, uint8_t*) = nullptr;
  if (type == static_cast<uint32_t>(GgmlType::kQ8_0)) quantize_block = quantize_q8_0;
  if (type == static_cast<uint32_t>(GgmlType::kQ4_0)) quantize_block = quantize_q4_0;
  if (!quantize_block)
    throw Error(std::string("gguf: quantizing to ") + ggml_type_display_name(type) +
                " is not supported (Q8_0, Q4_0)");
  if (n < 0 || n % 32 != 0)
    throw Error("gguf: " + std::to_string(n) + " elements are not whole blocks of 32");
  const GgmlBlockLayout layout = *ggml_block_layout(type);
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; i += 32, b += layout.block_bytes) quantize_block(src + i, b);
}

}  // namespace blend
