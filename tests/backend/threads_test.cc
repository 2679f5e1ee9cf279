#include "backend/cpu/threads.h"

#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <thread>

#include <gtest/gtest.h>

namespace blend::cpu {
namespace {

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Regression (issue 25): with libgomp's default wait policy each idle OpenMP thread spun 300,000
// rounds (~3 ms of a core here) after every parallel region, holding cores that other processes
// and the thread with the work needed. This binary links the backend, so its OpenMP threads run
// under blend's policy: after a parallel region they spin briefly and sleep.
TEST(Threads, IdleOpenMpThreadsSleepAfterAShortSpin) {
  if (!spin_count_set_by_blend())
    GTEST_SKIP() << "the environment sets the wait policy: " << thread_policy();
  // No more threads than cores: libgomp spins far less (1,000 rounds) when there are more.
  const int threads = omp_get_num_procs();
  if (threads < 2) GTEST_SKIP() << "one core: no idle OpenMP thread to watch";
  constexpr int kRounds = 10;
  double idle_cpu = 0;
  volatile int sink = 0;
  for (int round = 0; round < kRounds; ++round) {
#pragma omp parallel num_threads(threads)
    { sink = sink + omp_get_thread_num(); }
    // The workers are idle now: whatever CPU time the process uses is their waiting.
    const double before = process_cpu_seconds();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    idle_cpu += process_cpu_seconds() - before;
  }
  // libgomp's default: ~3 ms a worker a round (30 ms for one worker); blend's: well under 1 ms.
  EXPECT_LT(idle_cpu, 0.008 * (threads - 1)) << thread_policy();
}

// OpenBLAS only runs inside the backend's OpenMP regions, one thread each: it starts no pool of
// its own (it used to start a thread a core at load, beside OpenMP's).
TEST(Threads, OpenBlasHasNoThreadPoolOfItsOwn) {
  if (const char* user = std::getenv("OPENBLAS_NUM_THREADS"))
    GTEST_SKIP() << "the environment sets OPENBLAS_NUM_THREADS=" << user;
  EXPECT_EQ(openblas_get_num_threads(), 1) << thread_policy();
  EXPECT_NE(thread_policy().find("OpenBLAS threads 1"), std::string::npos) << thread_policy();
}

// What blend set for libgomp and OpenBLAS is gone from the environment by main(): child
// processes (and the user's code) see the environment they were given.
TEST(Threads, TheEnvironmentIsTheUsersAgain) {
  if (spin_count_set_by_blend()) {
    EXPECT_EQ(std::getenv("GOMP_SPINCOUNT"), nullptr);
  }
  EXPECT_NE(thread_policy().find(spin_count_set_by_blend() ? "(blend)" : "(environment)"),
            std::string::npos)
      << thread_policy();
}

}  // namespace
}  // namespace blend::cpu
