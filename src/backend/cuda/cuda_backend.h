// The cuda backend (issue 28): the cpu backend's Llama-family forward pass on an NVIDIA GPU.
// Weights, activations and the paged KV cache live in GPU memory; GEMMs run in cuBLAS
// (bf16 inputs with f32 accumulation and output for bf16/f16 checkpoints, plain f32 for f32
// ones: the cpu backend's numerics), the other steps in kernels.cu. Logits of the rows that
// sample come back to the host and are sampled there by the Backend default (the same sampler
// and seeds as the cpu backend).
//
// Not yet: device-side sampling, CUDA graphs, tensor-core prefill attention, split-K decode
// attention; `--deterministic` is refused (cuBLAS picks its algorithm by shape, so a row's
// result may depend on the batch).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace blend {

class TensorStore;

// Whether a CUDA device can be used; when not, `why` says what the runtime answered (no
// driver, no device).
bool cuda_device_available(std::string* why = nullptr);

// The device's name and memory, e.g. "NVIDIA H200, 139.8 GiB, sm_90".
std::string cuda_device_description();

// Loads the weights of `config` from `weights` onto GPU 0 and allocates options.num_pages KV
// pages. Throws blend::Error when no GPU is usable, for shapes the kernels do not support, for
// --deterministic, and for missing or mis-shaped tensors.
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& config, const TensorStore& weights,
                                           const BackendOptions& options);

}  // namespace blend
