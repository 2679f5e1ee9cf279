// Gemma's element-wise operations on hand-computed values (backend/cpu/ops.h).
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/ops.h"

namespace blend::cpu {
namespace {

// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), worked out in double by hand: torch's
// gelu(approximate="tanh") gives the same to f32 precision (0.8411920 at 1).
TEST(GemmaOps, GeluTanhOnHandComputedValues) {
  EXPECT_NEAR(gelu_tanh(1.0f), 0.84119199, 1e-6);
  EXPECT_NEAR(gelu_tanh(-2.0f), -0.04540231, 1e-6);
  EXPECT_NEAR(gelu_tanh(0.5f), 0.34571401, 1e-6);
  EXPECT_NEAR(gelu_tanh(3.0f), 2.99636261, 1e-6);
  EXPECT_EQ(gelu_tanh(0.0f), 0.0f);
  // Not the exact (erf) GELU, whose value at 1 is 0.8413447.
  EXPECT_GT(std::abs(gelu_tanh(1.0f) - 0.8413447f), 1e-4);
}

TEST(GemmaOps, GegluMultipliesTheGatesGeluByUp) {
  // One row of f = 2: gate [1, -2], up [2, 10].
  const std::vector<float> gate_up = {1.0f, -2.0f, 2.0f, 10.0f};
  std::vector<float> out(2);
  geglu_tanh(gate_up.data(), 1, 2, DType::kF32, out.data(), 1);
  EXPECT_NEAR(out[0], 2 * 0.84119199, 2e-6);
  EXPECT_NEAR(out[1], 10 * -0.04540231, 2e-6);
}

// cap * tanh(x / cap): 5 tanh(2) = 4.8201379, 5 tanh(-0.2) = -0.9868766; small values pass
// almost unchanged, large ones stay under the cap.
TEST(GemmaOps, SoftCapOnHandComputedValues) {
  std::vector<float> x = {10.0f, -1.0f, 1e-3f, 1e6f};
  std::vector<float> rows = x;
  for (float& v : x) v = softcap(v, 5.0f);
  EXPECT_NEAR(x[0], 4.8201379, 1e-6);
  EXPECT_NEAR(x[1], -0.9868766, 1e-6);
  EXPECT_NEAR(x[2], 1e-3, 1e-9);
  EXPECT_EQ(x[3], 5.0f);
  // The final logits' vectorised path: the same values (two rows of two).
  softcap_rows(rows.data(), 2, 2, 5.0f, 1);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(rows[i], x[i], 2e-6 * std::abs(x[i])) << i;
}

// tanh_approx against std::tanh over both of its branches, to 2e-6 relative.
TEST(GemmaOps, TanhApproxIsCloseToTanhEverywhere) {
  for (float y = -12.0f; y <= 12.0f; y += 0.00731f) {
    const double want = std::tanh(static_cast<double>(y));
    EXPECT_NEAR(tanh_approx(y), want, 2e-6 * std::abs(want) + 1e-30) << y;
  }
  for (float y : {1e-30f, -1e-8f, 0.0624f, 0.0625f, 0.0626f, 40.0f, -100.0f})
    EXPECT_NEAR(tanh_approx(y), std::tanh(static_cast<double>(y)),
                2e-6 * std::abs(std::tanh(static_cast<double>(y))))
        << y;
  EXPECT_EQ(tanh_approx(0.0f), 0.0f);
}

}  // namespace
}  // namespace blend::cpu
