// RoPE frequencies of a model, shared by every backend (the model described once, issue 24).
#pragma once

#include <vector>

#include "model/config.h"

namespace blend {

// RoPE inverse frequencies inv_freq[i] = theta^(-2i/head_dim), i < head_dim / 2, with the
// config's scaling applied (Hugging Face _compute_llama3_parameters / linear), in double.
// Throws blend::Error for a scaling type it does not know.
std::vector<double> rope_inv_freq(const ModelConfig& config);

}  // namespace blend
