#include "backend/cpu/threads.h"

#include <cblas.h>
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

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

namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (size_t start = 0;;) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

// mountinfo escapes spaces, tabs, newlines and backslashes in paths as \ooo (octal).
std::string unescape_mount_path(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    auto octal = [&](size_t j) { return s[j] >= '0' && s[j] <= '7'; };
    if (s[i] == '\\' && i + 3 < s.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out.push_back(
          static_cast<char>(std::strtol(std::string(s.substr(i + 1, 3)).c_str(), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Quota / period in cores from a pair of numbers; 0 for none ("max", -1) or nonsense.
double quota_cores(std::string_view quota, std::string_view period) {
  const std::string q(quota), p(period);
  char* end = nullptr;
  const double qv = std::strtod(q.c_str(), &end);
  if (end == q.c_str() || qv <= 0) return 0;
  const double pv = std::strtod(p.c_str(), &end);
  if (end == p.c_str() || pv <= 0) return 0;
  return qv / pv;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  return s;
}

}  // namespace

int cgroup_cpu_limit(
    std::string_view mountinfo, std::string_view self_cgroup,
    const std::function<std::optional<std::string>(const std::string&)>& read_file) {
  // This process's cgroup in the v2 hierarchy and in the v1 one that has the cpu controller.
  std::optional<std::string> v2_path, v1_path;
  for (std::string_view line : split(self_cgroup, '\n')) {
    const auto f = split(line, ':');
    if (f.size() < 3) continue;
    const size_t colon = line.find(':', line.find(':') + 1);
    const std::string path(line.substr(colon + 1));
    if (f[0] == "0" && f[1].empty()) v2_path = path;
    for (std::string_view c : split(f[1], ','))
      if (c == "cpu") v1_path = path;
  }
  double cores = 0;
  auto take = [&cores](double c) {
    if (c > 0 && (cores == 0 || c < cores)) cores = c;
  };
  for (std::string_view line : split(mountinfo, '\n')) {
    const size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    const auto left = split(line.substr(0, dash), ' ');
    const auto right = split(line.substr(dash + 3), ' ');
    if (left.size() < 5 || right.size() < 3) continue;
    const bool v2 = right[0] == "cgroup2";
    bool v1_cpu = false;
    if (right[0] == "cgroup")
      for (std::string_view o : split(right[2], ',')) v1_cpu = v1_cpu || o == "cpu";
    const std::optional<std::string>& path = v2 ? v2_path : v1_path;
    if ((!v2 && !v1_cpu) || !path) continue;
    // The mount shows the hierarchy from `root` down (a container's own cgroup, say).
    const std::string root = unescape_mount_path(left[3]);
    const std::string mount_point = unescape_mount_path(left[4]);
    std::string rel = *path;
    if (root != "/") {
      // Below the mount's root: the root itself or a path under it, not /docker/abcdef for
      // /docker/abc.
      if (!rel.starts_with(root) || (rel.size() > root.size() && rel[root.size()] != '/')) continue;
      rel = rel.substr(root.size());
    }
    // Every cgroup from ours up to the mount's root limits us.
    for (;;) {
      const std::string dir = mount_point + (rel == "/" ? "" : rel);
      if (v2) {
        if (auto max = read_file(dir + "/cpu.max")) {
          const auto f = split(trim(*max), ' ');
          if (f.size() == 2) take(quota_cores(f[0], f[1]));
        }
      } else {
        auto quota = read_file(dir + "/cpu.cfs_quota_us");
        auto period = read_file(dir + "/cpu.cfs_period_us");
        if (quota && period) take(quota_cores(trim(*quota), trim(*period)));
      }
      if (rel.empty() || rel == "/") break;
      const size_t slash = rel.rfind('/');
      rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
    }
  }
  return cores > 0 ? static_cast<int>(std::ceil(cores - 1e-9)) : 0;
}

int cgroup_cpu_limit() {
  auto read = [](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const auto mountinfo = read("/proc/self/mountinfo");
  const auto cgroup = read("/proc/self/cgroup");
  if (!mountinfo || !cgroup) return 0;
  return cgroup_cpu_limit(*mountinfo, *cgroup, read);
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
