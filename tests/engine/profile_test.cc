// The profiler recovers a machine's compute rate, bandwidth and step overhead from step timings:
// here a fake backend whose steps take exactly what a known cost model says, on a fake clock.
#include "engine/profile.h"

#include <gtest/gtest.h>

#include "model/presets.h"

namespace blend {
namespace {

class TimedFakeBackend : public Backend {
 public:
  TimedFakeBackend(const ModelConfig& c, const CostModel& truth, double* clock)
      : config_(c), truth_(truth), clock_(clock) {}
  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "fake"; }
  int64_t kv_bytes_per_page() const override { return 4096; }
  int64_t num_pages() const override { return 1 << 16; }
  void forward(const ForwardBatch& b, std::span<float>) override {
    StepShape s;
    s.logit_rows = b.num_logit_rows();
    for (const SeqChunk& c : b.chunks) {
      if (c.num_tokens == 1 && c.num_cached > 0) {
        ++s.decode_tokens;
        s.decode_context_tokens += c.num_cached + 1;
      } else {
        s.prefill_tokens += c.num_tokens;
        s.prefill_attention_pairs += int64_t{c.num_tokens} * (c.num_cached + c.num_tokens);
      }
    }
    *clock_ += truth_.estimate_step(s).sequential();
  }
  void copy_page(PageId, PageId) override {}
  void read_pages(std::span<const PageId>, std::byte*) const override {}
  void write_pages(std::span<const PageId>, const std::byte*) override {}
  void read_slots(PageId, int32_t, int32_t, std::byte*) const override {}
  void write_slots(PageId, int32_t, int32_t, const std::byte*) override {}

 private:
  ModelConfig config_;
  const CostModel& truth_;
  double* clock_;
};

TEST(Profile, RecoversComputeAttentionBandwidthAndOverhead) {
  const ModelConfig config = *find_model_preset("smollm-135m");
  const ModelShape shape = ModelShape::from_config(config, "smollm-135m");
  Hardware truth_hw;
  truth_hw.name = "truth";
  truth_hw.compute_flops = 700e9;
  truth_hw.memory_bandwidth = 20e9;
  truth_hw.network_bandwidth = 1;
  truth_hw.memory_bytes = 1;
  truth_hw.attention_efficiency = 0.4;  // prefill attention at 280 GFLOP/s
  truth_hw.step_overhead_seconds = 0.002;
  const CostModel truth(shape, truth_hw);
  double clock = 0;
  TimedFakeBackend backend(config, truth, &clock);
  ProfileOptions o;
  o.clock = [&clock] { return clock; };
  const BackendProfile p = profile_backend(backend, shape, o);
  EXPECT_GE(p.points.size(), 10u);
  EXPECT_NEAR(p.hardware.compute_flops / 700e9, 1.0, 1e-6);
  EXPECT_NEAR(p.hardware.attention_efficiency, 0.4, 1e-6);
  EXPECT_NEAR(p.hardware.memory_bandwidth / 20e9, 1.0, 1e-6);
  EXPECT_NEAR(p.hardware.step_overhead_seconds, 0.002, 1e-9);
  EXPECT_LT(p.max_abs_error, 1e-6);
  // BROS's decode model: time grows with the sequences and with the context read.
  EXPECT_GT(p.iteration.decode_per_token, 0);
  EXPECT_GT(p.iteration.decode_per_context_token, 0);
  EXPECT_GT(p.iteration.prefill_per_token, 0);
}

}  // namespace
}  // namespace blend
