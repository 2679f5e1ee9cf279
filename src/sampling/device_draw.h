// DeviceDraw — one row's sampling as a backend may run it where the logits are (a GPU's
// draw kernel, backend/cuda/draw.cu): greedy, or a temperature draw with or without the top-k /
// top-p / min-p cuts (sampling/cut_select.h), and the token's logprobs where asked. A plain
// struct, the same bytes on the host and in a kernel, uploaded as it is. device_draw_of
// (sampler.h) fills it from a request's parameters.
#pragma once

#include <cstdint>

namespace blend {

inline constexpr int32_t kMaxDeviceLogprobs = 20;  // OpenAI's most top_logprobs

struct DeviceDraw {
  float inv_temperature = 0;  // 1 / temperature as the sampler rounds it; 0 = the argmax
  double uniform = 0;         // sampling_uniform(rng_seed, output index)
  int32_t top_k = 0;          // the cuts, read at a temperature only (SamplingParams' values)
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t logprobs = -1;  // -1: none; n >= 0: the token's logprob and the n most likely tokens'
  // Whether it is a bare argmax (what forward_argmax gives), and whether it asks for more than
  // an argmax or a plain temperature draw.
  bool argmax_only() const { return inv_temperature == 0 && logprobs < 0; }
  bool cuts_or_logprobs() const {
    return logprobs >= 0 || (inv_temperature != 0 && (top_k > 0 || top_p < 1.0f || min_p > 0.0f));
  }
};

}  // namespace blend
