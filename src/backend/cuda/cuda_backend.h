// The cuda backend (issue 28): the cpu backend's Llama-family forward pass on an NVIDIA GPU.
// Weights, activations and the paged KV cache live in GPU memory; GEMMs run in cuBLAS
// (bf16 inputs with f32 accumulation and output for bf16/f16 checkpoints, plain f32 for f32
// ones: the cpu backend's numerics), the other steps in kernels.cu. Logits of the rows that
// sample come back to the host and are sampled there by the Backend default (the same sampler
// and seeds as the cpu backend).
//
// Greedy rows are picked on the GPU (forward_argmax); prefill chunks run attention on tensor
// cores, decodes in a pipelined kernel with flash-decoding splits (attention.cu). A step may run
// as two overlapped nano-batches (NanoFlow §4.3, nano_split.h; BLEND_CUDA_NANO_BATCHES, off by
// default: it measured no gain with these kernels).
//
// Decode steps may run as CUDA graphs (BLEND_CUDA_GRAPHS=decode, off by default: not yet run
// on a GPU); rows with top-k / top-p / min-p or logprobs are drawn on the GPU only with
// BLEND_CUDA_DRAW=all (not yet run on a GPU either). `--deterministic` is refused (cuBLAS picks
// its algorithm by shape, so a row's result may depend on the batch).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/nano_search.h"

namespace blend {

class TensorStore;

// GPU time per operation (milliseconds, CUDA events around each launch), summed over layers and
// steps since the last reset, when op timing is on (it adds one event per operation).
struct CudaOpTimes {
  double embed = 0, norm = 0, qkv = 0, rope_kv = 0, attention = 0, o_proj = 0, gate_up = 0, act = 0,
         down = 0, lm_head = 0;
  int64_t steps = 0;
  double total() const {
    return embed + norm + qkv + rope_kv + attention + o_proj + gate_up + act + down + lm_head;
  }
};

// BLEND_CUDA_GRAPHS=decode: decode steps whose kernels' arguments were seen before replay the
// graph captured then; a step of up to 512 rows is padded to 1, 2, 4 or a multiple of 8 rows
// first (batch_layout.h's graph_rows), so that nearby counts share a graph. A capture the
// runtime refuses turns graphs off for the backend's life.
struct CudaGraphStats {
  int64_t captured = 0;  // graphs captured (each a shape: padded rows, context bucket, buffers)
  int64_t replayed = 0;  // steps that replayed one
  int64_t failed = 0;    // captures refused (then graphs stay off)
};

class CudaBackend : public Backend {
 public:
  virtual void set_op_timing(bool on) = 0;
  virtual const CudaOpTimes& op_times() const = 0;
  virtual void reset_op_times() = 0;
  virtual const CudaGraphStats& graph_stats() const = 0;
  // NanoFlow §5.5's offline profile (backend/cuda/nano_search.h, what BLEND_CUDA_NANO_PROFILE
  // reads): one layer's GEMM phase and attention timed (median of `reps`) at each SM count a
  // green split gives them and on the whole GPU (nano_profile_grid). Needs the KV pages the
  // grid names (NanoGrid::pages_needed) and green contexts; throws blend::Error otherwise.
  virtual cuda::NanoProfile measure_nano_profile(int reps) = 0;
};

// `backend`'s nano-batch profile (CudaBackend::measure_nano_profile) for a caller that holds it
// as a Backend, e.g. from make_backend; throws blend::Error naming the backend it is when that
// is not the cuda backend.
cuda::NanoProfile measure_nano_profile(Backend& backend, int reps);

// Whether a CUDA device can be used; when not, `why` says what the runtime answered (no
// driver, no device).
bool cuda_device_available(std::string* why = nullptr);

// GPU 0's memory in bytes (0 without a usable GPU): what `blend profile --backend cuda` writes
// as the hardware's memory.
int64_t cuda_device_memory_bytes();

// The device's name and memory, e.g. "NVIDIA H200, 139.8 GiB, sm_90".
std::string cuda_device_description();

// Loads the weights of `config` from `weights` onto GPU 0 and allocates options.num_pages KV
// pages. Throws blend::Error when no GPU is usable, for shapes the kernels do not support, for
// --deterministic, and for missing or mis-shaped tensors.
std::unique_ptr<CudaBackend> make_cuda_backend(const ModelConfig& config,
                                               const TensorStore& weights,
                                               const BackendOptions& options);

}  // namespace blend
