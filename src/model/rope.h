// RoPE frequencies of a model, shared by every backend (the model described once, issue 24).
#pragma once

#include <vector>

#include "model/config.h"

namespace blend {

// RoPE inverse frequencies inv_freq[i] = theta^(-2i/rotary_dim), i < rotary_dim / 2 (rotary_dim
// = head_dim unless partial_rotary_factor is set), with the config's scaling applied (Hugging
// Face _compute_llama3_parameters / linear / _compute_longrope_parameters), in double. Throws
// blend::Error for a scaling type it does not know.
//
// longrope's short or long factors: transformers switches on the current sequence length and
// vLLM on the batch's longest, so one request's logits would depend on what runs beside it.
// blend takes llama.cpp's rule, fixed for an engine: long when the longest sequence the engine
// serves (`max_model_len`, its --max-model-len; 0 = max_position_embeddings) is longer than
// original_max_position_embeddings, short otherwise. Sequences within the original length thus
// get transformers' (short) frequencies exactly when the engine is capped to that length.
std::vector<double> rope_inv_freq(const ModelConfig& config, int64_t max_model_len = 0);

// Whether rope_inv_freq takes longrope's long factors for that engine length.
bool rope_uses_long_factors(const ModelConfig& config, int64_t max_model_len);

// The factor cos and sin are multiplied by (longrope's attention_factor; 1 otherwise).
double rope_attention_factor(const ModelConfig& config);

}  // namespace blend
