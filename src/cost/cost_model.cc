#include "cost/cost_model.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "model/presets.h"

namespace blend {
namespace {

// OPT: learned positions, biases everywhere, a two-matrix ReLU MLP (4H wide), tied lm_head.
ModelShape opt_shape(std::string name, int64_t hidden, int64_t layers, int tp) {
  const int64_t vocab = 50272;
  const int64_t ffn = 4 * hidden;
  const int64_t per_layer = 4 * hidden * hidden + 2 * hidden * ffn;
  ModelShape s;
  s.name = std::move(name);
  s.hidden_size = hidden;
  s.num_layers = layers;
  s.kv_dim = hidden;  // multi-head attention
  s.matmul_parameters = layers * per_layer + vocab * hidden;
  s.lm_head_parameters = vocab * hidden;
  s.weight_bytes =
      2 * (layers * (per_layer + 4 * hidden + ffn + 5 * hidden) + vocab * hidden + 2050 * hidden);
  s.tensor_parallel = tp;
  return s;
}

}  // namespace

ModelShape ModelShape::from_config(const ModelConfig& config, std::string name,
                                   int tensor_parallel) {
  if (tensor_parallel < 1) throw Error("--tp must be at least 1");
  ModelShape s;
  s.name = std::move(name);
  s.hidden_size = config.hidden_size;
  s.num_layers = config.num_layers;
  s.kv_dim = config.kv_dim();
  s.query_dim = config.q_dim();
  s.matmul_parameters = config.num_matmul_parameters();
  s.lm_head_parameters = config.vocab_size * config.hidden_size;
  s.weight_bytes = 2 * config.num_parameters();
  s.tensor_parallel = tensor_parallel;
  return s;
}

std::optional<ModelShape> find_model_shape_preset(std::string_view name, int tensor_parallel) {
  if (tensor_parallel < 1) throw Error("--tp must be at least 1");
  if (name == "opt-13b") return opt_shape("opt-13b", 5120, 40, tensor_parallel);
  if (name == "opt-30b") return opt_shape("opt-30b", 7168, 48, tensor_parallel);
  if (auto config = find_model_shape(name))
    return ModelShape::from_config(*config, std::string(name), tensor_parallel);
  return std::nullopt;
}

double StepCost::overlapped() const {
  const double longest = std::max({compute_seconds, memory_seconds, network_seconds});
  const double rest = compute_seconds + memory_seconds + network_seconds - longest;
  return longest + interference * rest + overhead_seconds;
}

CostModel::CostModel(ModelShape shape, Hardware hardware)
    : shape_(std::move(shape)), hardware_(std::move(hardware)) {
  hardware_.validate();
  if (shape_.num_layers <= 0 || shape_.kv_dim <= 0 || shape_.matmul_parameters <= 0)
    throw Error("model shape " + shape_.name + " is incomplete");
}

double CostModel::request_compute_seconds(double p, double d) const {
  // Attention FLOPs scaled by 1 / attention_efficiency run at its rate (and the result stays
  // bit-identical when it is 1, as on every GPU preset).
  const double flops = 2 * (p + d) * static_cast<double>(shape_.matmul_parameters) +
                       4 * p * p *
                           static_cast<double>(shape_.attention_width() * shape_.num_layers) /
                           hardware_.attention_efficiency;
  return flops / (hardware_.effective_compute() * shape_.tensor_parallel);
}

double CostModel::request_memory_seconds(double p, double d) const {
  const double bytes = (p * d + d * d / 2) * static_cast<double>(shape_.kv_bytes_per_token());
  return bytes / (hardware_.effective_bandwidth() * shape_.tensor_parallel);
}

double CostModel::request_density(double p, double d) const {
  return node_density(0.0, request_compute_seconds(p, d), request_memory_seconds(p, d));
}

double CostModel::batch_compute_seconds(double kv_memory_bytes, double p, double d) const {
  const double decoders = kv_memory_bytes / ((p + d / 2) * kv_bytes_per_token_per_device());
  const double tokens = decoders * (p + d) / d;
  return tokens * 2 * static_cast<double>(shape_.matmul_parameters) / shape_.tensor_parallel /
         hardware_.effective_compute();
}

double CostModel::batch_memory_seconds(double kv_memory_bytes) const {
  return kv_memory_bytes / hardware_.effective_bandwidth();
}

double CostModel::batch_density(double p, double d) const {
  const double any_memory = 1e9;  // the ratio does not depend on it
  return batch_compute_seconds(any_memory, p, d) / batch_memory_seconds(any_memory);
}

double CostModel::node_density(double s, double compute_seconds, double memory_seconds) {
  if (memory_seconds <= 0) return std::numeric_limits<double>::infinity();
  return (1 - s) * compute_seconds / memory_seconds;
}

double CostModel::kv_bytes_per_token_per_device() const {
  return static_cast<double>(shape_.kv_bytes_per_token()) / shape_.tensor_parallel;
}

StepCost CostModel::estimate_step(const StepShape& step) const {
  const double tp = shape_.tensor_parallel;
  const double dense_tokens = static_cast<double>(step.prefill_tokens + step.decode_tokens);
  const double hl = static_cast<double>(shape_.hidden_size * shape_.num_layers);
  // Attention's q.k and p.v products are as wide as the query heads (H_q), not the stream.
  const double ql = static_cast<double>(shape_.attention_width() * shape_.num_layers);
  StepCost cost;
  cost.interference = hardware_.overlap_interference;
  const double rows = step.logit_rows < 0 ? dense_tokens : static_cast<double>(step.logit_rows);
  // Past one tile the GEMMs compute whole tiles of rows (Hardware::dense_row_tile).
  const double dense_flops =
      2 * hardware_.rows_charged(dense_tokens) *
          static_cast<double>(shape_.matmul_parameters - shape_.lm_head_parameters) +
      2 * hardware_.rows_charged(rows) * static_cast<double>(shape_.lm_head_parameters);
  const double attention_flops =
      4 * static_cast<double>(step.prefill_attention_pairs) * ql / hardware_.attention_efficiency;
  cost.compute_seconds = (dense_flops + attention_flops) / tp / hardware_.effective_compute();
  const double weight_seconds =
      static_cast<double>(shape_.weight_bytes) / tp / hardware_.effective_bandwidth();
  const double kv_read = static_cast<double>(step.decode_context_tokens) *
                         static_cast<double>(shape_.kv_bytes_per_token());
  const double kv_bandwidth =
      hardware_.kv_bandwidth > 0 ? hardware_.kv_bandwidth : hardware_.effective_bandwidth();
  cost.memory_seconds = weight_seconds + kv_read / tp / kv_bandwidth;
  if (hardware_.gemm_roofline)
    cost.gemm_hidden_seconds =
        std::min(dense_flops / tp / hardware_.effective_compute(), weight_seconds);
  if (shape_.tensor_parallel > 1)  // NanoFlow eq. 7: two AllGathers and one AllReduce per layer
    cost.network_seconds = 4 * dense_tokens * hl * 2 / hardware_.network_bandwidth;
  if (dense_tokens > 0) {
    const bool rows_on_device = step.device_draws && hardware_.device_argmax;
    cost.overhead_seconds = hardware_.step_overhead_seconds +
                            (rows_on_device ? 0.0 : rows * hardware_.per_logit_row_seconds) +
                            static_cast<double>(step.decode_tokens) * hardware_.per_decode_seconds;
  }
  return cost;
}

StepShape step_shape(const ForwardBatch& batch) {
  StepShape shape;
  shape.logit_rows = 0;
  for (const SeqChunk& c : batch.chunks) {
    shape.logit_rows += c.wants_logits ? 1 : 0;
    if (c.num_tokens == 1 && c.num_cached > 0) {  // a decode token
      ++shape.decode_tokens;
      shape.decode_context_tokens += c.num_cached + 1;
    } else {
      shape.prefill_tokens += c.num_tokens;
      shape.prefill_attention_pairs += int64_t{c.num_tokens} * (c.num_cached + c.num_tokens);
    }
  }
  return shape;
}

ModelConfig sim_model_config(const ModelShape& shape) {
  ModelConfig c;
  c.architecture = "sim";
  c.hidden_size = shape.hidden_size;
  c.num_layers = shape.num_layers;
  c.num_kv_heads = 1;
  c.head_dim = shape.kv_dim;
  c.num_heads = 1;
  c.vocab_size = 1 << 30;
  c.max_position_embeddings = 1 << 30;
  // The simulator "samples" EOS (backend/sim's SimTokenSource) where a request's hidden output
  // length ends it; no real token id is ever this one.
  c.eos_token_ids = {static_cast<TokenId>(c.vocab_size - 1)};
  return c;
}

}  // namespace blend
