// Progress on stderr (requests done/total, tokens/s, ETA): on a terminal a one-line bar redrawn
// at most five times a second; otherwise (a log file, a pipe) a plain line every
// kLineIntervalSeconds, as tqdm does when piped, and one at the end when any was printed (so a
// run shorter than that prints nothing). The bar and the ETA follow tokens,
// not requests: requests differ in length by orders of magnitude, and BlendServe's order runs
// long and short ones in a planned mix, so finished requests say little about the time left.
// `token_bound` is the work the run can still need at most (prompt + max_tokens of every
// request, shrunk as requests finish early), so the ETA errs long, never short, and converges.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace blend::cli {

// What one redraw shows; a function of its own so that tests can check the arithmetic.
struct ProgressFigures {
  double fraction = 0;  // of the bar
  double tokens_per_s = 0;
  double eta_seconds = 0;
};

inline ProgressFigures progress_figures(int64_t done, int64_t total, int64_t tokens,
                                        int64_t token_bound, double elapsed_seconds) {
  ProgressFigures f;
  f.tokens_per_s = elapsed_seconds > 0 ? static_cast<double>(tokens) / elapsed_seconds : 0.0;
  if (done >= total) {
    f.fraction = 1;
    return f;
  }
  if (token_bound > 0)
    f.fraction = std::min(1.0, static_cast<double>(tokens) / static_cast<double>(token_bound));
  const double left = static_cast<double>(std::max<int64_t>(0, token_bound - tokens));
  f.eta_seconds = f.tokens_per_s > 0 ? left / f.tokens_per_s : 0.0;
  return f;
}

enum class ProgressStyle { kOff, kBar, kLines };

class Progress {
 public:
  static constexpr double kLineIntervalSeconds = 5;

  Progress(int64_t total, ProgressStyle style, double line_interval_s = kLineIntervalSeconds)
      : total_(total),
        style_(style),
        line_interval_s_(line_interval_s),
        start_(std::chrono::steady_clock::now()),
        last_(start_) {}

  void update(int64_t done, int64_t tokens, int64_t token_bound) {
    if (style_ == ProgressStyle::kOff) return;
    const auto now = std::chrono::steady_clock::now();
    const double since_last = std::chrono::duration<double>(now - last_).count();
    const ProgressFigures f = progress_figures(done, total_, tokens, token_bound,
                                               std::chrono::duration<double>(now - start_).count());
    if (style_ == ProgressStyle::kLines) {
      if (since_last < line_interval_s_ && !(done >= total_ && drawn_)) return;
      if (done >= total_ && finished_line_) return;
      last_ = now;
      finished_line_ = done >= total_;
      const int eta = static_cast<int>(f.eta_seconds);
      std::fprintf(stderr, "blend batch: %lld/%lld requests, %.0f tokens/s, ETA %02d:%02d\n",
                   static_cast<long long>(done), static_cast<long long>(total_), f.tokens_per_s,
                   eta / 60, eta % 60);
      drawn_ = true;
      return;
    }
    if (done < total_ && drawn_ && since_last < 0.2) return;
    last_ = now;
    constexpr int kWidth = 30;
    char bar[kWidth + 1];
    const int filled = static_cast<int>(f.fraction * kWidth);
    for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[kWidth] = '\0';
    const int eta = static_cast<int>(f.eta_seconds);
    std::fprintf(stderr, "\r[%s] %lld/%lld requests  %.0f tokens/s  ETA %02d:%02d  ", bar,
                 static_cast<long long>(done), static_cast<long long>(total_), f.tokens_per_s,
                 eta / 60, eta % 60);
    drawn_ = true;
  }

  void finish() {
    if (drawn_ && style_ == ProgressStyle::kBar) std::fprintf(stderr, "\n");
  }

 private:
  int64_t total_;
  ProgressStyle style_;
  double line_interval_s_;
  bool drawn_ = false, finished_line_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace blend::cli
