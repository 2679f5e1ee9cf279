// The host sampler's time per row (sample_token), single thread, for each kind of row the
// engine sends it: a plain temperature draw, the top-k / top-p / min-p cuts, logprobs.
//
//   sampler_bench [--vocab N] [--rows N] [--reps N]
//
// Rows look like a model's: normal(-4, 3) logits with six high ones, seeded, so every run samples
// the same rows. Each setting draws `rows` tokens (64) over 16 distinct rows, `reps` times (7);
// prints one JSON line per setting with the median microseconds per row.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sampling/sampler.h"

namespace {

using blend::SamplingParams;

struct Setting {
  const char* name;
  SamplingParams params;
};

std::vector<Setting> settings() {
  auto at = [](float temperature) {
    SamplingParams p;
    p.temperature = temperature;
    return p;
  };
  std::vector<Setting> s;
  s.push_back({"greedy", at(0.0f)});
  s.push_back({"temperature 0.7", at(0.7f)});
  s.push_back({"top_k 50", at(0.7f)});
  s.back().params.top_k = 50;
  s.push_back({"top_p 0.9", at(0.7f)});
  s.back().params.top_p = 0.9f;
  s.push_back({"min_p 0.05", at(0.7f)});
  s.back().params.min_p = 0.05f;
  s.push_back({"top_k 50 + top_p 0.9", at(0.7f)});
  s.back().params.top_k = 50;
  s.back().params.top_p = 0.9f;
  s.push_back({"logprobs 5", at(0.7f)});
  s.back().params.logprobs = 5;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t vocab = 128256, rows = 64;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--vocab") {
      vocab = std::atoll(argv[i + 1]);
    } else if (flag == "--rows") {
      rows = std::atoll(argv[i + 1]);
    } else if (flag == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "sampler_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (vocab < 1 || rows < 1 || reps < 1) {
    std::fprintf(stderr, "sampler_bench: --vocab, --rows and --reps must be positive\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(-4.0f, 3.0f);
  std::vector<std::vector<float>> distinct(16, std::vector<float>(static_cast<size_t>(vocab)));
  for (auto& row : distinct) {
    for (float& x : row) x = noise(rng);
    for (int k = 0; k < 6; ++k) row[rng() % row.size()] = 8.0f + static_cast<float>(k);
  }
  int64_t checksum = 0;  // keeps the draws from being optimised away
  for (const Setting& s : settings()) {
    int64_t step = 0;
    const double seconds = blend::bench::median_seconds(reps, [&] {
      for (int64_t r = 0; r < rows; ++r)
        checksum +=
            blend::sample_token(distinct[static_cast<size_t>(r % 16)], s.params, 7, step++).token;
    });
    blend::bench::emit({{"setting", s.name},
                        {"vocab", vocab},
                        {"us_per_row", seconds / static_cast<double>(rows) * 1e6}});
  }
  std::fprintf(stderr, "checksum %lld\n", static_cast<long long>(checksum));
  return 0;
}
