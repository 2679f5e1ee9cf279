#include "core/least_squares.h"

#include <cmath>
#include <utility>

#include "core/error.h"

namespace blend {

std::vector<double> least_squares(const std::vector<std::vector<double>>& x,
                                  const std::vector<double>& y, double ridge) {
  const size_t k = x.empty() ? 0 : x[0].size();
  std::vector<std::vector<double>> a(k, std::vector<double>(k + 1, 0.0));
  for (size_t r = 0; r < x.size(); ++r)
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = 0; j < k; ++j) a[i][j] += x[r][i] * x[r][j];
      a[i][k] += x[r][i] * y[r];
    }
  for (size_t i = 0; i < k; ++i) a[i][i] += ridge;
  for (size_t c = 0; c < k; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < k; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[pivot][c])) pivot = r;
    std::swap(a[c], a[pivot]);
    if (std::fabs(a[c][c]) < 1e-300)
      throw Error("least squares: the measurements cannot be fitted");
    for (size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (size_t q = c; q <= k; ++q) a[r][q] -= f * a[c][q];
    }
  }
  std::vector<double> beta(k);
  for (size_t i = 0; i < k; ++i) beta[i] = a[i][k] / a[i][i];
  return beta;
}

std::vector<double> nonnegative_least_squares(const std::vector<std::vector<double>>& x,
                                              const std::vector<double>& y, double ridge) {
  const size_t k = x.empty() ? 0 : x[0].size();
  std::vector<bool> kept(k, false);  // a column of zeros explains nothing: its coefficient is 0
  for (const std::vector<double>& row : x)
    for (size_t c = 0; c < k; ++c) kept[c] = kept[c] || row[c] != 0.0;
  for (;;) {
    std::vector<size_t> cols;
    for (size_t c = 0; c < k; ++c)
      if (kept[c]) cols.push_back(c);
    if (cols.empty()) return std::vector<double>(k, 0.0);
    std::vector<std::vector<double>> sub(x.size());
    for (size_t r = 0; r < x.size(); ++r)
      for (size_t c : cols) sub[r].push_back(x[r][c]);
    const std::vector<double> b = least_squares(sub, y, ridge);
    size_t most_negative = k;
    for (size_t i = 0; i < cols.size(); ++i)
      if (b[i] < 0 && (most_negative == k || b[i] < b[most_negative])) most_negative = i;
    if (most_negative == k) {
      std::vector<double> beta(k, 0.0);
      for (size_t i = 0; i < cols.size(); ++i) beta[cols[i]] = b[i];
      return beta;
    }
    kept[cols[most_negative]] = false;
  }
}

}  // namespace blend
