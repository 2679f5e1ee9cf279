// The progress bar's figures (issue 25): the bar and the ETA follow tokens, not requests.
#include "cli/progress.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

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

// Regression (issue 54): without a terminal `blend batch` printed no progress at all. It prints
// a plain line every interval (as tqdm does when piped) and a last one at the end; a run over
// before the first interval prints nothing.
TEST(Progress, WithoutATerminalALineEveryIntervalAndOneAtTheEnd) {
  testing::internal::CaptureStderr();
  {
    Progress p(10, ProgressStyle::kLines, /*line_interval_s=*/0.05);
    p.update(1, 100, 1000);  // before the first interval: nothing
    std::this_thread::sleep_for(std::chrono::milliseconds(80));
    p.update(2, 200, 1000);
    p.update(3, 300, 1000);  // within the interval again: nothing
    p.update(10, 1000, 1000);
    p.update(10, 1000, 1000);  // the end is said once
    p.finish();
  }
  {
    Progress quick(5, ProgressStyle::kLines, /*line_interval_s=*/10);
    quick.update(5, 50, 50);
    quick.finish();
  }
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.rfind("blend batch: 2/10 requests, ", 0), 0u) << out;
  EXPECT_NE(out.find("\nblend batch: 10/10 requests, "), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
}

}  // namespace
}  // namespace blend::cli
