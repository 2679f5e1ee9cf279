#include "backend/cpu/threads.h"

#include <cblas.h>
#include <omp.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

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

}  // namespace blend::cpu
