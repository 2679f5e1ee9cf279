#include "core/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"

namespace blend {
namespace {

uint32_t t(GgmlType type) {
  return static_cast<uint32_t>(type);
}

GgmlBlockLayout layout_of(GgmlType type) {
  return *ggml_block_layout(t(type));
}

void put_half(std::vector<uint8_t>& b, size_t at, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(b.data() + at, &h, 2);
}

void put_half_bits(std::vector<uint8_t>& b, size_t at, uint16_t h) {
  std::memcpy(b.data() + at, &h, 2);
}

std::vector<float> dequantize(GgmlType type, const std::vector<uint8_t>& blocks) {
  const GgmlBlockLayout l = layout_of(type);
  EXPECT_EQ(blocks.size() % l.block_bytes, 0u) << l.name;
  std::vector<float> y(blocks.size() / l.block_bytes * l.block_elems);
  dequantize_row(t(type), blocks.data(), y.data(), static_cast<int64_t>(y.size()));
  return y;
}

std::vector<uint8_t> quantize(GgmlType type, const std::vector<float>& x) {
  const GgmlBlockLayout l = layout_of(type);
  std::vector<uint8_t> q(x.size() / l.block_elems * l.block_bytes);
  quantize_row(t(type), x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

uint32_t bits_of(float f) {
  return std::bit_cast<uint32_t>(f);
}

// The message of the blend::Error `fn` throws ("" and a test failure when it throws none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no blend::Error";
  return "";
}

// Deterministic inputs, the same on every platform (integer arithmetic and exact float ops
// only), shared with the program that computed the golden values below from ggml.
uint64_t next_random(uint64_t& state) {  // splitmix64
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Byte offsets of a block's f16 fields (d, and dmin / m where the type has one).
std::vector<size_t> half_offsets(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {0};
  }
}

// `blocks` blocks of random bytes whose f16 fields are finite (exponent 31 loses its top bit).
std::vector<uint8_t> random_blocks(GgmlType type, int blocks, uint64_t seed) {
  const size_t block_bytes = layout_of(type).block_bytes;
  std::vector<uint8_t> bytes(block_bytes * blocks);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(next_random(seed) >> 56);
  for (int i = 0; i < blocks; ++i) {
    for (size_t at : half_offsets(type)) {
      uint8_t* p = bytes.data() + i * block_bytes + at;
      if ((p[1] & 0x7c) == 0x7c) p[1] &= 0xbf;
    }
  }
  return bytes;
}

// 2048 floats in 8 groups of 256: 24-bit integers times a power of two, one group all zero, one
// negative only, one with a lone outlier (element 77 of group 6, 4096 times its neighbours).
std::vector<float> quantize_input() {
  const float kScales[4] = {0x1p-23f, 0x1p-30f, 0x1p-10f, 0x1p-16f};
  std::vector<float> x(2048);
  uint64_t state = 7;
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t group = i / 256;
    float v = static_cast<float>(static_cast<int32_t>(next_random(state) >> 40) - (1 << 23));
    if (group == 5 && v > 0) v = -v;
    x[i] = v * kScales[group % 4];
  }
  for (size_t i = 2 * 256; i < 3 * 256; ++i) x[i] = 0;
  x[6 * 256 + 77] *= 4096;
  return x;
}

uint64_t fnv1a(uint64_t h, uint8_t byte) {
  return (h ^ byte) * 0x100000001b3ull;
}

uint64_t hash_floats(const std::vector<float>& y) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (float f : y)
    for (int k = 0; k < 4; ++k) h = fnv1a(h, static_cast<uint8_t>(bits_of(f) >> (8 * k)));
  return h;
}

uint64_t hash_bytes(const std::vector<uint8_t>& b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t c : b) h = fnv1a(h, c);
  return h;
}

const GgmlType kBlockTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                                GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                GgmlType::kQ5_K, GgmlType::kQ6_K};
const GgmlType kQuantizable[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0,
                                 GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

TEST(GgmlQuant, LayoutsAndNamesAreGgmls) {
  struct Want {
    GgmlType type;
    uint32_t elems, bytes;
    const char* name;
  };
  const Want want[] = {{GgmlType::kF32, 1, 4, "F32"},       {GgmlType::kF16, 1, 2, "F16"},
                       {GgmlType::kBF16, 1, 2, "BF16"},     {GgmlType::kQ4_0, 32, 18, "Q4_0"},
                       {GgmlType::kQ4_1, 32, 20, "Q4_1"},   {GgmlType::kQ5_0, 32, 22, "Q5_0"},
                       {GgmlType::kQ5_1, 32, 24, "Q5_1"},   {GgmlType::kQ8_0, 32, 34, "Q8_0"},
                       {GgmlType::kQ2_K, 256, 84, "Q2_K"},  {GgmlType::kQ3_K, 256, 110, "Q3_K"},
                       {GgmlType::kQ4_K, 256, 144, "Q4_K"}, {GgmlType::kQ5_K, 256, 176, "Q5_K"},
                       {GgmlType::kQ6_K, 256, 210, "Q6_K"}};
  for (const Want& w : want) {
    const auto l = ggml_block_layout(t(w.type));
    ASSERT_TRUE(l.has_value()) << w.name;
    EXPECT_EQ(l->block_elems, w.elems) << w.name;
    EXPECT_EQ(l->block_bytes, w.bytes) << w.name;
    EXPECT_STREQ(l->name, w.name);
    EXPECT_STREQ(ggml_type_display_name(t(w.type)), w.name);
  }
  for (uint32_t unreadable : {4u, 9u, 15u, 16u, 24u, 28u, 34u, 39u, 99u})
    EXPECT_FALSE(ggml_block_layout(unreadable).has_value()) << unreadable;
  EXPECT_STREQ(ggml_type_display_name(9), "Q8_1");
  EXPECT_STREQ(ggml_type_display_name(15), "Q8_K");
  EXPECT_STREQ(ggml_type_display_name(16), "IQ2_XXS");
  EXPECT_STREQ(ggml_type_display_name(23), "IQ4_XS");
  EXPECT_STREQ(ggml_type_display_name(24), "I8");
  EXPECT_STREQ(ggml_type_display_name(29), "IQ1_M");
  EXPECT_STREQ(ggml_type_display_name(34), "TQ1_0");
  EXPECT_STREQ(ggml_type_display_name(39), "MXFP4");
  EXPECT_STREQ(ggml_type_display_name(42), "Q2_0");
  EXPECT_STREQ(ggml_type_display_name(43), "unknown");
  EXPECT_STREQ(ggml_type_display_name(0xffffffffu), "unknown");
}

TEST(GgmlQuant, UnreadableTypesAndPartialBlocksAreErrors) {
  std::vector<uint8_t> b(1024, 0);
  std::vector<float> y(512, 0.0f);
  std::string e = error_of([&] { dequantize_row(16, b.data(), y.data(), 256); });
  EXPECT_NE(e.find("16"), std::string::npos) << e;
  EXPECT_NE(e.find("IQ2_XXS"), std::string::npos) << e;
  e = error_of([&] { dequantize_row(99, b.data(), y.data(), 32); });
  EXPECT_NE(e.find("99"), std::string::npos) << e;
  e = error_of([&] { dequantize_row(t(GgmlType::kQ8_0), b.data(), y.data(), 31); });
  EXPECT_NE(e.find("31"), std::string::npos) << e;
  EXPECT_NE(e.find("Q8_0"), std::string::npos) << e;
  EXPECT_THROW(dequantize_row(t(GgmlType::kQ4_K), b.data(), y.data(), 128), Error);
  EXPECT_THROW(dequantize_row(t(GgmlType::kQ4_K), b.data(), y.data(), -256), Error);
  EXPECT_NO_THROW(dequantize_row(t(GgmlType::kQ4_K), b.data(), y.data(), 0));
  e = error_of([&] { quantize_row(t(GgmlType::kQ4_1), y.data(), b.data(), 32); });
  EXPECT_NE(e.find("Q4_1"), std::string::npos) << e;
  EXPECT_THROW(quantize_row(t(GgmlType::kQ2_K), y.data(), b.data(), 256), Error);
  EXPECT_THROW(quantize_row(t(GgmlType::kF16), y.data(), b.data(), 256), Error);
  EXPECT_THROW(quantize_row(77, y.data(), b.data(), 256), Error);
  EXPECT_THROW(quantize_row(t(GgmlType::kQ6_K), y.data(), b.data(), 255), Error);
  EXPECT_THROW(quantize_row(t(GgmlType::kQ8_0), y.data(), b.data(), 48), Error);
}

// Byte j holds element j in its low nibble and element j + 16 in its high one.
TEST(GgmlQuant, Q4NibbleOrderScaleAndMin) {
  std::vector<uint8_t> b(18, 0);
  put_half(b, 0, 0.5f);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> y = dequantize(GgmlType::kQ4_0, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * static_cast<float>(7 - j)) << j;
  }
  std::vector<uint8_t> b1(20, 0);
  put_half(b1, 0, 0.25f);
  put_half(b1, 2, -1.0f);
  for (int j = 0; j < 16; ++j) b1[4 + j] = static_cast<uint8_t>(j | (3 << 4));
  y = dequantize(GgmlType::kQ4_1, b1);
  EXPECT_EQ(y[5], 0.25f * 5 - 1.0f);
  EXPECT_EQ(y[21], 0.25f * 3 - 1.0f);
}

// The fifth bit of element j is bit j of qh (elements 16-31: bits 16-31).
TEST(GgmlQuant, Q5HighBits) {
  std::vector<uint8_t> b(22, 0);
  put_half(b, 0, 1.0f);
  const uint32_t qh = (1u << 3) | (1u << 20);  // elements 3 and 20
  std::memcpy(b.data() + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) b[6 + j] = 0x21;  // low nibble 1, high nibble 2
  std::vector<float> y = dequantize(GgmlType::kQ5_0, b);
  EXPECT_EQ(y[0], 1.0f - 16);
  EXPECT_EQ(y[3], 17.0f - 16);
  EXPECT_EQ(y[16], 2.0f - 16);
  EXPECT_EQ(y[20], 18.0f - 16);
  std::vector<uint8_t> b1(24, 0);
  put_half(b1, 0, 2.0f);
  put_half(b1, 2, 0.5f);
  std::memcpy(b1.data() + 4, &qh, 4);
  y = dequantize(GgmlType::kQ5_1, b1);
  EXPECT_EQ(y[3], 2.0f * 16 + 0.5f);
  EXPECT_EQ(y[4], 0.5f);
}

// Sub-block j's 6-bit scale and min: j < 4 from bytes j and j + 4; j >= 4 from the low and high
// nibbles of byte j + 4 and the top two bits of bytes j - 4 and j.
TEST(GgmlQuant, Q4KScaleAndMinPacking) {
  std::vector<uint8_t> b(144, 0);
  put_half(b, 0, 1.0f);  // d
  put_half(b, 2, 1.0f);  // dmin
  uint8_t* sc = b.data() + 4;
  sc[1] = 5;                 // sub-block 1 scale 5
  sc[5] = 2;                 // sub-block 1 min 2
  sc[9] = 0x3 | (0x1 << 4);  // sub-block 5: scale low 3, min low 1
  sc[1] |= 0x2 << 6;         // sub-block 5 scale high bits 2 -> 3 + 32 = 35
  sc[5] |= 0x1 << 6;         // sub-block 5 min high bits 1 -> 1 + 16 = 17
  uint8_t* q = b.data() + 16;
  for (int l = 0; l < 32; ++l) q[l] = 0x70;       // chunk 0: sub-block 0 low 0, sub-block 1 high 7
  for (int l = 0; l < 32; ++l) q[64 + l] = 0x09;  // chunk 2: sub-block 4 low 9, sub-block 5 high 0
  std::vector<float> y = dequantize(GgmlType::kQ4_K, b);
  EXPECT_EQ(y[0], 0.0f);              // scale 0, min 0
  EXPECT_EQ(y[32], 5.0f * 7 - 2);     // sub-block 1
  EXPECT_EQ(y[128], 0.0f * 9 - 0);    // sub-block 4: scale 0 (byte 8 low nibble), min 0
  EXPECT_EQ(y[160], 35.0f * 0 - 17);  // sub-block 5
}

TEST(GgmlQuant, Q6KLayout) {
  std::vector<uint8_t> b(210, 0);
  put_half(b, 208, 0.5f);
  int8_t* sc = reinterpret_cast<int8_t*>(b.data() + 192);
  for (int i = 0; i < 16; ++i) sc[i] = static_cast<int8_t>(i + 1);
  b[0] = 0x21;          // ql[0]: element 0 low 1, element 64 low 2
  b[128] = 0b11100100;  // qh[0]: elements 0, 32, 64, 96 high bits 0, 1, 2, 3
  b[32] = 0x43;         // ql[32]: element 32 low 3, element 96 low 4
  std::vector<float> y = dequantize(GgmlType::kQ6_K, b);
  EXPECT_EQ(y[0], 0.5f * 1 * (1 - 32));
  EXPECT_EQ(y[32], 0.5f * 3 * ((3 | 1 << 4) - 32));
  EXPECT_EQ(y[64], 0.5f * 5 * ((2 | 2 << 4) - 32));
  EXPECT_EQ(y[96], 0.5f * 7 * ((4 | 3 << 4) - 32));
  EXPECT_EQ(y[16], 0.5f * 2 * (0 - 32));  // second sub-block of 16
}

// One block built from chosen levels, scales and mins by the layouts ggml-common.h documents
// (written here independently of quant.cc), and the values its formula gives. d and dmin are
// powers of two and levels small integers, so every expected value is exact in any order.
struct BuiltBlock {
  std::vector<uint8_t> bytes;
  std::vector<float> want;
};

BuiltBlock build_block(GgmlType type, uint64_t seed) {
  const GgmlBlockLayout layout = layout_of(type);
  BuiltBlock out{std::vector<uint8_t>(layout.block_bytes, 0),
                 std::vector<float>(layout.block_elems)};
  std::vector<uint8_t>& b = out.bytes;
  auto random_below = [&](int n) { return static_cast<int>(next_random(seed) % n); };
  const float d = 0.5f, dmin = 0.125f;
  // The 6-bit scale and min of sub-block s of a Q4_K / Q5_K block, into the 12 bytes at b[4].
  auto pack_k4 = [&](int s, int scale, int min) {
    uint8_t* p = b.data() + 4;
    if (s < 4) {
      p[s] |= static_cast<uint8_t>(scale);
      p[s + 4] |= static_cast<uint8_t>(min);
    } else {
      p[s + 4] |= static_cast<uint8_t>((scale & 15) | ((min & 15) << 4));
      p[s - 4] |= static_cast<uint8_t>((scale >> 4) << 6);
      p[s] |= static_cast<uint8_t>((min >> 4) << 6);
    }
  };
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1: {
      const bool five = type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1;
      const bool with_min = type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1;
      const float m = -3.0f;
      put_half(b, 0, d);
      if (with_min) put_half(b, 2, m);
      const size_t qs = 2 + (with_min ? 2 : 0) + (five ? 4 : 0);
      uint32_t qh = 0;
      for (int e = 0; e < 32; ++e) {
        const int level = random_below(five ? 32 : 16);
        b[qs + e % 16] |= static_cast<uint8_t>((level & 15) << (e < 16 ? 0 : 4));
        qh |= static_cast<uint32_t>(level >> 4) << e;
        const int offset = five ? 16 : 8;
        out.want[e] =
            with_min ? d * static_cast<float>(level) + m : d * static_cast<float>(level - offset);
      }
      if (five) std::memcpy(b.data() + qs - 4, &qh, 4);
      break;
    }
    case GgmlType::kQ8_0:
      put_half(b, 0, d);
      for (int e = 0; e < 32; ++e) {
        const int q = random_below(256) - 128;
        b[2 + e] = static_cast<uint8_t>(q);
        out.want[e] = d * static_cast<float>(q);
      }
      break;
    case GgmlType::kQ2_K: {
      put_half(b, 80, d);
      put_half(b, 82, dmin);
      for (int s = 0; s < 16; ++s) b[s] = static_cast<uint8_t>(random_below(256));
      for (int e = 0; e < 256; ++e) {
        const int level = random_below(4), r = e % 128, s = e / 16;
        b[16 + 32 * (e / 128) + r % 32] |= static_cast<uint8_t>(level << (2 * (r / 32)));
        out.want[e] = d * static_cast<float>(b[s] & 15) * static_cast<float>(level) -
                      dmin * static_cast<float>(b[s] >> 4);
      }
      break;
    }
    case GgmlType::kQ3_K: {
      put_half(b, 108, d);
      int scales[16];
      for (int s = 0; s < 16; ++s) {
        scales[s] = random_below(64);
        b[96 + (s < 8 ? s : s - 8)] |= static_cast<uint8_t>((scales[s] & 15) << (s < 8 ? 0 : 4));
        b[96 + 8 + s % 4] |= static_cast<uint8_t>((scales[s] >> 4) << (2 * (s / 4)));
      }
      for (int e = 0; e < 256; ++e) {
        const int value = random_below(8) - 4;  // low two bits, and the high bit set when >= 0
        const int r = e % 128, plane = r / 32, k = r % 32;
        b[32 + 32 * (e / 128) + k] |= static_cast<uint8_t>((value & 3) << (2 * plane));
        if (value >= 0) b[k] |= static_cast<uint8_t>(1 << (4 * (e / 128) + plane));
        out.want[e] = d * static_cast<float>(scales[e / 16] - 32) * static_cast<float>(value);
      }
      break;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const bool five = type == GgmlType::kQ5_K;
      put_half(b, 0, d);
      put_half(b, 2, dmin);
      int scales[8], mins[8];
      for (int s = 0; s < 8; ++s) {
        scales[s] = random_below(64);
        mins[s] = random_below(64);
        pack_k4(s, scales[s], mins[s]);
      }
      const size_t qs = five ? 48 : 16;
      for (int e = 0; e < 256; ++e) {
        const int level = random_below(five ? 32 : 16), s = e / 32, r = e % 64;
        b[qs + 32 * (e / 64) + r % 32] |= static_cast<uint8_t>((level & 15) << (r < 32 ? 0 : 4));
        if (five) b[16 + r % 32] |= static_cast<uint8_t>((level >> 4) << s);
        out.want[e] = d * static_cast<float>(scales[s]) * static_cast<float>(level) -
                      dmin * static_cast<float>(mins[s]);
      }
      break;
    }
    case GgmlType::kQ6_K: {
      put_half(b, 208, d);
      for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(random_below(256));
      for (int e = 0; e < 256; ++e) {
        const int level = random_below(64), half = e / 128, r = e % 128;
        const int quarter = r / 32, l = r % 32;
        // Quarters 0-3 of 128: low nibble of ql[l], of ql[l + 32], high nibble of ql[l], of
        // ql[l + 32]; the top two bits at bits 2 * quarter of qh[l].
        b[64 * half + l + (quarter % 2) * 32] |=
            static_cast<uint8_t>((level & 15) << (quarter < 2 ? 0 : 4));
        b[128 + 32 * half + l] |= static_cast<uint8_t>((level >> 4) << (2 * quarter));
        out.want[e] = d * static_cast<float>(static_cast<int8_t>(b[192 + e / 16])) *
                      static_cast<float>(level - 32);
      }
      break;
    }
    default:
      ADD_FAILURE() << layout.name;
  }
  return out;
}

TEST(GgmlQuant, EveryTypeDecodesItsDocumentedLayout) {
  for (GgmlType type : kBlockTypes) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      const BuiltBlock block = build_block(type, seed);
      const std::vector<float> y = dequantize(type, block.bytes);
      for (size_t e = 0; e < y.size(); ++e)
        ASSERT_EQ(y[e], block.want[e]) << layout_of(type).name << " seed " << seed << " elem " << e;
    }
  }
}

TEST(GgmlQuant, ZeroScalesGiveZeros) {
  for (GgmlType type : kBlockTypes) {
    std::vector<uint8_t> b = random_blocks(type, 3, 42);
    const size_t block_bytes = layout_of(type).block_bytes;
    for (size_t at = 0; at < b.size(); at += block_bytes)
      for (size_t half : half_offsets(type)) put_half_bits(b, at + half, 0);
    for (float v : dequantize(type, b)) ASSERT_EQ(v, 0.0f) << layout_of(type).name;
  }
}

// The largest f16 scales and mins, of either sign, stay finite and exact.
TEST(GgmlQuant, ExtremeScalesAndMins) {
  std::vector<uint8_t> q41(20, 0);
  put_half(q41, 0, 65504.0f);
  put_half(q41, 2, -65504.0f);
  q41[4] = 0xF0;  // element 0 level 0, element 16 level 15
  std::vector<float> y = dequantize(GgmlType::kQ4_1, q41);
  EXPECT_EQ(y[0], -65504.0f);
  EXPECT_EQ(y[16], 65504.0f * 15 - 65504.0f);

  std::vector<uint8_t> q4k(144, 0);
  put_half(q4k, 0, 65504.0f);
  put_half(q4k, 2, -65504.0f);  // a negative dmin adds the min
  q4k[4] = 63;                  // sub-block 0 scale 63
  q4k[8] = 63;                  // sub-block 0 min 63
  q4k[16] = 0x0F;               // element 0 level 15
  y = dequantize(GgmlType::kQ4_K, q4k);
  EXPECT_EQ(y[0], 65504.0f * 63 * 15 + 65504.0f * 63);
  EXPECT_EQ(y[1], 65504.0f * 63);  // level 0: the min alone

  std::vector<uint8_t> q2k(84, 0);
  put_half(q2k, 80, 65504.0f);
  put_half(q2k, 82, 65504.0f);
  q2k[0] = 0xFF;  // sub-block 0: scale 15, min 15
  q2k[16] = 3;    // element 0 level 3
  y = dequantize(GgmlType::kQ2_K, q2k);
  EXPECT_EQ(y[0], 65504.0f * 15 * 3 - 65504.0f * 15);
  EXPECT_EQ(y[1], -65504.0f * 15);
}

// Infinite and NaN f16 scales propagate as ggml's float arithmetic propagates them.
TEST(GgmlQuant, NonFiniteScalesPassThrough) {
  std::vector<uint8_t> q8(34, 0);
  put_half_bits(q8, 0, 0x7c00);  // +inf
  q8[2] = 1;
  q8[3] = 0xFF;  // -1
  const std::vector<float> y = dequantize(GgmlType::kQ8_0, q8);
  EXPECT_EQ(y[0], INFINITY);
  EXPECT_EQ(y[1], -INFINITY);
  EXPECT_TRUE(std::isnan(y[2]));  // inf * 0
  std::vector<uint8_t> q4k = random_blocks(GgmlType::kQ4_K, 1, 5);
  put_half_bits(q4k, 2, 0x7e00);  // dmin NaN
  for (float v : dequantize(GgmlType::kQ4_K, q4k)) EXPECT_TRUE(std::isnan(v));

  // F16 elements: exact, subnormals included; ggml's conversion (float arithmetic or F16C)
  // quiets a signalling NaN, keeping its payload. BF16 is a plain shift, NaNs untouched.
  const uint16_t halves[] = {0x0001, 0x03ff, 0x8400, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x7c01};
  const uint32_t want[] = {0x33800000, 0x387fc000, 0xb8800000, 0x477fe000,
                           0x7f800000, 0xff800000, 0x7fc00000, 0x7fc02000};
  float out[8];
  dequantize_row(t(GgmlType::kF16), halves, out, 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(bits_of(out[i]), want[i]) << i;
  const uint16_t bf16[] = {0x7f81, 0x0001, 0xc2f7};
  dequantize_row(t(GgmlType::kBF16), bf16, out, 3);
  EXPECT_EQ(bits_of(out[0]), 0x7f810000u);
  EXPECT_EQ(bits_of(out[1]), 0x00010000u);
  EXPECT_EQ(bits_of(out[2]), 0xc2f70000u);
  const float f32[] = {1.5f, -0.0f};
  dequantize_row(t(GgmlType::kF32), f32, out, 2);
  EXPECT_EQ(bits_of(out[0]), bits_of(1.5f));
  EXPECT_EQ(bits_of(out[1]), 0x80000000u);
}

TEST(GgmlQuant, DequantizeMatchesGgmlGolden) {
  struct Golden {
    GgmlType type;
    uint64_t hash;  // hash_floats of 4 blocks random_blocks(type, 4, 1000 + type number)
  };
  // These values came from ggml's reference dequantize_row_* (ggml-quants.c, llama.cpp) run on
  // the same random_blocks.
  const Golden golden[] = {
      {GgmlType::kQ4_0, 0xb458c66dc7eba5cfull}, {GgmlType::kQ4_1, 0x96b8a763fe8bd49full},
      {GgmlType::kQ5_0, 0x4c6871e5d598a9c1ull}, {GgmlType::kQ5_1, 0xeb69ef06d5a8e23bull},
      {GgmlType::kQ8_0, 0xec0fbb9fd1008df9ull}, {GgmlType::kQ2_K, 0xf51ce6ca49681498ull},
      {GgmlType::kQ3_K, 0xb281fd30d405fcebull}, {GgmlType::kQ4_K, 0x84f44e07ff9e03fbull},
      {GgmlType::kQ5_K, 0x8d504d6f0d2b6149ull}, {GgmlType::kQ6_K, 0xdc35928aef3209c1ull}};
  for (const Golden& g : golden) {
    const std::vector<uint8_t> b = random_blocks(g.type, 4, 1000 + t(g.type));
    EXPECT_EQ(hash_floats(dequantize(g.type, b)), g.hash) << layout_of(g.type).name;
  }
}

TEST(GgmlQuant, QuantizeMatchesGgmlGolden) {
  struct Golden {
    GgmlType type;
    uint64_t hash;  // hash_bytes of quantize_row(type, quantize_input())
  };
  // These values came from ggml's reference quantize_row_*_ref (ggml-quants.c, llama.cpp) run on
  // the same quantize_input().
  const Golden golden[] = {
      {GgmlType::kQ8_0, 0x6c3801c31e94b5f5ull}, {GgmlType::kQ4_0, 0x44030ed5c9846044ull},
      {GgmlType::kQ5_0, 0x89f2a15544dfec15ull}, {GgmlType::kQ4_K, 0x0d4892f324a016bbull},
      {GgmlType::kQ5_K, 0x6df14df010ad43d3ull}, {GgmlType::kQ6_K, 0x90b3614febe8a95bull}};
  const std::vector<float> x = quantize_input();
  for (const Golden& g : golden)
    EXPECT_EQ(hash_bytes(quantize(g.type, x)), g.hash) << layout_of(g.type).name;
}

// Every element comes back within a bound set by its group's spread over the type's levels:
// `range` is max|x| (symmetric types) or max(x, 0) - min(x, 0) (Q4_K / Q5_K) of the `group`
// elements sharing a scale, `steps` the levels that range is cut into.
TEST(GgmlQuant, QuantizeRoundTripsWithinTheTypesBound) {
  struct Bound {
    GgmlType type;
    int group;
    float steps;
    float max_error_in_steps;
  };
  const Bound bounds[] = {
      // Half a step, plus f16 rounding of d (2^-11 relative) over up to 127 steps.
      {GgmlType::kQ8_0, 32, 127, 0.5f + 127.0f / 2048 + 1e-3f},
      // Rounding to the nearest step, but the far side's +8 clamps to +7: a whole step.
      {GgmlType::kQ4_0, 32, 8, 1.0f + 8.0f / 2048 + 1e-3f},
      {GgmlType::kQ5_0, 32, 16, 1.0f + 16.0f / 2048 + 1e-3f},  // the same with 32 levels
      // The least-squares fits trade the extremes for the bulk and the 6-bit scales round;
      // ggml's own output stays near one step (measured <= 1.15 on gaussian and uniform data).
      {GgmlType::kQ4_K, 32, 15, 1.5f},
      {GgmlType::kQ5_K, 32, 31, 1.5f},
      {GgmlType::kQ6_K, 16, 32, 1.5f}};
  std::vector<float> x = quantize_input();
  // Group 6's outlier starves its super-block's other 6-bit scales (ggml's design); replace it
  // with an offset, positive-only group to exercise the K-quants' mins.
  for (size_t i = 6 * 256; i < 7 * 256; ++i) x[i] = std::fabs(x[i - 256]) + 100.0f;
  for (const Bound& bound : bounds) {
    const std::vector<float> y = dequantize(bound.type, quantize(bound.type, x));
    const bool with_min = bound.type == GgmlType::kQ4_K || bound.type == GgmlType::kQ5_K;
    for (size_t g = 0; g < x.size(); g += bound.group) {
      float lo = 0, hi = 0, amax = 0;
      for (size_t i = g; i < g + bound.group; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
        amax = std::max(amax, std::fabs(x[i]));
      }
      const float step = (with_min ? hi - lo : amax) / bound.steps;
      for (size_t i = g; i < g + bound.group; ++i)
        ASSERT_LE(std::fabs(x[i] - y[i]), bound.max_error_in_steps * step)
            << layout_of(bound.type).name << " element " << i;
    }
  }
}

TEST(GgmlQuant, AllZeroBlocksQuantizeToZeroScales) {
  const std::vector<float> zeros(512, 0.0f);
  for (GgmlType type : kQuantizable) {
    const GgmlBlockLayout l = layout_of(type);
    const std::vector<uint8_t> q = quantize(type, zeros);
    for (size_t at = 0; at < q.size(); at += l.block_bytes) {
      for (size_t i = at; i < at + l.block_bytes; ++i) {
        // Q4_0's d is max / -8 = -0 (f16 0x8000) and it stores 0 as level 8 (0x88 a byte
        // pair); every other byte of every type is 0.
        uint8_t want = 0;
        if (type == GgmlType::kQ4_0) want = i - at == 1 ? 0x80 : i - at >= 2 ? 0x88 : 0;
        // Q5_0 likewise stores 0 as level 16: low nibbles 0, every fifth bit (qh) set.
        if (type == GgmlType::kQ5_0)
          want = i - at == 1 ? 0x80 : i - at >= 2 && i - at < 6 ? 0xFF : 0;
        EXPECT_EQ(q[i], want) << l.name << " byte " << i - at;
      }
    }
    for (float v : dequantize(type, q)) EXPECT_EQ(v, 0.0f) << l.name;
  }
}

TEST(GgmlQuant, ExtremeElementSetsTheScale) {
  // Q4_0: the largest magnitude, with its sign, is level 0 = -8 * d.
  std::vector<float> one(32, 0.0f);
  one[7] = -4.0f;
  std::vector<uint8_t> q = quantize(GgmlType::kQ4_0, one);
  uint16_t h;
  std::memcpy(&h, q.data(), 2);
  EXPECT_EQ(f16_to_f32(h), 0.5f);
  EXPECT_EQ(q[2 + 7] & 0xF, 0);  // -4 / 0.5 + 8 = 0
  EXPECT_EQ(q[2] & 0xF, 8);      // 0 -> 8
  // Q5_0: the largest magnitude is level 0 = -16 * d; the level past the other end (32)
  // clamps to 31; the fifth bit of element j is bit j of qh (bytes 2..5), its low four bits a
  // nibble of qs (bytes 6..21: element j low, j + 16 high).
  std::vector<float> five(32, 0.0f);
  five[3] = 8.0f;    // d = -0.5
  five[20] = -8.0f;  // 16 + 16.5 -> 32 -> 31: decodes to -7.5
  five[21] = 1.3f;   // -2.6 + 16.5 -> 13: decodes to 1.5
  q = quantize(GgmlType::kQ5_0, five);
  std::memcpy(&h, q.data(), 2);
  EXPECT_EQ(f16_to_f32(h), -0.5f);
  uint32_t qh;
  std::memcpy(&qh, q.data() + 2, 4);
  EXPECT_EQ(q[6 + 3] & 0xF, 0);  // level 0
  EXPECT_EQ((qh >> 3) & 1, 0u);
  EXPECT_EQ(q[6 + 0] & 0xF, 0);  // 0 -> level 16: nibble 0, fifth bit set
  EXPECT_EQ(qh & 1, 1u);
  EXPECT_EQ(q[6 + 4] >> 4, 15);  // element 20 = 16 + 4: level 31
  EXPECT_EQ((qh >> 20) & 1, 1u);
  EXPECT_EQ(q[6 + 5] >> 4, 13);  // element 21: level 13, fifth bit clear
  EXPECT_EQ((qh >> 21) & 1, 0u);
  const std::vector<float> back = dequantize(GgmlType::kQ5_0, q);
  EXPECT_EQ(back[3], 8.0f);
  EXPECT_EQ(back[20], -7.5f);
  EXPECT_EQ(back[21], 1.5f);
  EXPECT_EQ(back[0], 0.0f);
  // Q8_0: max |x| is 127 * d; halves round away from zero (not to even).
  one[7] = 127.0f;
  one[20] = -63.5f;
  one[21] = 2.5f;
  q = quantize(GgmlType::kQ8_0, one);
  std::memcpy(&h, q.data(), 2);
  EXPECT_EQ(f16_to_f32(h), 1.0f);
  EXPECT_EQ(static_cast<int8_t>(q[2 + 7]), 127);
  EXPECT_EQ(static_cast<int8_t>(q[2 + 20]), -64);
  EXPECT_EQ(static_cast<int8_t>(q[2 + 21]), 3);
}

}  // namespace
}  // namespace blend
