// Hardware presets and profiles, model shapes, and the §4.1 / eq. 7 formulas of the cost model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "cost/cost_model.h"
#include "model/presets.h"

namespace blend {
namespace {

TEST(Hardware, PresetsFollowNanoFlowTable1) {
  for (const std::string& name : hardware_preset_names()) {
    const auto h = find_hardware_preset(name);
    ASSERT_TRUE(h) << name;
    EXPECT_NO_THROW(h->validate());
  }
  const Hardware a100 = *find_hardware_preset("a100-80g");
  EXPECT_DOUBLE_EQ(a100.compute_flops / a100.memory_bandwidth, 156);  // Table 1 ratio
  EXPECT_FALSE(find_hardware_preset("tpu"));
  // The Hopper presets keep Table 1's peaks and carry what was measured on them: below-peak
  // rates and a worse overlap than the A100's assumption, so a step costs more than the
  // datasheet alone would say.
  const ModelShape shape = *find_model_shape_preset("llama-3-8b");
  for (const char* name : {"h100", "h200"}) {
    const Hardware measured = *find_hardware_preset(name);
    Hardware datasheet = measured;
    datasheet.compute_efficiency = datasheet.bandwidth_efficiency = 1.0;
    datasheet.overlap_interference = a100.overlap_interference;
    EXPECT_DOUBLE_EQ(measured.compute_flops, 989e12) << name;
    StepShape step;
    step.prefill_tokens = 1024;
    step.decode_tokens = 256;
    step.decode_context_tokens = 256 * 2048;
    const StepCost slow = CostModel(shape, measured).estimate_step(step);
    const StepCost fast = CostModel(shape, datasheet).estimate_step(step);
    EXPECT_GT(slow.compute_seconds, fast.compute_seconds) << name;
    EXPECT_GT(slow.memory_seconds, fast.memory_seconds) << name;
    EXPECT_GT(slow.overlapped() / fast.overlapped(), slow.sequential() / fast.sequential())
        << name << ": the measured interference makes overlap gain less";
  }
}

TEST(Hardware, ProfileRoundTripsAndRejectsBadFields) {
  Hardware h = *find_hardware_preset("h200");
  h.compute_efficiency = 0.7;
  h.step_overhead_seconds = 0.002;
  h.overlap_interference = 0.3;
  const Hardware back = Hardware::from_json(h.to_json());
  EXPECT_DOUBLE_EQ(back.overlap_interference, 0.3);
  EXPECT_DOUBLE_EQ(back.compute_flops, h.compute_flops);
  EXPECT_DOUBLE_EQ(back.memory_bytes, h.memory_bytes);
  EXPECT_DOUBLE_EQ(back.compute_efficiency, 0.7);
  EXPECT_DOUBLE_EQ(back.step_overhead_seconds, 0.002);
  nlohmann::json bad = h.to_json();
  bad["memory_bandwidth_gb_s"] = -1;
  EXPECT_THROW(Hardware::from_json(bad), Error);
  bad.erase("memory_bandwidth_gb_s");
  EXPECT_THROW(Hardware::from_json(bad), Error);
  nlohmann::json bad_fit = h.to_json();
  bad_fit["fit"]["overlap_interference"] = 1.5;
  EXPECT_THROW(Hardware::from_json(bad_fit), Error);
  EXPECT_THROW(resolve_hardware("/nonexistent/profile.json"), Error);
  // The GPU form's fields round-trip; a profile without them keeps the sum form.
  h.gemm_roofline = true;
  h.kv_bandwidth = 2.5e12;
  h.per_decode_seconds = 1.5e-5;
  h.device_argmax = true;
  const Hardware gpu = Hardware::from_json(h.to_json());
  EXPECT_TRUE(gpu.gemm_roofline);
  EXPECT_DOUBLE_EQ(gpu.kv_bandwidth, 2.5e12);
  EXPECT_DOUBLE_EQ(gpu.per_decode_seconds, 1.5e-5);
  EXPECT_TRUE(gpu.device_argmax);
  nlohmann::json old = h.to_json();
  for (const char* key :
       {"gemm_roofline", "kv_bandwidth_gb_s", "per_decode_seconds", "device_argmax"})
    old["fit"].erase(key);
  const Hardware before = Hardware::from_json(old);
  EXPECT_FALSE(before.gemm_roofline);
  EXPECT_FALSE(before.device_argmax);
  EXPECT_EQ(before.kv_bandwidth, 0);
  nlohmann::json bad_kv = h.to_json();
  bad_kv["fit"]["kv_bandwidth_gb_s"] = -1;
  EXPECT_THROW(Hardware::from_json(bad_kv), Error);
  // The GEMMs' row tile: round-trips, 1 when absent, whole and positive or refused.
  h.dense_row_tile = 128;
  EXPECT_EQ(Hardware::from_json(h.to_json()).dense_row_tile, 128);
  EXPECT_EQ(before.dense_row_tile, 1);
  for (const nlohmann::json& tile :
       {nlohmann::json(0), nlohmann::json(64.5), nlohmann::json("64")}) {
    nlohmann::json bad_tile = h.to_json();
    bad_tile["fit"]["dense_row_tile"] = tile;
    EXPECT_THROW(Hardware::from_json(bad_tile), Error) << tile;
  }
}

// A GPU-sized machine: 800 TFLOP/s, 2 TB/s, nothing else fitted.
Hardware gpu_hardware() {
  Hardware h;
  h.name = "gpu";
  h.compute_flops = 800e12;
  h.memory_bandwidth = 2e12;
  h.network_bandwidth = h.memory_bytes = 1;
  return h;
}

// NanoFlow §4.2: past one tile, a GEMM pays for whole tiles of rows; below one it pays for its
// rows (the library picks a smaller tile).
TEST(CostModel, GemmRowsPastATileCostWholeTiles) {
  const ModelShape shape = *find_model_shape_preset("llama-3-8b");
  const Hardware h = gpu_hardware();
  Hardware tiled = h;
  tiled.dense_row_tile = 256;
  const CostModel plain(shape, h), tiles(shape, tiled);
  auto compute = [](const CostModel& m, int64_t prompt_tokens, int64_t rows) {
    return m.estimate_step({.prefill_tokens = prompt_tokens, .logit_rows = rows}).compute_seconds;
  };
  EXPECT_DOUBLE_EQ(compute(tiles, 513, 1), compute(plain, 768, 1));
  EXPECT_DOUBLE_EQ(compute(tiles, 768, 1), compute(plain, 768, 1));
  EXPECT_DOUBLE_EQ(compute(tiles, 200, 1), compute(plain, 200, 1));
  EXPECT_GT(compute(tiles, 513, 1), compute(tiles, 512, 1) * 1.4);
  // The lm_head's rows likewise: 300 rows cost what 512 do.
  const double head = compute(tiles, 1024, 300) - compute(tiles, 1024, 1);
  EXPECT_DOUBLE_EQ(head, compute(plain, 1024, 512) - compute(plain, 1024, 1));
}

TEST(ModelShape, PresetsIncludeShapeOnlyModels) {
  for (const char* name : {"llama-3-8b", "llama-3-70b", "qwen2.5-7b", "llama-2-7b", "qwen2.5-72b",
                           "deepseek-67b", "opt-13b", "opt-30b"}) {
    const auto s = find_model_shape_preset(name);
    ASSERT_TRUE(s) << name;
    EXPECT_GT(s->matmul_parameters, 0);
  }
  const ModelShape llama = *find_model_shape_preset("llama-3-8b");
  EXPECT_EQ(llama.kv_dim, 8 * 128);
  EXPECT_NEAR(static_cast<double>(llama.weight_bytes) / 2e9, 8.03, 0.05);  // 8.03B parameters
  const ModelShape opt = *find_model_shape_preset("opt-13b");
  EXPECT_NEAR(static_cast<double>(opt.weight_bytes) / 2e9, 12.9, 0.3);
  EXPECT_THROW(find_model_shape_preset("llama-3-8b", 0), Error);
}

TEST(CostModel, RequestFormulasOfSection4_1) {
  const ModelShape s = *find_model_shape_preset("llama-3-8b");
  const Hardware h = *find_hardware_preset("a100-80g");
  const CostModel cost(s, h);
  const double p = 1000, d = 200;
  const double comp = (2 * (p + d) * static_cast<double>(s.matmul_parameters) +
                       4 * p * p * static_cast<double>(s.hidden_size * s.num_layers)) /
                      h.compute_flops;
  const double mem =
      (p * d + d * d / 2) * static_cast<double>(s.kv_dim * s.num_layers * 4) / h.memory_bandwidth;
  EXPECT_DOUBLE_EQ(cost.request_compute_seconds(p, d), comp);
  EXPECT_DOUBLE_EQ(cost.request_memory_seconds(p, d), mem);
  EXPECT_DOUBLE_EQ(cost.request_density(p, d), comp / mem);
  // Longer outputs make a request memory-intensive.
  EXPECT_GT(cost.request_density(1000, 10), 1);
  EXPECT_LT(cost.request_density(100, 16000), 1);
  EXPECT_DOUBLE_EQ(CostModel::node_density(0.25, 4, 2), 1.5);
}

// Qwen3-0.6B's query heads are twice as wide as its residual stream: attention FLOPs scale with
// heads x head_dim (2048), the dense GEMMs with its parameters, the KV with its 8 x 128.
TEST(CostModel, AttentionScalesWithTheQueryHeadsWidth) {
  const ModelShape s = ModelShape::from_config(*find_model_shape("qwen3-0.6b"), "qwen3-0.6b");
  EXPECT_EQ(s.hidden_size, 1024);
  EXPECT_EQ(s.attention_width(), 2048);
  EXPECT_EQ(s.kv_dim, 8 * 128);
  const Hardware h = *find_hardware_preset("a100-80g");
  const CostModel cost(s, h);
  const double p = 1000, d = 200;
  const double comp = (2 * (p + d) * static_cast<double>(s.matmul_parameters) +
                       4 * p * p * 2048.0 * static_cast<double>(s.num_layers)) /
                      h.compute_flops;
  EXPECT_DOUBLE_EQ(cost.request_compute_seconds(p, d), comp);
  // Where head_dim is H / heads (every Llama preset) the width is H.
  EXPECT_EQ(find_model_shape_preset("llama-3-8b")->attention_width(), 4096);
}

TEST(CostModel, BatchDensityConvergesToRequestDensity) {
  const CostModel cost(*find_model_shape_preset("llama-3-8b"), *find_hardware_preset("a100-80g"));
  // §4.2: independent of the KV memory, and rho(r) once prefill attention is negligible.
  for (double d : {4.0, 64.0, 1024.0}) {
    const double p = 8;
    EXPECT_NEAR(cost.batch_density(p, d) / cost.request_density(p, d), 1.0, 1e-3) << d;
    EXPECT_NEAR(cost.batch_compute_seconds(2e9, p, d) / cost.batch_memory_seconds(2e9),
                cost.batch_density(p, d), 1e-9 * cost.batch_density(p, d));
  }
  // Prefill attention makes long prompts denser per request than the batch formula says.
  EXPECT_GT(cost.request_density(8000, 64), cost.batch_density(8000, 64));
}

TEST(CostModel, StepCostAndTensorParallelNetworkTerm) {
  Hardware h = *find_hardware_preset("a100-80g");
  h.overlap_interference = 0;  // perfect overlap first; the interference term below
  const CostModel one(*find_model_shape_preset("llama-3-70b", 1), h);
  const CostModel four(*find_model_shape_preset("llama-3-70b", 4), h);
  StepShape step;
  step.prefill_tokens = 1024;
  step.decode_tokens = 256;
  step.decode_context_tokens = 256 * 1500;
  const StepCost c1 = one.estimate_step(step), c4 = four.estimate_step(step);
  EXPECT_EQ(c1.network_seconds, 0);
  EXPECT_NEAR(c4.compute_seconds, c1.compute_seconds / 4, 1e-12);
  EXPECT_NEAR(c4.memory_seconds, c1.memory_seconds / 4, 1e-12);
  const ModelShape& s = four.shape();
  EXPECT_DOUBLE_EQ(c4.network_seconds, 4.0 * 1280 * static_cast<double>(s.hidden_size) * 2 *
                                           static_cast<double>(s.num_layers) / h.network_bandwidth);
  EXPECT_DOUBLE_EQ(c1.sequential(), c1.compute_seconds + c1.memory_seconds);
  EXPECT_DOUBLE_EQ(c1.overlapped(), std::max(c1.compute_seconds, c1.memory_seconds));
  // With interference i the shorter part adds i times its own time.
  Hardware interfering = h;
  interfering.overlap_interference = 0.2;
  const StepCost ci = CostModel(one.shape(), interfering).estimate_step(step);
  EXPECT_DOUBLE_EQ(ci.overlapped(), std::max(c1.compute_seconds, c1.memory_seconds) +
                                        0.2 * std::min(c1.compute_seconds, c1.memory_seconds));
  EXPECT_LT(ci.overlapped(), ci.sequential());
  // More decode context, more memory time; compute unchanged.
  step.decode_context_tokens *= 2;
  const StepCost more = one.estimate_step(step);
  EXPECT_GT(more.memory_seconds, c1.memory_seconds);
  EXPECT_DOUBLE_EQ(more.compute_seconds, c1.compute_seconds);
}

// The GPU form: the dense GEMMs cost the longer of their compute and their weight read, the KV
// its own rate, each decode sequence a fixed cost; plain-greedy rows on a device-argmax machine
// cost no host time.
TEST(CostModel, RooflineStepsAndRowsSampledOnTheDevice) {
  const ModelShape shape = *find_model_shape_preset("llama-3-8b");
  Hardware h = gpu_hardware();
  h.per_logit_row_seconds = 50e-6;
  Hardware roof = h;
  roof.gemm_roofline = true;
  roof.kv_bandwidth = 1e12;
  roof.per_decode_seconds = 10e-6;
  roof.device_argmax = true;
  const CostModel sum_model(shape, h), roof_model(shape, roof);
  const double weights = static_cast<double>(shape.weight_bytes) / 2e12;
  const double dense_per_token =
      2.0 * static_cast<double>(shape.matmul_parameters - shape.lm_head_parameters) / 800e12;
  const double lm_head_row = 2.0 * static_cast<double>(shape.lm_head_parameters) / 800e12;
  // 16 decodes: weight-bound. The sum form adds compute and weights; the roofline takes the
  // weights alone, plus the KV at its own rate and the decodes' fixed cost.
  StepShape decode{.decode_tokens = 16, .decode_context_tokens = 16 * 1000, .logit_rows = 16};
  const double kv_bytes = 16000.0 * static_cast<double>(shape.kv_bytes_per_token());
  const double rows = 16 * 50e-6;
  EXPECT_NEAR(sum_model.estimate_step(decode).sequential(),
              16 * (dense_per_token + lm_head_row) + weights + kv_bytes / 2e12 + rows, 1e-12);
  EXPECT_NEAR(roof_model.estimate_step(decode).sequential(),
              weights + kv_bytes / 1e12 + 16 * 10e-6 + rows, 1e-12);
  // Plain greedy: the rows' host cost is gone only where the machine takes the argmax itself.
  decode.device_draws = true;
  EXPECT_NEAR(roof_model.estimate_step(decode).sequential(), weights + kv_bytes / 1e12 + 16 * 10e-6,
              1e-12);
  EXPECT_NEAR(sum_model.estimate_step(decode).sequential(),
              16 * (dense_per_token + lm_head_row) + weights + kv_bytes / 2e12 + rows, 1e-12);
  // 4,096 prompt tokens: compute-bound; the roofline hides the weight read under the GEMMs.
  const StepShape prefill{.prefill_tokens = 4096, .logit_rows = 1, .device_draws = true};
  const StepCost s = sum_model.estimate_step(prefill), r = roof_model.estimate_step(prefill);
  EXPECT_DOUBLE_EQ(r.compute_seconds, s.compute_seconds);
  EXPECT_NEAR(r.sequential(), 4096 * dense_per_token + lm_head_row, 1e-12);
  EXPECT_NEAR(s.sequential() - r.sequential(), weights + 50e-6, 1e-12);
}

}  // namespace
}  // namespace blend
