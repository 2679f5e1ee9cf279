#include "model/rope.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace blend {

bool rope_uses_long_factors(const ModelConfig& c, int64_t max_model_len) {
  const int64_t len = max_model_len > 0 ? max_model_len : c.max_position_embeddings;
  return c.rope_scaling.type == "longrope" && len > c.rope_scaling.original_max_position_embeddings;
}

double rope_attention_factor(const ModelConfig& c) {
  return c.rope_scaling.type == "longrope" ? c.rope_scaling.attention_factor : 1.0;
}

std::vector<double> rope_inv_freq(const ModelConfig& c, int64_t max_model_len) {
  const int64_t dim = c.rotary_dim();
  const int64_t half = dim / 2;
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i)
    inv[i] = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(dim));
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "none" || s.type == "default") return inv;
  if (s.type == "longrope") {
    const std::vector<double>& ext =
        rope_uses_long_factors(c, max_model_len) ? s.long_factor : s.short_factor;
    if (static_cast<int64_t>(ext.size()) != half)
      throw Error("longrope: " + std::to_string(ext.size()) + " factors for " +
                  std::to_string(half) + " frequencies");
    for (int64_t i = 0; i < half; ++i) inv[i] /= ext[i];
    return inv;
  }
  if (s.type == "linear") {
    for (double& f : inv) f /= s.factor;
    return inv;
  }
  if (s.type == "llama3") {
    // Hugging Face _compute_llama3_parameters: long wavelengths are slowed by `factor`, short
    // ones kept, and the band between them interpolated.
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / s.low_freq_factor;
    const double high_freq_wavelen = old_len / s.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      double scaled = wavelen > low_freq_wavelen ? f / s.factor : f;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        scaled = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
      }
      f = scaled;
    }
    return inv;
  }
  throw Error("unsupported rope_scaling type '" + s.type + "'");
}

}  // namespace blend
