// Memory bandwidth of this machine, as STREAM's triad measures it: a[i] = b[i] + s * c[i] over
// three float arrays far larger than the caches, on the OpenMP threads, best of --reps runs;
// bytes counted as STREAM counts them (12 a element: two reads and a write; the write-allocate
// read is not counted). The bound of a memory-bound decode step (DESIGN.md §3): tokens/s <=
// bandwidth / weight bytes read per token.
//
//   triad_bench [--mib 512] [--reps 10] [--threads N]
//   -> {"kind":"triad","mib_per_array":512,"threads":2,"best_gb_per_s":...,"median_gb_per_s":...}
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  int64_t mib = 512;
  int reps = 10, threads = omp_get_max_threads();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "triad_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const long v = std::strtol(argv[++i], nullptr, 10);
    if (v < 1) {
      std::fprintf(stderr, "triad_bench: %s must be a positive integer\n", a.c_str());
      return 2;
    }
    if (a == "--mib") {
      mib = v;
    } else if (a == "--reps") {
      reps = static_cast<int>(v);
    } else if (a == "--threads") {
      threads = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "triad_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const int64_t n = mib * (1 << 20) / 4;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n), 1.0f),
      c(static_cast<size_t>(n), 2.0f);
  const float s = 3.0f;
  std::vector<double> rates;
  for (int r = 0; r <= reps; ++r) {  // run 0 faults the pages in and is not counted
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(12.0 * static_cast<double>(n) / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  std::printf(
      "{\"kind\":\"triad\",\"mib_per_array\":%lld,\"threads\":%d,\"best_gb_per_s\":%.2f,"
      "\"median_gb_per_s\":%.2f,\"check\":%.1f}\n",
      static_cast<long long>(mib), threads, rates.back(), rates[rates.size() / 2],
      static_cast<double>(a[static_cast<size_t>(n / 2)]));
  return 0;
}
