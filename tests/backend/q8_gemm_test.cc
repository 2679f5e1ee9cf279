// The Q8_0 linear layer (backend/cpu/q8_gemm.h): every kernel against a float64 reference of
// the same quantized arithmetic, the kernels bit for bit against each other, rows independent
// of their batch, and the layout (block scale, value order, row stacking) pinned by cases that
// fail when any of them is wrong.
#include "backend/cpu/q8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"
#include "model/safetensors.h"

namespace blend::cpu {
namespace {

// A Q8_0 tensor [n, k] of random values and scales, as its bytes and a view.
struct Q8Tensor {
  std::vector<std::byte> bytes;
  TensorView view;
  Q8Tensor(int64_t n, int64_t k, std::mt19937& rng, const std::string& name = "w") {
    const int64_t blocks = k / kQ8_0BlockElems;
    bytes.resize(static_cast<size_t>(n * blocks * kQ8_0BlockBytes));
    std::uniform_int_distribution<int> value(-128, 127);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    for (int64_t b = 0; b < n * blocks; ++b) {
      std::byte* block = bytes.data() + b * kQ8_0BlockBytes;
      const uint16_t h = f32_to_f16(scale(rng));
      std::memcpy(block, &h, 2);
      for (int e = 0; e < 32; ++e) block[2 + e] = static_cast<std::byte>(value(rng));
    }
    view.name = name;
    view.dtype = DType::kQ8_0;
    view.shape = {n, k};
    view.data = bytes.data();
    view.nbytes = bytes.size();
  }
  float at(int64_t row, int64_t col) const { return view.at(row * view.shape[1] + col); }
};

std::vector<float> random_rows(int64_t m, int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = dist(rng);
  return x;
}

// y = quantize(x) . W^T in float64: the quantity every kernel computes up to f32 rounding.
std::vector<double> reference(const std::vector<float>& x, int64_t m, const Q8Tensor& w) {
  const int64_t n = w.view.shape[0], k = w.view.shape[1];
  std::vector<double> y(static_cast<size_t>(m * n));
  std::vector<int8_t> q(static_cast<size_t>(k));
  std::vector<float> d(static_cast<size_t>(k / 32));
  for (int64_t i = 0; i < m; ++i) {
    quantize_row_q8(x.data() + i * k, k, q.data(), d.data());
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += static_cast<double>(q[c]) * d[c / 32] * w.at(j, c);
      y[static_cast<size_t>(i * n + j)] = s;
    }
  }
  return y;
}

std::vector<float> run(const Q8Matrix& w, const std::vector<float>& x, int64_t m) {
  std::vector<float> y(static_cast<size_t>(m * w.n()), 0.0f);
  w.forward(x.data(), DType::kF32, m, nullptr, y.data(), false);
  return y;
}

class Q8Kernels : public ::testing::Test {
 protected:
  void TearDown() override { cap_q8_kernel(Q8Kernel::kAvx512Vnni); }
};

TEST(Q8Quantize, RowMatchesGgmlOnHandComputedBlock) {
  // max |x| = 2.54: d = 0.02 (as f16), q = round(x * 127 / 2.54) = round(50 x), ties to even.
  std::vector<float> x(32, 0.0f);
  x[0] = 2.54f;
  x[1] = -1.27f;
  x[2] = 0.01f;   // 0.5: to even, 0
  x[3] = 0.03f;   // 1.5: to even, 2
  x[4] = -0.05f;  // -2.5: to even, -2
  std::vector<int8_t> q(32);
  float d = 0;
  quantize_row_q8(x.data(), 32, q.data(), &d);
  EXPECT_EQ(d, f16_to_f32(f32_to_f16(2.54f / 127.0f)));
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);  // -63.5 rounds to the even -64
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], 2);
  EXPECT_EQ(q[4], -2);
  EXPECT_EQ(q[5], 0);
}

TEST(Q8Quantize, ZeroAndNonFiniteBlocksGiveFiniteValues) {
  std::vector<float> x(64, 0.0f);
  x[40] = std::numeric_limits<float>::infinity();
  x[41] = std::numeric_limits<float>::quiet_NaN();
  x[42] = 1.0f;
  std::vector<int8_t> q(64, 99);
  float d[2] = {-1, -1};
  quantize_row_q8(x.data(), 64, q.data(), d);
  EXPECT_EQ(d[0], 0.0f);  // an all-zero block: scale 0, values 0
  for (int e = 0; e < 32; ++e) EXPECT_EQ(q[e], 0);
  // max |x| = inf: the scale is inf and 127 / inf = 0 makes every value 0 (the inf and the NaN
  // included, where the cast would be undefined).
  EXPECT_EQ(d[1], std::numeric_limits<float>::infinity());
  for (int e = 32; e < 64; ++e) EXPECT_EQ(q[e], 0) << e;
}

TEST_F(Q8Kernels, EveryKernelMatchesTheReferenceAndTheOthersBitForBit) {
  std::mt19937 rng(7);
  // n not a multiple of 16 (a padded group), k of 3 blocks, m across the 4-row chunks.
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1, 96}, {16, 96}, {37, 96}, {70, 576}}) {
    const Q8Tensor w(n, k, rng);
    const Q8Matrix matrix({&w.view});
    for (const int64_t m : {1, 3, 4, 5, 9, 45}) {
      const std::vector<float> x = random_rows(m, k, rng);
      const std::vector<double> want = reference(x, m, w);
      cap_q8_kernel(Q8Kernel::kPortable);
      const std::vector<float> portable = run(matrix, x, m);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(portable[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << n << " " << m;
      for (const Q8Kernel kernel : {Q8Kernel::kAvx2, Q8Kernel::kAvxVnni, Q8Kernel::kAvx512Vnni}) {
        cap_q8_kernel(kernel);
        if (best_q8_kernel() != kernel) continue;  // this CPU lacks it
        const std::vector<float> y = run(matrix, x, m);
        ASSERT_EQ(0, std::memcmp(y.data(), portable.data(), y.size() * 4))
            << q8_kernel_name(kernel) << " n=" << n << " m=" << m;
      }
    }
  }
}

// A cap never selects a kernel this CPU lacks: the kernels are not nested (Zen 4 has AVX-512
// VNNI but not AVX-VNNI, and capping at AVX-VNNI there ran it: SIGILL).
TEST_F(Q8Kernels, ACapSelectsAKernelThisCpuRunsAtOrBelowIt) {
  for (const Q8Kernel cap :
       {Q8Kernel::kAvx512Vnni, Q8Kernel::kAvxVnni, Q8Kernel::kAvx2, Q8Kernel::kPortable}) {
    cap_q8_kernel(cap);
    const Q8Kernel k = best_q8_kernel();
    EXPECT_TRUE(q8_kernel_runs_here(k)) << q8_kernel_name(cap) << " -> " << q8_kernel_name(k);
    EXPECT_GE(static_cast<int>(k), static_cast<int>(cap)) << q8_kernel_name(cap);
  }
  EXPECT_TRUE(q8_kernel_runs_here(Q8Kernel::kPortable));
}

TEST_F(Q8Kernels, ARowsOutputDoesNotDependOnItsBatch) {
  std::mt19937 rng(11);
  const Q8Tensor w(40, 64, rng);
  const Q8Matrix matrix({&w.view});
  const std::vector<float> x = random_rows(7, 64, rng);
  const std::vector<float> all = run(matrix, x, 7);
  for (int64_t i = 0; i < 7; ++i) {
    const std::vector<float> one(x.begin() + i * 64, x.begin() + (i + 1) * 64);
    const std::vector<float> y = run(matrix, one, 1);
    EXPECT_EQ(0, std::memcmp(y.data(), all.data() + i * 40, 40 * 4)) << i;
  }
}

TEST_F(Q8Kernels, ScaleValueOrderAndStackingArePinned) {
  // One block whose value e is e - 16, scale 0.5 as f16: against x = one-hot at column c the
  // output is 0.5 * (c - 16) * d_x * 127 where x quantizes to 127 at c.
  std::vector<std::byte> bytes(2 * kQ8_0BlockBytes);
  for (int row = 0; row < 2; ++row) {
    std::byte* block = bytes.data() + row * kQ8_0BlockBytes;
    const uint16_t h = f32_to_f16(row == 0 ? 0.5f : 2.0f);
    std::memcpy(block, &h, 2);
    for (int e = 0; e < 32; ++e) block[2 + e] = static_cast<std::byte>(int8_t(e - 16));
  }
  TensorView first{"a", DType::kQ8_0, {1, 32}, bytes.data(), kQ8_0BlockBytes, nullptr};
  TensorView second{"b",    DType::kQ8_0, {1, 32}, bytes.data() + kQ8_0BlockBytes, kQ8_0BlockBytes,
                    nullptr};
  const Q8Matrix matrix({&first, &second});  // stacked: row 0 from a, row 1 from b
  ASSERT_EQ(matrix.n(), 2);
  for (const int c : {0, 5, 16, 31}) {
    std::vector<float> x(32, 0.0f);
    x[static_cast<size_t>(c)] = 1.27f;  // d_x = 0.01 (as f16), q = 127
    const std::vector<float> y = run(matrix, x, 1);
    const float dx = f16_to_f32(f32_to_f16(0.01f));
    EXPECT_FLOAT_EQ(y[0], 127.0f * (c - 16) * dx * 0.5f) << c;
    EXPECT_FLOAT_EQ(y[1], 127.0f * (c - 16) * dx * 2.0f) << c;
  }
}

TEST(Q8Linear, RunsThroughLinearWithBiasAndAccumulation) {
  std::mt19937 rng(3);
  const Q8Tensor w(20, 64, rng);
  std::vector<float> bias_values(20);
  for (size_t j = 0; j < bias_values.size(); ++j) bias_values[j] = 0.25f * static_cast<float>(j);
  TensorView bias{"b", DType::kF32, {20}, reinterpret_cast<const std::byte*>(bias_values.data()),
                  80,  nullptr};
  GemmContext ctx({.compute = DType::kF32});
  Linear linear(ctx, {&w.view}, {&bias});
  EXPECT_EQ(linear.impl().rfind("q8_0 ", 0), 0u) << linear.impl();
  const std::vector<float> x = random_rows(3, 64, rng);
  const std::vector<double> want = reference(x, 3, w);
  std::vector<float> y(static_cast<size_t>(ctx.padded_rows(3) * 20), 1.0f);
  linear.forward(x.data(), 3, y.data(), /*accumulate=*/true);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 20; ++j)
      EXPECT_NEAR(y[i * 20 + j], 1.0 + want[i * 20 + j] + 0.25 * j, 1e-4);
}

TEST(Q8Linear, AFusedLayerMixingTypesRunsDequantized) {
  // A Q8_0 part beside an f32 one (a Q4_K_M file's fallback types): the layer is the f32 one of
  // the dequantized values, not the int8 kernels.
  std::mt19937 rng(5);
  const Q8Tensor w(4, 32, rng);
  std::vector<float> f(4 * 32);
  for (size_t i = 0; i < f.size(); ++i) f[i] = 0.01f * static_cast<float>(i % 7);
  TensorView plain{"plain",      DType::kF32, {4, 32}, reinterpret_cast<const std::byte*>(f.data()),
                   f.size() * 4, nullptr};
  GemmContext ctx({.compute = DType::kF32});
  Linear linear(ctx, {&w.view, &plain});
  EXPECT_EQ(linear.impl().find("q8_0"), std::string::npos) << linear.impl();
  const std::vector<float> x = random_rows(1, 32, rng);
  std::vector<float> y(static_cast<size_t>(ctx.padded_rows(1) * 8));
  std::vector<float> xs(static_cast<size_t>(ctx.padded_rows(1) * 32), 0.0f);
  std::copy(x.begin(), x.end(), xs.begin());
  linear.forward(xs.data(), 1, y.data());
  for (int64_t j = 0; j < 8; ++j) {
    double want = 0;
    for (int64_t c = 0; c < 32; ++c)
      want += static_cast<double>(x[c]) * (j < 4 ? w.at(j, c) : f[(j - 4) * 32 + c]);
    EXPECT_NEAR(y[j], want, 1e-4) << j;
  }
}

}  // namespace
}  // namespace blend::cpu
