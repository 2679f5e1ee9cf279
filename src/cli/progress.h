// A one-line progress bar on stderr (requests done/total, tokens/s, ETA), redrawn at most
// five times a second; silent when stderr is not a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace blend::cli {

class Progress {
 public:
  Progress(int64_t total, bool enabled)
      : total_(total), enabled_(enabled), start_(std::chrono::steady_clock::now()) {}

  void update(int64_t done, int64_t tokens) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(tokens) / elapsed : 0.0;
    const double frac = total_ > 0 ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
    const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0.0;
    constexpr int kWidth = 30;
    char bar[kWidth + 1];
    const int filled = static_cast<int>(frac * kWidth);
    for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[kWidth] = '\0';
    std::fprintf(stderr, "\r[%s] %lld/%lld requests  %.0f tokens/s  ETA %02d:%02d  ", bar,
                 static_cast<long long>(done), static_cast<long long>(total_), rate,
                 static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    drawn_ = true;
  }

  void finish() {
    if (drawn_) std::fprintf(stderr, "\n");
  }

 private:
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace blend::cli
