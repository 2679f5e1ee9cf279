// Helpers the benchmarks share (cpu_forward_bench, gpu/cuda_forward_bench, tokenizer_bench,
// grammar_bench): the clock, medians, the median of repeated runs after a warm-up, comma lists,
// JSON lines on stdout.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace blend::bench {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds since `start`, a value of now().
inline double seconds_since(double start) {
  return now() - start;
}

// The median of `v` (the mean of the middle two for an even count); v must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs f once to warm up (kernel creation, first touch of buffers), then `reps` times; returns
// the index of the median run and its seconds.
template <typename F>
std::pair<size_t, double> median_run(int reps, F&& f) {
  f();
  std::vector<std::pair<double, size_t>> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now();
    f();
    t.emplace_back(now() - t0, static_cast<size_t>(i));
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2].second, t[t.size() / 2].first};
}

template <typename F>
double median_seconds(int reps, F&& f) {
  return median_run(reps, f).second;
}

// "64,128,256" -> {64, 128, 256}.
inline std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t comma = s.find(',', pos);
    v.push_back(std::stoll(s.substr(pos, comma - pos)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

// One JSON line on stdout, flushed (a run cut short keeps what it printed).
inline void emit(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace blend::bench
