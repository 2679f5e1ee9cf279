// The profiler recovers a machine's compute rate, bandwidth and step overhead from step timings:
// here a fake backend whose steps take exactly what a known cost model says, on a fake clock.
#include "harness/profile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "backend/sim/sim_backend.h"
#include "core/error.h"
#include "model/presets.h"
#include "test_util.h"

namespace blend {
namespace {

class TimedFakeBackend : public Backend {
 public:
  TimedFakeBackend(const ModelConfig& c, const CostModel& truth, double* clock)
      : config_(c), truth_(truth), clock_(clock) {}
  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "fake"; }
  DType compute_dtype() const override { return config_.dtype; }
  int64_t kv_bytes_per_page() const override { return 4096; }
  int64_t num_pages() const override { return 1 << 16; }
  void allocate_kv(int64_t) override {}
  void forward(const ForwardBatch& b, std::span<float>) override {
    *clock_ += truth_.estimate_step(step_shape(b)).sequential() +
               download_per_row_ * static_cast<double>(b.num_logit_rows());
  }
  // With a device argmax (download_per_row > 0): the step without moving its logits.
  bool forward_argmax(const ForwardBatch& b, std::span<TokenId>) override {
    if (download_per_row_ == 0) return false;
    *clock_ += truth_.estimate_step(step_shape(b)).sequential();
    return true;
  }
  void set_download_per_row(double seconds) { download_per_row_ = seconds; }
  void copy_page(PageId, PageId) override {}
  void read_pages(std::span<const PageId>, std::byte*) const override {}
  void write_pages(std::span<const PageId>, const std::byte*) override {}
  void read_slots(PageId, int32_t, int32_t, std::byte*) const override {}
  // A restore: 2 us per page of slots written back.
  void write_slots(PageId, int32_t, int32_t, const std::byte*) override { *clock_ += 2e-6; }

 private:
  ModelConfig config_;
  const CostModel& truth_;
  double* clock_;
  double download_per_row_ = 0;
};

// The machine the fits must recover.
Hardware truth_hardware() {
  Hardware h;
  h.name = "truth";
  h.compute_flops = 700e9;
  h.memory_bandwidth = 20e9;
  h.network_bandwidth = 1;
  h.memory_bytes = 1;
  h.attention_efficiency = 0.4;  // prefill attention at 280 GFLOP/s
  h.step_overhead_seconds = 0.002;
  return h;
}

// `blend profile` of smollm-135m's shape on a fake backend whose steps take what `truth_hw`
// says, on a fake clock; `download_per_row` > 0 gives it a device argmax.
BackendProfile profile_of(const Hardware& truth_hw, double download_per_row = 0) {
  const ModelConfig config = *find_model_preset("smollm-135m");
  const ModelShape shape = ModelShape::from_config(config, "smollm-135m");
  const CostModel truth(shape, truth_hw);
  double clock = 0;
  TimedFakeBackend backend(config, truth, &clock);
  backend.set_download_per_row(download_per_row);
  ProfileOptions o;
  o.clock = [&clock] { return clock; };
  return profile_backend(backend, shape, o);
}

TEST(Profile, RecoversComputeAttentionBandwidthAndOverhead) {
  const BackendProfile p = profile_of(truth_hardware());
  EXPECT_GE(p.points.size(), 10u);
  EXPECT_NEAR(p.hardware.compute_flops / 700e9, 1.0, 1e-6);
  EXPECT_NEAR(p.hardware.attention_efficiency, 0.4, 1e-6);
  EXPECT_NEAR(p.hardware.memory_bandwidth / 20e9, 1.0, 1e-6);
  EXPECT_NEAR(p.hardware.step_overhead_seconds, 0.002, 1e-9);
  EXPECT_LT(p.max_abs_error, 1e-6);
  EXPECT_FALSE(p.hardware.gemm_roofline);  // a CPU-like machine: the sum fits exactly
  EXPECT_FALSE(p.hardware.device_argmax);
  EXPECT_EQ(p.hardware.dense_row_tile, 1);  // every step size as fast
  // BROS's decode model: time grows with the sequences and with the context read.
  EXPECT_GT(p.iteration.decode_per_token, 0);
  EXPECT_GT(p.iteration.decode_per_context_token, 0);
  EXPECT_GT(p.iteration.prefill_per_token, 0);
  // The swap line: restores timed page by page.
  EXPECT_NEAR(p.iteration.swap_per_page, 2e-6, 1e-12);
  EXPECT_NEAR(p.iteration.swap_base, 0.0, 1e-12);
}

// A GPU: its GEMMs read their weights while they compute (small steps weight-bound, large ones
// compute-bound), decode attention reads the KV at a rate of its own with a fixed cost per
// sequence, and plain-greedy steps take their argmax on the device. The profile must find the
// roofline form and its rates, time the points the way the engine runs greedy steps, and charge
// the logits' download to the rows that leave the device.
TEST(Profile, RecoversTheRooflineFormAndTheDeviceArgmaxOfAGpu) {
  Hardware truth_hw = truth_hardware();
  truth_hw.compute_flops = 10e12;  // 64 prompt tokens weight-bound, 1,024 compute-bound
  truth_hw.gemm_roofline = true;
  truth_hw.kv_bandwidth = 40e9;
  truth_hw.per_decode_seconds = 20e-6;
  const BackendProfile p = profile_of(truth_hw, 30e-6);
  const Hardware& h = p.hardware;
  EXPECT_TRUE(h.gemm_roofline);
  EXPECT_NEAR(h.compute_flops / 10e12, 1.0, 1e-6);
  EXPECT_NEAR(h.attention_efficiency, 0.4, 1e-6);
  EXPECT_NEAR(h.memory_bandwidth / 20e9, 1.0, 1e-6);
  EXPECT_NEAR(h.kv_bandwidth / 40e9, 1.0, 1e-6);
  EXPECT_NEAR(h.per_decode_seconds, 20e-6, 1e-10);
  EXPECT_NEAR(h.step_overhead_seconds, 0.002, 1e-9);
  EXPECT_LT(p.max_abs_error, 1e-6);
  EXPECT_TRUE(h.device_argmax);
  // The fake clock does not move while the host samples: the download alone.
  EXPECT_NEAR(h.per_logit_row_seconds, 30e-6, 1e-10);
}

// NanoFlow §4.2: a machine whose GEMMs compute tiles of 64, 128 or 512 rows past one tile. The
// scan of step sizes must find the tile, and the fit of the other points must keep its rates
// exact with it (a fit without the tile would charge 1,025 tokens as 1,025 rows, not 1,152).
TEST(Profile, FindsTheGemmRowTile) {
  for (const int64_t tile : {int64_t{64}, int64_t{128}, int64_t{512}}) {
    Hardware truth_hw = truth_hardware();
    truth_hw.dense_row_tile = tile;
    const BackendProfile p = profile_of(truth_hw);
    EXPECT_EQ(p.hardware.dense_row_tile, tile);
    EXPECT_NEAR(p.hardware.compute_flops / 700e9, 1.0, 1e-6) << tile;
    EXPECT_NEAR(p.hardware.step_overhead_seconds, 0.002, 1e-9) << tile;
    EXPECT_LT(p.max_abs_error, 1e-6) << tile;
    int64_t scanned = 0;
    for (const ProfilePoint& q : p.points) scanned += q.kind == "dense" ? 1 : 0;
    EXPECT_GE(scanned, 14) << tile;
  }
}

// The tile's fit on the sizes a profile scans, under 3% noise (about half a 64-row tile's jump
// at these sizes): a staircase of 64-row tiles is found in all but at most 2.5% of the draws
// (199 of these 200; the other found a divisor, whose cuts cost little), never a larger tile; a
// line shows a tile in at most 2.5% of them (4 of these 200); fewer than 4 sizes show none.
TEST(Profile, FitsTheRowTileThroughNoise) {
  const ProfileOptions o;  // the sizes a profile scans
  const std::vector<int64_t>& candidates = o.row_tile_candidates;
  std::vector<int64_t> sizes;
  for (const int64_t anchor : o.dense_scan_anchors)
    for (const int64_t c : candidates)
      for (const int64_t n : {anchor, anchor + 1, anchor + c, anchor + c + 1}) sizes.push_back(n);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  int missed_tiles = 0, false_tiles = 0;
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> noise(0.97, 1.03);
    std::vector<std::pair<int64_t, double>> stairs, line;
    for (const int64_t n : sizes) {
      stairs.emplace_back(n, (0.5 + 0.01 * static_cast<double>((n + 63) / 64 * 64)) * noise(rng));
      line.emplace_back(n, (0.5 + 0.01 * static_cast<double>(n)) * noise(rng));
    }
    const int64_t found = fit_row_tile(stairs, candidates);
    EXPECT_EQ(64 % found, 0) << seed << ": " << found;
    missed_tiles += found != 64 ? 1 : 0;
    false_tiles += fit_row_tile(line, candidates) != 1 ? 1 : 0;
  }
  EXPECT_LE(missed_tiles, 5);
  EXPECT_LE(false_tiles, 5);
  EXPECT_EQ(fit_row_tile({{512, 1.0}, {513, 2.0}, {640, 2.0}}, candidates), 1);
}

// `blend profile --steps`: the cost model fitted on an engine run's own steps. The run's
// backend takes what a known cost model says per forward pass, and the host loses 0.5 ms of
// virtual time between steps (admission, results): the fit must charge that to the steps'
// overhead, which it can only do if each step is timed from its start to the next one's.
TEST(Profile, FitsTheStepsOfAnEngineRunHostWorkIncluded) {
  const ModelConfig config = *find_model_preset("smollm-135m");
  const ModelShape shape = ModelShape::from_config(config, "smollm-135m");
  Hardware truth_hw = truth_hardware();
  truth_hw.per_logit_row_seconds = 50e-6;
  const CostModel truth(shape, truth_hw);
  auto owned = std::make_unique<SimBackend>(
      config, SimBackendOptions{.num_pages = 8192, .kv_bytes_per_page = 4096},
      [&truth](const ForwardBatch& b, bool) {
        SimStepTime t;
        t.total = truth.estimate_step(step_shape(b)).sequential();
        return t;
      });
  SimBackend* sim = owned.get();
  EngineOptions o;
  o.scheduler.max_batch_tokens = 512;
  Engine engine(std::move(owned), o);
  StepRecorder recorder(engine);
  std::mt19937 rng(5);
  for (int i = 0; i < 60; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    const int len = i % 2 ? 20 + static_cast<int>(rng() % 60) : 200 + static_cast<int>(rng() % 600);
    for (int k = 0; k < len; ++k) r.prompt.push_back(static_cast<TokenId>(100 + (rng() % 30000)));
    r.params.max_tokens = i % 2 ? 40 + static_cast<int32_t>(rng() % 120) : 4;
    r.params.ignore_eos = true;
    engine.submit(std::move(r), [](GenerationResult&&) {});
  }
  constexpr double kHostSeconds = 0.0005;
  while (engine.has_work()) {
    engine.step();
    sim->advance_to(engine.clock_seconds() + kHostSeconds);
  }
  const std::vector<MeasuredStep> steps = recorder.steps(engine.clock_seconds());
  ASSERT_EQ(static_cast<int64_t>(steps.size()), engine.stats().steps);
  int64_t tokens = 0;
  for (const MeasuredStep& m : steps) tokens += m.shape.prefill_tokens + m.shape.decode_tokens;
  EXPECT_EQ(tokens, engine.stats().batch_tokens);

  const HardwareFit fit = fit_hardware(shape, steps, truth_hw.per_logit_row_seconds);
  EXPECT_NEAR(fit.hardware.compute_flops / 700e9, 1.0, 1e-6);
  EXPECT_NEAR(fit.hardware.attention_efficiency, 0.4, 1e-6);
  EXPECT_NEAR(fit.hardware.memory_bandwidth / 20e9, 1.0, 1e-6);
  EXPECT_NEAR(fit.hardware.step_overhead_seconds, 0.002 + kHostSeconds, 1e-9);
  EXPECT_LT(fit.max_abs_error, 1e-6);
  EXPECT_NEAR(fit.total_error, 0.0, 1e-9);
}

TEST(Profile, StepTimingsRoundTripAndRejectsBadLines) {
  testing::TempDir dir;
  std::vector<MeasuredStep> steps(2);
  steps[0].shape = {.prefill_tokens = 300, .prefill_attention_pairs = 90000, .logit_rows = 1};
  steps[0].seconds = 0.25;
  steps[1].shape = {.decode_tokens = 7, .decode_context_tokens = 900, .logit_rows = 7};
  steps[1].seconds = 0.0125;
  write_step_timings((dir / "t.jsonl").string(), steps);
  const std::vector<MeasuredStep> back = read_step_timings((dir / "t.jsonl").string());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].shape.prefill_attention_pairs, 90000);
  EXPECT_EQ(back[1].shape.decode_context_tokens, 900);
  EXPECT_EQ(back[1].shape.logit_rows, 7);
  EXPECT_DOUBLE_EQ(back[1].seconds, 0.0125);
  testing::write_file(dir / "bad.jsonl",
                      testing::read_file(dir / "t.jsonl") + R"({"prefill_tokens":3})" + "\n");
  try {
    read_step_timings((dir / "bad.jsonl").string());
    FAIL() << "a line without the step's fields was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fit_hardware(ModelShape::from_config(*find_model_preset("tiny"), "tiny"), steps, 0),
               Error);  // two steps cannot fit four coefficients
}

}  // namespace
}  // namespace blend
