// The Q4_K / Q6_K / Q5_0 linear layer (backend/cpu/kquant_gemm.h): every kernel against a
// float64 reference (the weights as ggml dequantizes them, times x as q8_gemm quantizes it),
// the kernels bit for bit against each other, rows independent of their batch, and a fused
// layer of mixed types (a Q4_K_M file's Q/K/V with a Q6_K V, its Q5_0 / Q8_0 fallbacks).
#include "backend/cpu/kquant_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/q8_gemm.h"
#include "core/error.h"
#include "core/quant.h"
#include "model/safetensors.h"

namespace blend::cpu {
namespace {

// A block-type tensor [n, k] quantized by ggml's reference quantizer from random weights (each
// row its own spread, some rows with an offset, so the K-quants' mins and scales vary).
struct QuantTensor {
  std::vector<std::byte> bytes;
  TensorView view;
  QuantTensor(DType t, int64_t n, int64_t k, std::mt19937& rng, const std::string& name = "w") {
    const int64_t rb = row_bytes(t, k);
    bytes.resize(static_cast<size_t>(n * rb));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n; ++r) {
      const float spread = 0.01f * static_cast<float>(1 + r % 5), shift = r % 3 ? 0.0f : 0.02f;
      for (float& v : row) v = shift + spread * dist(rng);
      quantize_row(static_cast<uint32_t>(ggml_type_of(t)), row.data(), bytes.data() + r * rb, k);
    }
    view.name = name;
    view.dtype = t;
    view.shape = {n, k};
    view.data = bytes.data();
    view.nbytes = bytes.size();
  }
};

std::vector<float> random_rows(int64_t m, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = dist(rng);
  return x;
}

// y = quantize(x) . dequantize(W)^T in float64, rows of W stacked from `parts`.
std::vector<double> reference(const std::vector<float>& x, int64_t m,
                              const std::vector<const TensorView*>& parts) {
  const int64_t k = parts[0]->shape[1];
  std::vector<std::vector<float>> w;
  for (const TensorView* p : parts)
    for (int64_t r = 0; r < p->shape[0]; ++r) {
      std::vector<float>& row = w.emplace_back(static_cast<size_t>(k));
      dequantize_block_row(p->dtype, p->data + r * row_bytes(p->dtype, k), k, row.data());
    }
  const int64_t n = static_cast<int64_t>(w.size());
  std::vector<double> y(static_cast<size_t>(m * n));
  std::vector<int8_t> q(static_cast<size_t>(k));
  std::vector<float> d(static_cast<size_t>(k / 32));
  for (int64_t i = 0; i < m; ++i) {
    quantize_row_q8(x.data() + i * k, k, q.data(), d.data());
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c)
        s += static_cast<double>(q[c]) * d[c / 32] * w[static_cast<size_t>(j)][c];
      y[static_cast<size_t>(i * n + j)] = s;
    }
  }
  return y;
}

std::vector<float> run(const KQuantMatrix& w, const std::vector<float>& x, int64_t m) {
  std::vector<float> y(static_cast<size_t>(m * w.n()), 0.0f);
  w.forward(x.data(), DType::kF32, m, nullptr, y.data(), false);
  return y;
}

class KQuantKernels : public ::testing::Test {
 protected:
  void TearDown() override { cap_q8_kernel(Q8Kernel::kAvx512Vnni); }
};

// Each type alone and a fused mix, n not a multiple of 16 in the last part (a padded group), m
// across the 4-row chunks.
TEST_F(KQuantKernels, EveryKernelMatchesTheReferenceAndTheOthersBitForBit) {
  std::mt19937 rng(3);
  const int64_t k = 512;
  const QuantTensor q4(DType::kQ4_K, 37, k, rng), q6(DType::kQ6_K, 21, k, rng);
  const QuantTensor q5(DType::kQ5_0, 19, k, rng), q8(DType::kQ8_0, 16, k, rng);
  const QuantTensor q4a(DType::kQ4_K, 32, k, rng), q6b(DType::kQ6_K, 16, k, rng);
  const std::vector<std::vector<const TensorView*>> layers = {
      {&q4.view}, {&q6.view}, {&q5.view}, {&q4a.view, &q6b.view, &q8.view, &q5.view}};
  for (const auto& parts : layers) {
    ASSERT_TRUE(KQuantMatrix::takes(parts));
    const KQuantMatrix matrix(parts);
    for (const int64_t m : {1, 3, 4, 6, 13}) {
      const std::vector<float> x = random_rows(m, k, rng);
      const std::vector<double> want = reference(x, m, parts);
      cap_q8_kernel(Q8Kernel::kPortable);
      const std::vector<float> portable = run(matrix, x, m);
      ASSERT_EQ(portable.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(portable[i], want[i], 2e-5 * (1 + std::fabs(want[i])))
            << dtype_name(parts[0]->dtype) << " m=" << m << " i=" << i;
      for (const Q8Kernel kernel : {Q8Kernel::kAvx2, Q8Kernel::kAvx512Vnni}) {
        cap_q8_kernel(kernel);
        if (best_q8_kernel() != kernel) continue;  // this CPU lacks it
        const std::vector<float> y = run(matrix, x, m);
        ASSERT_EQ(0, std::memcmp(y.data(), portable.data(), y.size() * 4))
            << q8_kernel_name(kernel) << " " << dtype_name(parts[0]->dtype) << " m=" << m;
      }
    }
  }
}

// Every level at its largest and every x value at +-127: the AVX2 kernels add several u8 x s8
// pair sums in int16 before widening, which holds only within the bounds each type's levels
// give (Q4_K 15, Q5_0 31, Q6_K 63); a sum past 32767 would wrap and miss the reference by far.
struct ExtremeTensor {
  std::vector<std::byte> bytes;
  TensorView view;
  ExtremeTensor(DType t, int64_t n, int64_t k) {
    const int64_t rb = row_bytes(t, k), block = block_bytes(t);
    bytes.assign(static_cast<size_t>(n * rb), std::byte{0xFF});
    const uint16_t one = f32_to_f16(1.0f), zero = 0;
    for (int64_t b = 0; b < n * rb / block; ++b) {
      std::byte* p = bytes.data() + b * block;
      if (t == DType::kQ4_K) {  // d 1, dmin 0, every 6-bit scale 63 and min 0
        std::memcpy(p, &one, 2);
        std::memcpy(p + 2, &zero, 2);
        for (int j = 0; j < 4; ++j) p[8 + j] = std::byte{0};
        for (int j = 0; j < 4; ++j) p[12 + j] = std::byte{0x0F};
      } else if (t == DType::kQ5_0) {
        std::memcpy(p, &one, 2);
      } else {  // Q6_K: every scale 127, d 1
        for (int j = 0; j < 16; ++j) p[192 + j] = std::byte{127};
        std::memcpy(p + 208, &one, 2);
      }
    }
    view.name = std::string(dtype_name(t));
    view.dtype = t;
    view.shape = {n, k};
    view.data = bytes.data();
    view.nbytes = bytes.size();
  }
};

TEST_F(KQuantKernels, LargestLevelsAndValuesStayExactOnEveryKernel) {
  const int64_t k = 256;
  const ExtremeTensor q4(DType::kQ4_K, 16, k), q5(DType::kQ5_0, 16, k), q6(DType::kQ6_K, 16, k);
  std::vector<float> row(static_cast<size_t>(k));
  dequantize_block_row(DType::kQ4_K, q4.view.data, k, row.data());
  ASSERT_EQ(row[0], 63.0f * 15.0f);  // the block is what it claims: levels 15, scale 63
  const std::vector<const TensorView*> parts = {&q4.view, &q5.view, &q6.view};
  const KQuantMatrix matrix(parts);
  std::vector<float> x(static_cast<size_t>(2 * k), 1.0f);
  std::fill(x.begin() + k, x.end(), -1.0f);
  const std::vector<double> want = reference(x, 2, parts);
  cap_q8_kernel(Q8Kernel::kPortable);
  const std::vector<float> portable = run(matrix, x, 2);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(portable[i], want[i], 1e-5 * std::fabs(want[i])) << i;
  for (const Q8Kernel kernel : {Q8Kernel::kAvx2, Q8Kernel::kAvx512Vnni}) {
    cap_q8_kernel(kernel);
    if (best_q8_kernel() != kernel) continue;
    const std::vector<float> y = run(matrix, x, 2);
    ASSERT_EQ(0, std::memcmp(y.data(), portable.data(), y.size() * 4)) << q8_kernel_name(kernel);
  }
}

TEST_F(KQuantKernels, ARowsOutputDoesNotDependOnItsBatch) {
  std::mt19937 rng(11);
  const QuantTensor w(DType::kQ4_K, 48, 256, rng), v(DType::kQ6_K, 24, 256, rng);
  const KQuantMatrix matrix({&w.view, &v.view});
  const std::vector<float> x = random_rows(7, 256, rng);
  const std::vector<float> all = run(matrix, x, 7);
  for (int64_t i = 0; i < 7; ++i) {
    const std::vector<float> one(x.begin() + i * 256, x.begin() + (i + 1) * 256);
    const std::vector<float> alone = run(matrix, one, 1);
    ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + i * 72, 72 * 4)) << i;
  }
}

// What the matrix takes: a Q4_K_M file's types, groups of one type, not Q8_0 alone (q8_gemm's).
TEST(KQuantMatrix, TakesAQ4KMFilesTypesInWholeGroupsOnly) {
  std::mt19937 rng(2);
  const QuantTensor q4(DType::kQ4_K, 20, 256, rng), q6(DType::kQ6_K, 16, 256, rng);
  const QuantTensor q8(DType::kQ8_0, 16, 256, rng);
  std::vector<float> f(16 * 256, 0.5f);
  const TensorView plain{"plain",      DType::kF32,
                         {16, 256},    reinterpret_cast<const std::byte*>(f.data()),
                         f.size() * 4, nullptr};
  EXPECT_TRUE(KQuantMatrix::takes({&q6.view, &q4.view}));
  EXPECT_FALSE(KQuantMatrix::takes({&q4.view, &q6.view}));  // 20 rows: a group of two types
  EXPECT_FALSE(KQuantMatrix::takes({&q8.view}));
  EXPECT_FALSE(KQuantMatrix::takes({&q6.view, &plain}));
  EXPECT_THROW(KQuantMatrix({&q4.view, &q6.view}), blend::Error);
}

// Through Linear: bias and accumulation, and a layer it does not take (a group of two types)
// runs dequantized with the same values.
TEST(KQuantLinear, RunsThroughLinearAndFallsBackOnMixedGroups) {
  std::mt19937 rng(5);
  const QuantTensor q4(DType::kQ4_K, 20, 256, rng), q6(DType::kQ6_K, 16, 256, rng);
  GemmContext ctx({.compute = DType::kF32});
  Linear fast(ctx, {&q6.view, &q4.view});
  EXPECT_NE(fast.impl().find("k-quant"), std::string::npos) << fast.impl();
  Linear dequantized(ctx, {&q4.view, &q6.view});
  EXPECT_EQ(dequantized.impl().find("k-quant"), std::string::npos) << dequantized.impl();
  const std::vector<float> x = random_rows(3, 256, rng);
  std::vector<float> xs(static_cast<size_t>(ctx.padded_rows(3) * 256), 0.0f);
  std::copy(x.begin(), x.end(), xs.begin());
  std::vector<float> y(static_cast<size_t>(ctx.padded_rows(3) * 36), 1.0f);
  fast.forward(xs.data(), 3, y.data(), /*accumulate=*/true);
  const std::vector<double> want = reference(x, 3, {&q6.view, &q4.view});
  std::vector<float> z(static_cast<size_t>(ctx.padded_rows(3) * 36));
  dequantized.forward(xs.data(), 3, z.data());
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 36; ++j) {
      EXPECT_NEAR(y[i * 36 + j], 1.0 + want[i * 36 + j], 2e-3) << i << " " << j;
      // The dequantized layer's rows are q4 then q6: row j of `fast` is row (j + 20) % 36 there.
      EXPECT_NEAR(z[i * 36 + (j + 20) % 36], want[i * 36 + j], 0.05) << i << " " << j;
    }
}

}  // namespace
}  // namespace blend::cpu
