#include "backend/cpu/threads.h"

#include <cblas.h>
#include <omp.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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

// CoreShare's arithmetic: /proc/stat's busy ticks leave out idle and iowait; a process's own
// ticks are fields 14 and 15 counted after the command name, which may hold spaces and ')'.
TEST(CoreShare, ParsesProcFiles) {
  int64_t busy = 0, total = 0;
  ASSERT_TRUE(parse_proc_stat_cpu("cpu  100 5 50 1000 20 3 2 1 0 0", busy, total));
  EXPECT_EQ(total, 1181);
  EXPECT_EQ(busy, 161);
  EXPECT_FALSE(parse_proc_stat_cpu("cpu0 1 2 3 4", busy, total));
  EXPECT_FALSE(parse_proc_stat_cpu("cpu  1 2", busy, total));
  EXPECT_EQ(parse_proc_self_ticks("4242 (odd) name)) R 1 4242 4242 0 -1 4194560 100 0 0 0 "
                                  "250 75 0 0 20 0 3 0 1234"),
            325);
  EXPECT_EQ(parse_proc_self_ticks("4242 (short) R 1 2"), -1);
  EXPECT_EQ(parse_proc_self_ticks("no parenthesis"), -1);
}

TEST(CoreShare, RunsOnTheCoresOthersLeaveFree) {
  EXPECT_EQ(threads_beside(0.0, 2, 2), 2);
  EXPECT_EQ(threads_beside(1.0, 2, 2), 1);   // one busy neighbour on two cores
  EXPECT_EQ(threads_beside(0.4, 2, 2), 2);   // a light one does not cost a thread
  EXPECT_EQ(threads_beside(5.0, 2, 2), 1);   // never fewer than one
  EXPECT_EQ(threads_beside(2.0, 16, 8), 8);  // never more than the model was laid out for
  EXPECT_EQ(threads_beside(-0.3, 4, 4), 4);  // accounting noise below zero
}

// CoreShare over a sequence of measurements (100 ticks a second, 2 cores): a neighbour that
// keeps one core busy takes a thread away; when it stops, the thread comes back. This process's
// own ticks are not a neighbour's.
TEST(CoreShare, FollowsOtherProcessesNotItsOwn) {
  CoreShare share(2, 1.0);
  auto ticks = [](double wall, int64_t busy, int64_t self) {
    return CoreShare::Ticks{.wall = wall, .busy = busy, .self = self, .ok = true};
  };
  share.observe(ticks(0, 0, 0), 2, 100);
  EXPECT_EQ(share.observe(ticks(1, 200, 200), 2, 100), 2);   // both cores busy, all of it ours
  EXPECT_EQ(share.observe(ticks(2, 400, 300), 2, 100), 1);   // a neighbour took a core
  EXPECT_EQ(share.observe(ticks(3, 500, 400), 2, 100), 2);   // and left
  EXPECT_EQ(share.observe(CoreShare::Ticks{}, 2, 100), 2);   // /proc unreadable: unchanged
  EXPECT_EQ(share.observe(ticks(5, 800, 500), 2, 100), 2);   // no previous reading: unchanged
  EXPECT_EQ(share.observe(ticks(6, 1000, 550), 2, 100), 1);  // 1.5 cores of others
  // The real /proc: readable here, and the counters only grow.
  const CoreShare::Ticks a = CoreShare::read_proc();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const CoreShare::Ticks b = CoreShare::read_proc();
  ASSERT_TRUE(a.ok && b.ok);
  EXPECT_GE(b.busy, a.busy);
  EXPECT_GE(b.self, a.self);
}

// The cgroup CPU quota caps --threads 0: v2's cpu.max and v1's cfs quota / period, the smallest
// on the path from the process's cgroup up to the mount's root, rounded up; no quota is 0.
TEST(CgroupCpuLimit, TheSmallestQuotaOnThePathRoundedUp) {
  std::map<std::string, std::string> files;
  auto read = [&files](const std::string& path) -> std::optional<std::string> {
    auto it = files.find(path);
    if (it == files.end()) return std::nullopt;
    return it->second;
  };
  // cgroup v2 at /sys/fs/cgroup, the process in /a/b.
  const std::string v2_mounts =
      "25 1 0:22 / /proc rw - proc proc rw\n"
      "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
  EXPECT_EQ(cgroup_cpu_limit(v2_mounts, "0::/a/b\n", read), 0);  // nothing to read
  files["/sys/fs/cgroup/a/b/cpu.max"] = "max 100000\n";
  EXPECT_EQ(cgroup_cpu_limit(v2_mounts, "0::/a/b\n", read), 0);  // unlimited
  files["/sys/fs/cgroup/a/cpu.max"] = "150000 100000\n";
  EXPECT_EQ(cgroup_cpu_limit(v2_mounts, "0::/a/b\n", read), 2);  // 1.5 cores, from the parent
  files["/sys/fs/cgroup/a/b/cpu.max"] = "50000 100000\n";
  EXPECT_EQ(cgroup_cpu_limit(v2_mounts, "0::/a/b\n", read), 1);  // the child's is smaller
  files["/sys/fs/cgroup/a/b/cpu.max"] = "400000 100000\n";
  EXPECT_EQ(cgroup_cpu_limit(v2_mounts, "0::/a/b\n", read), 2);  // the parent's still applies
  // A container's view: the mount's root is its own cgroup, shown at the mount point.
  files.clear();
  files["/sys/fs/cgroup/cpu.max"] = "300000 100000";
  const std::string container = "30 25 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(cgroup_cpu_limit(container, "0::/docker/abc\n", read), 3);
  EXPECT_EQ(cgroup_cpu_limit(container, "0::/docker/abcdef\n", read), 0);  // not below it
  // cgroup v1 with the cpu controller mounted beside cpuacct (and a space in the mount point).
  files.clear();
  const std::string v1_mounts =
      "31 30 0:27 / /sys/fs/cgroup/cpu\\040x rw - cgroup cgroup rw,cpu,cpuacct\n"
      "32 30 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
  const std::string v1_self = "4:memory:/m\n3:cpu,cpuacct:/job\n0::/\n";
  files["/sys/fs/cgroup/cpu x/job/cpu.cfs_quota_us"] = "250000\n";
  files["/sys/fs/cgroup/cpu x/job/cpu.cfs_period_us"] = "100000\n";
  files["/sys/fs/cgroup/cpu x/cpu.cfs_quota_us"] = "-1\n";
  files["/sys/fs/cgroup/cpu x/cpu.cfs_period_us"] = "100000\n";
  EXPECT_EQ(cgroup_cpu_limit(v1_mounts, v1_self, read), 3);
  files["/sys/fs/cgroup/cpu x/job/cpu.cfs_quota_us"] = "-1\n";
  EXPECT_EQ(cgroup_cpu_limit(v1_mounts, v1_self, read), 0);
  // Garbage is no quota, never a crash.
  files["/sys/fs/cgroup/a/cpu.max"] = "lots\n";
  EXPECT_EQ(cgroup_cpu_limit(v2_mounts, "0::/a\n", read), 0);
  EXPECT_EQ(cgroup_cpu_limit("junk - \n", "::\n", read), 0);
  // This machine's own files read without error.
  EXPECT_GE(cgroup_cpu_limit(), 0);
}

}  // namespace
}  // namespace blend::cpu
