#include "core/least_squares.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace blend {
namespace {

// A step fit's columns span FLOPs (~1e13) to the intercept's 1 (harness/profile's roofline
// form has five of them): the exact coefficients come back.
TEST(LeastSquares, RecoversCoefficientsOfColumnsOfVeryDifferentScales) {
  const std::vector<double> truth = {1.25e-15, 4e-14, 4e-13, 1.5e-5, 3e-3};
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (int i = 1; i <= 12; ++i) {
    const std::vector<double> row = {1e13 * i * i, 1e12 * (i % 4), 1.6e10 + 3e9 * (i % 5),
                                     40.0 * (i % 7), 1.0};
    double t = 0;
    for (size_t c = 0; c < row.size(); ++c) t += truth[c] * row[c];
    x.push_back(row);
    y.push_back(t);
  }
  const std::vector<double> beta = least_squares(x, y);
  for (size_t i = 0; i < truth.size(); ++i) EXPECT_NEAR(beta[i] / truth[i], 1.0, 1e-9) << i;
}

TEST(LeastSquares, NonnegativeDropsNegativeAndZeroColumns) {
  // y = 2 a + 0.5; column b would take a negative coefficient, column c is all zeros.
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (int i = 0; i < 8; ++i) {
    x.push_back({static_cast<double>(i), static_cast<double>(i % 3) - 1.0, 0.0, 1.0});
    y.push_back(2.0 * i + 0.5 - 0.01 * ((i % 3) - 1.0));
  }
  const std::vector<double> beta = nonnegative_least_squares(x, y);
  EXPECT_EQ(beta[1], 0.0);
  EXPECT_EQ(beta[2], 0.0);
  EXPECT_NEAR(beta[0], 2.0, 1e-2);
  EXPECT_NEAR(beta[3], 0.5, 2e-2);
  EXPECT_THROW(least_squares(x, y), Error);  // the zero column alone is singular
}

}  // namespace
}  // namespace blend
