#include "backend/cpu/threads.h"

#include <cblas.h>
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace blend::cpu {
namespace {

// Set by the start-up hook below, before main().
bool g_spin_set = false;       // blend set GOMP_SPINCOUNT
char g_user_policy[96] = {};   // the user's OMP_WAIT_POLICY / GOMP_SPINCOUNT, if any
bool g_blocktime_set = false;  // blend set libomp's KMP_BLOCKTIME (clang builds)

// Marks the second start of a process that re-executed itself with GOMP_SPINCOUNT (and, when it
// was unset, OPENBLAS_NUM_THREADS) set: "spin" or "spin,blas".
constexpr const char* kMarker = "BLEND_THREAD_ENV";

// glibc runs an executable's constructors after those of the shared libraries it loaded, so
// libgomp and OpenBLAS have read their environment by now (and setenv() from .preinit_array
// does not help: libc's own initialisation, later, resets the environment to the one the
// process started with). Where the user set no wait policy, the process sets one and starts
// itself again (execv of /proc/self/exe, same arguments) once; on the second start it takes
// what it set out of the environment again, so that main() and child processes see the
// user's. Where the exec fails, the process runs on with libgomp's default.
// Priority 101: before the executable's other constructors (C++ static initialisers included),
// so nothing runs twice but this check.
__attribute__((constructor(101))) void set_thread_environment(int, char** argv, char**) {
#ifdef KMP_VERSION_MAJOR
  // LLVM's libomp (a clang build, e.g. scripts/test.sh --sanitize) ignores GOMP_SPINCOUNT, and
  // its idle threads spin KMP_BLOCKTIME (200 ms) before they sleep. It reads its settings at the
  // first OpenMP call, not at load, so a default set here needs no restart and leaves the
  // environment alone. Its unit is the millisecond: 0, the nearest to kSpinCount's microseconds.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("KMP_BLOCKTIME") == nullptr) {
    kmp_set_defaults("KMP_BLOCKTIME=0");
    g_blocktime_set = true;
  }
#endif
  if (const char* marker = std::getenv(kMarker)) {
    g_spin_set = true;
    if (std::strstr(marker, "blas") != nullptr) unsetenv("OPENBLAS_NUM_THREADS");
    unsetenv("GOMP_SPINCOUNT");
    unsetenv(kMarker);
    return;
  }
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (policy != nullptr || spin != nullptr) {
    std::snprintf(g_user_policy, sizeof g_user_policy, "%s%s%s%s%s",
                  policy ? "OMP_WAIT_POLICY=" : "", policy ? policy : "", policy && spin ? " " : "",
                  spin ? "GOMP_SPINCOUNT=" : "", spin ? spin : "");
    return;
  }
  if (argv == nullptr || argv[0] == nullptr) return;
  const bool blas = std::getenv("OPENBLAS_NUM_THREADS") == nullptr;
  char value[32];
  std::snprintf(value, sizeof value, "%ld", kSpinCount);
  if (setenv("GOMP_SPINCOUNT", value, 1) != 0) return;
  if (blas) setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv(kMarker, blas ? "spin,blas" : "spin", 1);
  execv("/proc/self/exe", argv);
  unsetenv(kMarker);  // no exec (no /proc?): run on as the process started
  if (blas) unsetenv("OPENBLAS_NUM_THREADS");
  unsetenv("GOMP_SPINCOUNT");
}

}  // namespace

void use_threads(int threads) {
  omp_set_num_threads(threads);
  openblas_set_num_threads(1);
}

bool spin_count_set_by_blend() {
  return g_spin_set || g_blocktime_set;
}

std::string thread_policy() {
  std::string s = g_blocktime_set ? "libomp KMP_BLOCKTIME=0 (blend)"
                  : g_spin_set    ? "GOMP_SPINCOUNT=" + std::to_string(kSpinCount) + " (blend)"
                  : g_user_policy[0] != '\0' ? std::string(g_user_policy) + " (environment)"
                                             : "OpenMP runtime default";
  return s + ", OpenBLAS threads " + std::to_string(openblas_get_num_threads());
}

bool parse_proc_stat_cpu(std::string_view line, int64_t& busy, int64_t& total) {
  if (!line.starts_with("cpu ")) return false;
  std::istringstream in{std::string(line.substr(4))};
  int64_t v[8] = {};
  int n = 0;
  while (n < 8 && in >> v[n]) ++n;
  if (n < 4) return false;
  total = 0;
  for (int i = 0; i < n; ++i) total += v[i];
  busy = total - v[3] - (n > 4 ? v[4] : 0);  // idle, iowait
  return true;
}

int64_t parse_proc_self_ticks(std::string_view stat) {
  // The command name (field 2) is in parentheses and may hold spaces: count from its end.
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos) return -1;
  std::istringstream in{std::string(stat.substr(close + 1))};
  std::string field;
  int64_t utime = -1, stime = -1;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::strtoll(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoll(field.c_str(), nullptr, 10);
  }
  return utime < 0 || stime < 0 ? -1 : utime + stime;
}

int threads_beside(double others, int online, int max_threads) {
  const double free_cores = static_cast<double>(online) - std::max(0.0, others);
  return std::clamp(static_cast<int>(std::lround(free_cores)), 1, std::max(1, max_threads));
}

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

CoreShare::CoreShare(int max_threads, double interval_seconds)
    : max_(std::max(1, max_threads)),
      current_(max_),
      interval_(interval_seconds),
      last_(read_proc()) {}

CoreShare::Ticks CoreShare::read_proc() {
  Ticks t;
  t.wall = wall_seconds();
  std::ifstream stat("/proc/stat"), self("/proc/self/stat");
  std::string line, self_line;
  int64_t total = 0;
  if (!std::getline(stat, line) || !parse_proc_stat_cpu(line, t.busy, total) ||
      !std::getline(self, self_line))
    return t;
  t.self = parse_proc_self_ticks(self_line);
  t.ok = t.self >= 0;
  return t;
}

int CoreShare::observe(const Ticks& now, int online_cores, double ticks_per_second) {
  if (now.ok && last_.ok && now.wall > last_.wall) {
    const auto others = static_cast<double>((now.busy - last_.busy) - (now.self - last_.self));
    current_ =
        threads_beside(others / ticks_per_second / (now.wall - last_.wall), online_cores, max_);
  }
  last_ = now;
  return current_;
}

int CoreShare::threads() {
  if (max_ == 1 || wall_seconds() - last_.wall < interval_) return current_;
  static const int online = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  static const auto ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return observe(read_proc(), online, ticks);
}

}  // namespace blend::cpu
