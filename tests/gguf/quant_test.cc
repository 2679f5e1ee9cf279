#include "gguf/quant.h"

#include <cmath>
#include <cstring>
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

void put_half(std::vector<uint8_t>& b, size_t at, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(b.data() + at, &h, 2);
}

std::vector<float> dequantize(GgmlType type, const std::vector<uint8_t>& block) {
  const GgmlBlockLayout l = *ggml_block_layout(t(type));
  EXPECT_EQ(block.size(), l.block_bytes);
  std::vector<float> y(l.block_elems);
  dequantize_row(t(type), block.data(), y.data(), l.block_elems);
  return y;
}

TEST(GgmlQuant, LayoutsAreGgmls) {
  const std::pair<GgmlType, std::pair<uint32_t, uint32_t>> want[] = {
      {GgmlType::kQ4_0, {32, 18}},   {GgmlType::kQ4_1, {32, 20}},   {GgmlType::kQ5_0, {32, 22}},
      {GgmlType::kQ5_1, {32, 24}},   {GgmlType::kQ8_0, {32, 34}},   {GgmlType::kQ2_K, {256, 84}},
      {GgmlType::kQ3_K, {256, 110}}, {GgmlType::kQ4_K, {256, 144}}, {GgmlType::kQ5_K, {256, 176}},
      {GgmlType::kQ6_K, {256, 210}}, {GgmlType::kF32, {1, 4}},      {GgmlType::kBF16, {1, 2}}};
  for (const auto& [type, size] : want) {
    const auto l = ggml_block_layout(t(type));
    ASSERT_TRUE(l.has_value());
    EXPECT_EQ(l->block_elems, size.first) << l->name;
    EXPECT_EQ(l->block_bytes, size.second) << l->name;
  }
  EXPECT_FALSE(ggml_block_layout(16).has_value());
  EXPECT_STREQ(ggml_type_display_name(16), "IQ2_XXS");
  EXPECT_STREQ(ggml_type_display_name(12), "Q4_K");
  float y[32];
  std::vector<uint8_t> b(34, 0);
  EXPECT_THROW(dequantize_row(16, b.data(), y, 256), Error);
  EXPECT_THROW(dequantize_row(t(GgmlType::kQ8_0), b.data(), y, 31), Error);
  EXPECT_THROW(quantize_row(t(GgmlType::kQ4_K), y, b.data(), 256), Error);
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

TEST(GgmlQuant, ZeroScalesGiveZerosAndNonFiniteScalesPassThrough) {
  std::vector<uint8_t> b(34, 0x7f);
  put_half(b, 0, 0.0f);
  for (float v : dequantize(GgmlType::kQ8_0, b)) EXPECT_EQ(v, 0.0f);
  put_half(b, 0, INFINITY);
  for (float v : dequantize(GgmlType::kQ8_0, b)) EXPECT_TRUE(std::isinf(v));
}

TEST(GgmlQuant, Q8AndQ4RoundTripsWithinHalfAStep) {
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(static_cast<float>(i) * 0.37f) * (i < 32 ? 100.0f : 0.01f);
  for (int z = 64; z < 96; ++z) x[z] = 0;  // an all-zero block
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const GgmlBlockLayout l = *ggml_block_layout(t(type));
    std::vector<uint8_t> q(x.size() / 32 * l.block_bytes);
    quantize_row(t(type), x.data(), q.data(), static_cast<int64_t>(x.size()));
    std::vector<float> y(x.size());
    dequantize_row(t(type), q.data(), y.data(), static_cast<int64_t>(x.size()));
    for (size_t blk = 0; blk < x.size() / 32; ++blk) {
      uint16_t h;
      std::memcpy(&h, q.data() + blk * l.block_bytes, 2);
      const float d = std::fabs(f16_to_f32(h));
      if (blk == 2) {
        EXPECT_EQ(d, 0.0f);
      }
      for (size_t j = blk * 32; j < blk * 32 + 32; ++j)
        // Half a step, plus the f16 rounding of d over 127 steps (Q8_0); Q4_0 clamps the far
        // side's +8 to 7, a whole step.
        EXPECT_LE(std::fabs(x[j] - y[j]), d * (type == GgmlType::kQ8_0 ? 0.57f : 1.07f) + 1e-7f)
            << l.name << " " << j;
    }
  }
  // Q4_0: the largest magnitude (with its sign) is the step -8.
  std::vector<float> one(32, 0.0f);
  one[7] = -4.0f;
  std::vector<uint8_t> q(18);
  quantize_row(t(GgmlType::kQ4_0), one.data(), q.data(), 32);
  uint16_t h;
  std::memcpy(&h, q.data(), 2);
  EXPECT_EQ(f16_to_f32(h), 0.5f);
  EXPECT_EQ(q[2 + 7] & 0xF, 0);  // -4 / 0.5 + 8 = 0
  EXPECT_EQ(q[2] & 0xF, 8);      // 0 -> 8
}

}  // namespace
}  // namespace blend
