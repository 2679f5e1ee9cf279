#include "sched/iteration_fit.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/least_squares.h"

namespace blend {

void IterationFit::add(const IterationSample& s) {
  if (s.prefill_tokens + s.decode_tokens > 0) {
    steps_.push_back(s);
    if (steps_.size() > window_) steps_.pop_front();
  }
  if (s.swap_pages > 0) {
    swaps_.push_back(s);
    if (swaps_.size() > window_) swaps_.pop_front();
  }
}

namespace {

// Nonnegative least squares on columns scaled to a largest magnitude of 1, with a ridge small
// against the data: the tokens and context columns differ by orders of magnitude, and the two
// phase bases are collinear when every step carries both phases.
std::vector<double> scaled_fit(std::vector<std::vector<double>> x, const std::vector<double>& y) {
  const size_t k = x.empty() ? 0 : x[0].size();
  std::vector<double> scale(k, 0.0);
  for (const auto& row : x)
    for (size_t c = 0; c < k; ++c) scale[c] = std::max(scale[c], std::fabs(row[c]));
  for (double& s : scale)
    if (s == 0) s = 1;
  for (auto& row : x)
    for (size_t c = 0; c < k; ++c) row[c] /= scale[c];
  std::vector<double> beta =
      nonnegative_least_squares(x, y, 1e-9 * static_cast<double>(std::max<size_t>(1, x.size())));
  for (size_t c = 0; c < k; ++c) beta[c] /= scale[c];
  return beta;
}

}  // namespace

IterationCostModel IterationFit::fit() const {
  IterationCostModel m;
  if (!ready()) return m;
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (const IterationSample& s : steps_) {
    x.push_back({s.prefill_tokens > 0 ? 1.0 : 0.0, static_cast<double>(s.prefill_tokens),
                 s.decode_tokens > 0 ? 1.0 : 0.0, static_cast<double>(s.decode_tokens),
                 static_cast<double>(s.decode_context)});
    y.push_back(s.seconds);
  }
  const std::vector<double> b = scaled_fit(std::move(x), y);
  m.prefill_base = b[0];
  m.prefill_per_token = b[1];
  m.decode_base = b[2];
  m.decode_per_token = b[3];
  m.decode_per_context_token = b[4];

  if (!swaps_.empty()) {
    std::vector<std::vector<double>> xs;
    std::vector<double> ys;
    for (const IterationSample& s : swaps_) {
      xs.push_back({1.0, static_cast<double>(s.swap_pages)});
      ys.push_back(s.swap_seconds);
    }
    const std::vector<double> f = scaled_fit(std::move(xs), ys);
    m.swap_base = f[0];
    m.swap_per_page = f[1];
  }
  return m;
}

}  // namespace blend
