// The cpu backend's threads: one OpenMP pool (GEMMs, attention and element-wise ops; oneDNN runs
// on it too), whose idle threads sleep after a short spin, and OpenBLAS without a pool of its own.
//
// Why: libgomp's idle threads spin 300,000 rounds (milliseconds) at every barrier and after
// every parallel region before they sleep. On a machine whose cores something else also uses (a
// server's HTTP threads, another process) a spinning thread holds a core the thread with the
// work needs: one request on the tiny model took 6.55 s instead of 0.25 s beside other processes
// on 2 cores (issue 25). And OpenBLAS (f32 GEMM alternative) starts a thread a core at load.
//
// How: libgomp and OpenBLAS read their environment once, in their library constructors, before
// main() and before any constructor of the executable runs. So where the user set neither
// OMP_WAIT_POLICY nor GOMP_SPINCOUNT, an executable that links this backend sets
// GOMP_SPINCOUNT=kSpinCount (and OPENBLAS_NUM_THREADS=1 unless set) and starts itself again,
// once, from its first constructor; the second start takes them out of the environment again
// before main(), so child processes and the user see the environment they gave. A user's own
// setting always wins (and costs no second start). See threads.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace blend::cpu {

// Spin rounds before an idle OpenMP thread sleeps (libgomp's default: 300,000, when
// OMP_WAIT_POLICY is unset): tens of microseconds, enough to bridge the gap between one
// parallel region of a forward pass and the next on an idle machine. On the shared 2-core EPYC
// (tiny model, bench/contention.sh, runs of a first sweep) 1,000 ran 5-16x libgomp's default
// and close to OMP_WAIT_POLICY=passive, with and without a busy loop on one core; 10,000 ran
// 1-16x. docs/BENCHMARKS.md has the table.
inline constexpr long kSpinCount = 1000;

// Sets the calling thread's OpenMP thread count for the backend's parallel regions and keeps
// OpenBLAS single-threaded (it only ever runs inside them).
void use_threads(int threads);

// How this process's idle OpenMP threads wait and who chose it, e.g. "GOMP_SPINCOUNT=10000
// (blend)" or "OMP_WAIT_POLICY=active (environment)"; and OpenBLAS's thread count.
std::string thread_policy();

// Whether blend set GOMP_SPINCOUNT (libgomp) or KMP_BLOCKTIME (LLVM's libomp, clang builds) at
// start-up: the user had set neither it nor OMP_WAIT_POLICY.
bool spin_count_set_by_blend();

// How many threads a forward pass should use when the user left the count to blend (--threads
// 0), given the cores other processes keep busy. Why: every parallel region waits for its slowest
// thread, and a thread on a core another process also runs gets about half of it; beside one busy
// core a 2-thread smollm-135m batch ran at 0.62x of one thread (docs/BENCHMARKS.md, "Beside a
// busy neighbour"). So the pass runs on the cores the others leave free.
//
// How: at most once per interval, the busy time of all CPUs (/proc/stat) minus this process's own
// CPU time (/proc/self/stat) over the interval is what other processes used, in cores; the count
// is the online cores minus that, rounded, within [1, max]. Without /proc it stays at max.
class CoreShare {
 public:
  // CPU time at one moment: all CPUs' busy ticks and this process's, in clock ticks.
  struct Ticks {
    double wall = 0;  // seconds, steady clock
    int64_t busy = 0, self = 0;
    bool ok = false;  // false where /proc could not be read
  };
  static Ticks read_proc();

  explicit CoreShare(int max_threads, double interval_seconds = 0.1);
  // The thread count for the next pass (re-measured when the interval has passed).
  int threads();
  // Takes a measurement (read_proc() in threads(); tests pass their own) and returns the new
  // count: online cores minus other processes' busy cores since the previous one.
  int observe(const Ticks& now, int online_cores, double ticks_per_second);
  int max_threads() const { return max_; }

 private:
  int max_, current_;
  double interval_;
  Ticks last_;
};

// The CPU cores this process's cgroup lets it use, rounded up: the smallest quota / period of
// cgroup v2's cpu.max or v1's cpu.cfs_quota_us / cpu.cfs_period_us on the path from its cgroup to
// the hierarchy's root; 0 when no quota applies or nothing can be read. Why: a container started
// with `--cpus 2` on a 64-core host sees 64 online cores, and 64 threads there get throttled in
// every period (each parallel region waits for the slowest), so --threads 0 caps the count
// here (as the JVM and Go's runtime do). `mountinfo` and `self_cgroup` are the texts of
// /proc/self/mountinfo and /proc/self/cgroup; `read_file` returns a file's text or nullopt.
int cgroup_cpu_limit(
    std::string_view mountinfo, std::string_view self_cgroup,
    const std::function<std::optional<std::string>(const std::string&)>& read_file);
// The same from this process's own /proc and cgroup files.
int cgroup_cpu_limit();

// Pure parts of CoreShare, for tests:
// Busy and total clock ticks of all CPUs from /proc/stat's first line ("cpu  user nice system idle
// iowait irq softirq steal ..."): busy excludes idle and iowait. False when it is not such a line.
bool parse_proc_stat_cpu(std::string_view line, int64_t& busy, int64_t& total);
// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line, in clock ticks; -1 when malformed.
int64_t parse_proc_self_ticks(std::string_view stat);
// The thread count for `others` cores' worth of other processes' work on `online` cores.
int threads_beside(double others, int online, int max_threads);

}  // namespace blend::cpu
