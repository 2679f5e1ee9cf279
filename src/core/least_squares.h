// Least-squares fits of y = X beta, shared by `blend profile` (harness/profile) and the hybrid
// scheduler's online iteration model (sched/iteration_fit). Rows of X are observations.
#pragma once

#include <vector>

namespace blend {

// Normal equations solved by Gaussian elimination with partial pivoting. `ridge` is added to
// the diagonal (0: plain least squares); throws blend::Error when the system is singular.
std::vector<double> least_squares(const std::vector<std::vector<double>>& x,
                                  const std::vector<double>& y, double ridge = 0.0);

// Every coefficient >= 0: a column whose coefficient comes out negative is dropped (its
// coefficient 0) and the rest refitted; so is a column of zeros. A negative rate or overhead has no
// meaning in a cost model, and clamping one after the fit would leave the others fitted to it.
std::vector<double> nonnegative_least_squares(const std::vector<std::vector<double>>& x,
                                              const std::vector<double>& y, double ridge = 0.0);

}  // namespace blend
