// Host time of NanoFlow §5.5's autosearch per step (backend/cuda/nano_search.h), which the cuda
// backend runs before every pipelined step with BLEND_CUDA_NANO_PROFILE: steps of N decodes at
// 1,024 cached tokens and one 512-token prompt chunk, on a synthetic profile of an H100-sized
// GPU (132 SMs split at steps of 8, 17 SM counts and 7 work sizes per phase, 32 layers), with
// the backend's cut limit (64 even cuts and every decode / prompt boundary) and with every cut.
// Host code only: runs without a GPU. Prints one JSON line per (chunks, cuts): the median of
// --reps calls in microseconds, and the plan (cut, GEMM SMs, predicted step time against the
// whole step's), so the limited search's plan can be compared with the full search's.
//
//   nano_search_bench [--reps 21]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/nano_search.h"

namespace {

using blend::cuda::ChunkWork;
using blend::cuda::NanoProfile;

NanoProfile h100_sized_profile() {
  NanoProfile p;
  p.total_sms = 132;
  p.layers = 32;
  p.sm_step = 8;
  for (auto* phase : {&p.gemm, &p.attention}) {
    // GEMM phases by tokens, attention by KV tokens read (4 to 1,024 decodes of 1,025).
    phase->work = phase == &p.gemm ? std::vector<double>{16, 64, 256, 512, 1024, 2048, 4096}
                                   : std::vector<double>{4100, 16400, 65600, 262400, 1049600};
    for (int32_t s = 8; s < 132; s += 8) phase->sms.push_back(s);
    phase->sms.push_back(132);
    const bool attention = phase == &p.attention;
    for (double w : phase->work)
      for (int32_t s : phase->sms)  // GEMMs scale with SMs; attention saturates at 33
        phase->seconds.push_back(attention ? w * 2e-9 * std::max(1.0, 33.0 / s)
                                           : std::max(w * 1e-6, 2e-4) * 132 / s);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 21;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: nano_search_bench [--reps N]\n");
      return 2;
    }
  }
  const NanoProfile profile = h100_sized_profile();
  for (int decodes : {16, 64, 256, 512, 1024}) {
    std::vector<ChunkWork> step(static_cast<size_t>(decodes), ChunkWork{1, 1024});
    step.push_back({512, 0});
    for (int32_t even_cuts : {64, decodes + 1}) {
      std::vector<double> us;
      blend::cuda::NanoPlan plan;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        plan = blend::cuda::autosearch(step, profile, profile.sm_step, 0.95, even_cuts);
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      std::sort(us.begin(), us.end());
      std::printf(
          "{\"chunks\":%zu,\"even_cuts\":%d,\"median_us\":%.1f,\"cut\":%d,\"gemm_sms\":%d,"
          "\"plan_ms\":%.4f,\"whole_ms\":%.4f}\n",
          step.size(), even_cuts, us[us.size() / 2], plan.cut, plan.gemm_sms, plan.seconds * 1e3,
          plan.sequential_s * 1e3);
    }
  }
  return 0;
}
