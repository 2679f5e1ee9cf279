// The progress bar's figures (issue 25): the bar and the ETA follow tokens, not requests.
#include "cli/progress.h"

#include <gtest/gtest.h>

namespace blend::cli {
namespace {

TEST(Progress, EtaFollowsTokensNotFinishedRequests) {
  // Half the requests done, but they were the short ones: 1,000 of at most 10,000 tokens in
  // 10 s. By requests the ETA would be 10 s; by tokens it is 90 s.
  ProgressFigures f = progress_figures(/*done=*/50, /*total=*/100, /*tokens=*/1000,
                                       /*token_bound=*/10000, /*elapsed=*/10);
  EXPECT_DOUBLE_EQ(f.tokens_per_s, 100);
  EXPECT_DOUBLE_EQ(f.eta_seconds, 90);
  EXPECT_DOUBLE_EQ(f.fraction, 0.1);
  // The bound shrinks as requests stop early: the estimate converges.
  f = progress_figures(50, 100, 1000, 2000, 10);
  EXPECT_DOUBLE_EQ(f.eta_seconds, 10);
  // Done is done whatever the bound says; no rate yet is no ETA rather than a division by 0.
  f = progress_figures(100, 100, 1000, 5000, 10);
  EXPECT_DOUBLE_EQ(f.fraction, 1);
  EXPECT_DOUBLE_EQ(f.eta_seconds, 0);
  f = progress_figures(0, 100, 0, 5000, 0);
  EXPECT_DOUBLE_EQ(f.eta_seconds, 0);
  EXPECT_DOUBLE_EQ(f.fraction, 0);
}

}  // namespace
}  // namespace blend::cli
