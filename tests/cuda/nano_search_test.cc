// NanoFlow §5.5's autosearch (backend/cuda/nano_search.h) on synthetic profiles whose best
// plan is known. Host code only: these run without a GPU.
#include "backend/cuda/nano_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend {
namespace {

// A profile sampled from seconds(work, sms) on a grid: work in powers of two from 1 to 2^20,
// every SM count from 1 to `total`.
template <typename F>
cuda::PhaseProfile sampled(int32_t total, F seconds) {
  cuda::PhaseProfile p;
  for (double w = 1; w <= (1 << 20); w *= 2) p.work.push_back(w);
  for (int32_t s = 1; s <= total; ++s) p.sms.push_back(s);
  for (double w : p.work)
    for (int32_t s : p.sms) p.seconds.push_back(seconds(w, s));
  return p;
}

// An H100-like 8B layer: GEMMs scale with their SMs (compute-bound: 1 us per token on the whole
// GPU, never under a 0.2 ms weight read), attention reads at full bandwidth from `saturation`
// SMs on (memory-bound: NanoFlow Fig. 7's non-linearity) and slows below it.
cuda::NanoProfile h100_like(int32_t saturation, int32_t layers = 8) {
  const int32_t total = 132;
  cuda::NanoProfile p;
  p.total_sms = total;
  p.layers = layers;
  p.gemm = sampled(
      total, [&](double tokens, int32_t s) { return std::max(tokens * 1e-6, 2e-4) * total / s; });
  p.attention = sampled(total, [&](double reads, int32_t s) {
    return reads * 2e-9 * std::max(1.0, static_cast<double>(saturation) / s);
  });
  return p;
}

std::vector<cuda::ChunkWork> decodes_then_prompt(int decodes, int context, int prompt) {
  std::vector<cuda::ChunkWork> step(decodes, cuda::ChunkWork{.tokens = 1, .cached = context});
  if (prompt > 0) step.push_back({.tokens = prompt, .cached = 0});
  return step;
}

TEST(NanoSearch, ProfileInterpolatesBetweenMeasuredPoints) {
  cuda::PhaseProfile p{.work = {100, 200}, .sms = {10, 20}, .seconds = {1, 0.5, 2, 1}};
  p.check("test");
  EXPECT_DOUBLE_EQ(p.seconds_at(100, 10), 1);
  EXPECT_DOUBLE_EQ(p.seconds_at(200, 20), 1);
  EXPECT_DOUBLE_EQ(p.seconds_at(150, 10), 1.5);
  EXPECT_DOUBLE_EQ(p.seconds_at(100, 15), 0.75);
  EXPECT_DOUBLE_EQ(p.seconds_at(300, 10), 3);    // the last two points' line
  EXPECT_DOUBLE_EQ(p.seconds_at(50, 10), 1);     // a phase's floor
  EXPECT_DOUBLE_EQ(p.seconds_at(100, 40), 0.5);  // SM counts clamp to the grid
  EXPECT_DOUBLE_EQ(p.seconds_at(100, 1), 1);
}

TEST(NanoSearch, CriticalPathOfThePipeline) {
  // GEMM-bound: the GEMM phases take turns, 2 (L + 1) of them; the attentions hide.
  const cuda::CriticalPath gemm_bound = cuda::nano_critical_path(1, 0.5, 1, 0.5, 4);
  EXPECT_DOUBLE_EQ(gemm_bound.seconds, 2 * 5);
  EXPECT_DOUBLE_EQ(gemm_bound.attention_seconds, 0);
  // Attention-bound: the first GEMM phase, the attentions one after the other, the last one.
  const cuda::CriticalPath attention_bound = cuda::nano_critical_path(1, 3, 1, 3, 2);
  EXPECT_DOUBLE_EQ(attention_bound.seconds, 1 + 2 * 2 * 3 + 1);
  EXPECT_DOUBLE_EQ(attention_bound.attention_seconds, 12);
  EXPECT_DOUBLE_EQ(attention_bound.gemm_seconds, 2);
  // A lane's own chain: X's attention beside Y's GEMMs, Y's beside X's next.
  const cuda::CriticalPath lane = cuda::nano_critical_path(2, 2, 0.5, 0.5, 3);
  EXPECT_DOUBLE_EQ(lane.seconds, 3 * (2 + 2) + 2 + 0.5);
}

// The greedy search reaches the best SM split of its lattice (the exhaustive minimum). On an
// attention-bound step that is a known one: the attention keeps exactly the SMs at which it
// saturates the memory (fewer slow it, more do not speed it), the GEMMs get the rest.
TEST(NanoSearch, GreedySplitIsTheExhaustiveBestAndTheKnownOne) {
  for (int32_t saturation : {24, 33, 48, 90}) {
    const cuda::NanoProfile p = h100_like(saturation);
    // X and Y: 512 decodes at 8K context each.
    const double xt = 512, xr = 512.0 * 8193, yt = 512, yr = 512.0 * 8193;
    const cuda::NanoPlan plan = cuda::search_sm_split(p, xt, xr, yt, yr, /*step=*/3);
    double best = 1e30;
    int32_t best_g = 0;
    for (int32_t g = 66 % 3; g <= 132; g += 3) {
      if (g < 3 || 132 - g < 3) continue;
      const double t = cuda::nano_critical_path(
                           p.gemm.seconds_at(xt, g), p.attention.seconds_at(xr, 132 - g),
                           p.gemm.seconds_at(yt, g), p.attention.seconds_at(yr, 132 - g), p.layers)
                           .seconds;
      if (t < best - 1e-15) best = t, best_g = g;
    }
    EXPECT_DOUBLE_EQ(plan.seconds, best) << "saturation " << saturation;
    EXPECT_EQ(plan.gemm_sms, best_g) << "saturation " << saturation;
    EXPECT_EQ(plan.attention_sms, saturation) << "saturation " << saturation;
    EXPECT_EQ(plan.gemm_sms + plan.attention_sms, 132);
    EXPECT_GT(plan.moves, 0);
  }
  // GEMM-heavy (X: 256 decodes at 4K, Y: a 4K-token prompt chunk): the exhaustive best too.
  const cuda::NanoProfile p = h100_like(33);
  const double xt = 256, xr = 256.0 * 4097, yt = 4096, yr = 64.0 * 4096;
  const cuda::NanoPlan plan = cuda::search_sm_split(p, xt, xr, yt, yr, 3);
  for (int32_t g = 3; g <= 129; g += 3)
    EXPECT_LE(plan.seconds, cuda::nano_critical_path(p.gemm.seconds_at(xt, g),
                                                     p.attention.seconds_at(xr, 132 - g),
                                                     p.gemm.seconds_at(yt, g),
                                                     p.attention.seconds_at(yr, 132 - g), p.layers)
                                .seconds)
        << g;
}

// On a GPU that splits its SMs at steps of 8 (green contexts on Hopper), every split the search
// tries is a multiple of 8 that leaves the attention an SM, and the one it keeps is the best
// of them.
TEST(NanoSearch, SplitsAreMultiplesOfTheSmStep) {
  for (int32_t saturation : {24, 33, 90}) {
    const cuda::NanoProfile p = h100_like(saturation);
    const double xt = 512, xr = 512.0 * 8193, yt = 2048, yr = 64.0 * 2048;
    const cuda::NanoPlan plan = cuda::search_sm_split(p, xt, xr, yt, yr, /*step=*/8);
    EXPECT_EQ(plan.gemm_sms % 8, 0);
    EXPECT_EQ(plan.gemm_sms + plan.attention_sms, 132);
    double best = 1e30;
    for (int32_t g = 8; g <= 128; g += 8)
      best = std::min(best, cuda::nano_critical_path(p.gemm.seconds_at(xt, g),
                                                     p.attention.seconds_at(xr, 132 - g),
                                                     p.gemm.seconds_at(yt, g),
                                                     p.attention.seconds_at(yr, 132 - g), p.layers)
                                .seconds);
    EXPECT_DOUBLE_EQ(plan.seconds, best) << "saturation " << saturation;
  }
  // A step past half the SMs leaves no split to choose.
  EXPECT_THROW(cuda::search_sm_split(h100_like(33), 1, 1, 1, 1, 67), Error);
}

// The backend's per-step choice: with a profile, autosearch's cut and split at the profile's
// SM step; without one, the cost model's cut and the fixed split; one chunk is never cut.
TEST(NanoSearch, PlanNanoStepTakesTheProfileWhenThereIsOne) {
  cuda::NanoProfile p = h100_like(33);
  p.sm_step = 8;
  const std::vector<cuda::ChunkWork> step = decodes_then_prompt(256, 4096, 4096);
  const cuda::NanoPlan searched = cuda::autosearch(step, p, 8);
  ASSERT_GT(searched.cut, 0);
  const cuda::NanoCost cost{.gemm_seconds_per_token = 2e-5,
                            .weight_seconds = 7.3e-3,
                            .kv_seconds_per_token = 5e-8,
                            .interference = 0.5};
  const cuda::NanoStepPlan planned = cuda::plan_nano_step(step, &p, cost, 64, false);
  EXPECT_EQ(planned.cut, searched.cut);
  EXPECT_EQ(planned.green_gemm_sms, searched.gemm_sms);
  EXPECT_EQ(planned.green_gemm_sms % 8, 0);

  const cuda::NanoSplit modelled = cuda::choose_nano_split(step, cost);
  const cuda::NanoStepPlan fixed = cuda::plan_nano_step(step, nullptr, cost, 64, false);
  EXPECT_EQ(fixed.cut, modelled.cut);
  EXPECT_EQ(fixed.green_gemm_sms, modelled.cut > 0 ? 64 : 0);
  EXPECT_EQ(cuda::plan_nano_step(step, nullptr, cost, 0, false).green_gemm_sms, 0);

  // Where no cut pays (every phase in proportion to its SMs), auto runs the step whole and
  // always cuts it anyway.
  p.attention = sampled(132, [](double reads, int32_t s) { return reads * 2e-9 * 132 / s; });
  const std::vector<cuda::ChunkWork> decodes = decodes_then_prompt(64, 2048, 0);
  EXPECT_EQ(cuda::plan_nano_step(decodes, &p, cost, 0, false).cut, 0);
  const cuda::NanoStepPlan always = cuda::plan_nano_step(decodes, &p, cost, 0, true);
  EXPECT_GT(always.cut, 0);
  EXPECT_GT(always.green_gemm_sms, 0);
  EXPECT_EQ(cuda::plan_nano_step(decodes_then_prompt(1, 64, 0), &p, cost, 0, true).cut, 0);
}

// What `blend profile --nano` times: every split at the SM step, and as many decode sizes as
// the KV cache holds (each sequence its own pages), refused below two.
TEST(NanoSearch, ProfileGridFollowsTheSmStepAndTheKvCache) {
  const cuda::NanoGrid grid = cuda::nano_profile_grid(132, 8, 64 * 1040, 16);
  EXPECT_EQ(grid.gemm_sms.front(), 8);
  EXPECT_EQ(grid.gemm_sms.back(), 128);
  EXPECT_EQ(grid.gemm_sms.size(), 16u);
  EXPECT_EQ(grid.decode_sequences, (std::vector<int32_t>{4, 16, 64}));  // 64 x 65 pages fit
  EXPECT_EQ(grid.pages_needed(16), 64 * 65);
  EXPECT_GE(grid.gemm_tokens.size(), 4u);
  EXPECT_TRUE(std::is_sorted(grid.gemm_tokens.begin(), grid.gemm_tokens.end()));
  EXPECT_EQ(cuda::nano_profile_grid(132, 8, int64_t{1} << 40, 16).decode_sequences.back(), 1024);
  EXPECT_THROW(cuda::nano_profile_grid(132, 8, 16 * 1040 - 1, 16), Error);  // 16 x 65 pages
  EXPECT_THROW(cuda::nano_profile_grid(132, 0, int64_t{1} << 40, 16), Error);
  EXPECT_THROW(cuda::nano_profile_grid(132, 67, int64_t{1} << 40, 16), Error);
}

// Over every cut: the decodes and the prompt on different lanes, a pipeline that beats the
// whole step, and at most min_ratio of it.
TEST(NanoSearch, AutosearchCutsBetweenDecodesAndPromptForAGain) {
  const cuda::NanoProfile p = h100_like(33);
  const std::vector<cuda::ChunkWork> step = decodes_then_prompt(256, 4096, 4096);
  const cuda::NanoPlan plan = cuda::autosearch(step, p, 3);
  EXPECT_EQ(plan.cut, 256);
  EXPECT_LT(plan.seconds, 0.95 * plan.sequential_s);
  for (int32_t c : {1, 128, 255}) {  // other cuts, each at its own best split, are slower
    double xt = 0, xr = 0, yt = 0, yr = 0;
    for (size_t i = 0; i < step.size(); ++i) {
      const double r = cuda::nano_attention_reads(step[i], p.prefill_kv_tile);
      (static_cast<int32_t>(i) < c ? xt : yt) += step[i].tokens;
      (static_cast<int32_t>(i) < c ? xr : yr) += r;
    }
    EXPECT_GE(cuda::search_sm_split(p, xt, xr, yt, yr, 3).seconds, plan.seconds) << c;
  }
  // With few cuts tried, the one between the decodes and the prompt is still among them.
  EXPECT_EQ(cuda::autosearch(step, p, 3, 0.95, /*max_even_cuts=*/4).cut, 256);
  // One chunk cannot be cut.
  EXPECT_EQ(cuda::autosearch(decodes_then_prompt(0, 0, 4096), p, 3).cut, 0);
}

// NanoFlow's premise: overlap pays because a memory-bound kernel needs few SMs. Where every
// phase slows in proportion to the SMs it loses, no split of the SMs beats the whole step.
TEST(NanoSearch, WithoutTheNonLinearityNoPlanBeatsTheWholeStep) {
  cuda::NanoProfile p = h100_like(33);
  p.attention = sampled(132, [](double reads, int32_t s) { return reads * 2e-9 * 132 / s; });
  for (int decodes : {8, 256})
    for (int prompt : {0, 512, 4096}) {
      const std::vector<cuda::ChunkWork> step = decodes_then_prompt(decodes, 2048, prompt);
      const cuda::NanoPlan plan = cuda::autosearch(step, p, 3, /*min_ratio=*/1.0);
      EXPECT_EQ(plan.cut, 0) << decodes << " decodes, prompt " << prompt;
      EXPECT_DOUBLE_EQ(plan.seconds, plan.sequential_s);
    }
}

TEST(NanoSearch, ProfileFileRoundTripsAndBadOnesAreRefused) {
  const cuda::NanoProfile p = h100_like(33, 32);
  const nlohmann::json j = cuda::nano_profile_to_json(p);
  const cuda::NanoProfile back = cuda::nano_profile_from_json(j);
  EXPECT_EQ(back.total_sms, 132);
  EXPECT_EQ(back.layers, 32);
  EXPECT_EQ(back.gemm.seconds, p.gemm.seconds);
  EXPECT_EQ(back.attention.sms, p.attention.sms);

  auto refused = [&](auto edit) {
    nlohmann::json bad = j;
    edit(bad);
    EXPECT_THROW(cuda::nano_profile_from_json(bad), Error) << bad.dump().substr(0, 80);
  };
  refused([](nlohmann::json& b) { b.erase("gemm"); });
  refused([](nlohmann::json& b) { b["layers"] = 0; });
  refused([](nlohmann::json& b) { b["attention"]["seconds"].erase(0); });
  refused([](nlohmann::json& b) { b["gemm"]["work"][1] = 0.5; });  // not ascending
  refused([](nlohmann::json& b) { b["gemm"]["sms"] = nlohmann::json::array(); });
  refused([](nlohmann::json& b) { b["attention"]["seconds"][3] = -1; });
  refused([](nlohmann::json& b) { b["total_sms"] = "132"; });
  refused([](nlohmann::json& b) { b["sm_step"] = 0; });
  refused([](nlohmann::json& b) { b["sm_step"] = 67; });
  EXPECT_THROW(cuda::search_sm_split(p, 1, 1, 1, 1, 0), Error);
  nlohmann::json stepped = j;
  stepped["sm_step"] = 8;
  EXPECT_EQ(cuda::nano_profile_from_json(stepped).sm_step, 8);
  EXPECT_EQ(back.sm_step, 1);
}

// A profile file is this GPU's and this model's, or refused naming the file.
TEST(NanoSearch, LoadNanoProfileRefusesAnotherGpusOrModels) {
  const std::string path = ::testing::TempDir() + "/nano_profile_test.json";
  {
    std::ofstream out(path);
    out << cuda::nano_profile_to_json(h100_like(33, 32)).dump();
  }
  EXPECT_EQ(cuda::load_nano_profile(path, 132, 32).gemm.sms.size(), 132u);
  for (auto [sms, layers] : {std::pair{114, 32}, std::pair{132, 80}}) {
    try {
      cuda::load_nano_profile(path, sms, layers);
      ADD_FAILURE() << sms << " SMs, " << layers << " layers accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  {
    std::ofstream out(path);
    out << "{\"total_sms\": 132,";
  }
  EXPECT_THROW(cuda::load_nano_profile(path, 132, 32), Error);
  EXPECT_THROW(cuda::load_nano_profile(path + ".missing", 132, 32), Error);
}

}  // namespace
}  // namespace blend
