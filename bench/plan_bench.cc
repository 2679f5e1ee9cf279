// Planner build time on a synthetic offline batch (issue 8: 400K requests of ~1K tokens must
// plan in <= 10 s). Requests draw one of 256 shared system prompts (100-700 tokens) and a unique
// remainder up to ~1K prompt tokens; output lengths are log-uniform in [1, 4096].
// Usage: plan_bench [requests=400000] [mean_prompt_tokens=1000] [runs=3]
// Prints per-phase seconds of each run and the median total (docs/BENCHMARKS.md, "Planner").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <random>
#include <vector>

#include "cost/cost_model.h"
#include "plan/admission.h"
#include "plan/planner.h"
#include "plan/prefix_tree.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::vector<blend::plan::PlanRequest> synthesize(int64_t n, int mean_prompt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> system_prompts(256);
  for (auto& p : system_prompts) {
    p.resize(100 + rng() % 600);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % 128000);
  }
  std::uniform_real_distribution<double> log_output(0, std::log(4096.0));
  std::vector<blend::plan::PlanRequest> requests(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    blend::plan::PlanRequest& r = requests[static_cast<size_t>(i)];
    r.id = "req-" + std::to_string(i);
    const auto& sys = system_prompts[rng() % system_prompts.size()];
    const size_t total =
        static_cast<size_t>(mean_prompt / 2 + rng() % static_cast<uint64_t>(mean_prompt));
    r.prompt.reserve(std::max(total, sys.size() + 1));
    r.prompt.assign(sys.begin(), sys.end());
    while (r.prompt.size() < total || r.prompt.size() == sys.size())
      r.prompt.push_back(static_cast<int32_t>(rng() % 128000));
    r.output_tokens = std::floor(std::exp(log_output(rng)));
  }
  return requests;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 400000;
  const int mean_prompt = argc > 2 ? std::atoi(argv[2]) : 1000;
  const int runs = argc > 3 ? std::atoi(argv[3]) : 3;
  const blend::CostModel cost(*blend::find_model_shape_preset("llama-3-8b"),
                              *blend::find_hardware_preset("a100-80g"));
  auto t = Clock::now();
  const std::vector<blend::plan::PlanRequest> requests = synthesize(n, mean_prompt, 1);
  int64_t tokens = 0;
  for (const auto& r : requests) tokens += static_cast<int64_t>(r.prompt.size());
  std::printf("synthesized %lld requests, %lld prompt tokens in %.2f s\n",
              static_cast<long long>(n), static_cast<long long>(tokens), seconds_since(t));

  std::vector<double> totals;
  for (int run = 0; run < runs; ++run) {
    const auto start = Clock::now();
    t = Clock::now();
    blend::plan::PrefixTree tree(requests);
    const double build = seconds_since(t);
    t = Clock::now();
    const blend::plan::Plan plan = blend::plan::make_plan(tree, cost, blend::plan::PlanOptions{});
    const double planning = seconds_since(t);
    t = Clock::now();
    blend::plan::DualScanner scanner(plan, requests, cost, 40e9);
    std::deque<int32_t> running;
    int64_t admitted = 0;
    while (!scanner.exhausted()) {
      if (auto r = scanner.next()) {
        running.push_back(*r);
        ++admitted;
      } else {
        scanner.on_finished(running.front());
        running.pop_front();
      }
    }
    const double scan = seconds_since(t);
    const double total = seconds_since(start);
    totals.push_back(total);
    std::printf(
        "run %d: trie %.2f s (%d nodes, s_o %.3f), sort+split %.2f s (%zu groups), "
        "dual scan %.2f s (%lld admitted), total %.2f s\n",
        run, build, tree.size(), tree.optimal_sharing_ratio(), planning, plan.groups.size(), scan,
        static_cast<long long>(admitted), total);
  }
  std::sort(totals.begin(), totals.end());
  std::printf("median total %.2f s over %d runs\n", totals[totals.size() / 2], runs);
  return 0;
}
