// Nano-batching for one step (NanoFlow §4.1-§4.3): where to cut a step's chunks into two
// nano-batches that the cuda backend runs as a two-stream pipeline, and whether the cut beats
// running the step whole. Pure host code, tested without a GPU.
//
// The pipeline (cuda_backend.cc) alternates, per nano-batch, a GEMM phase (the O projection and
// MLP of layer l-1, then the norm, QKV projection and RoPE/KV write of layer l) and an attention
// phase (layer l's attention). The GEMM phases of the two nano-batches run one after the other
// (X.G(l), Y.G(l), X.G(l+1), ...), so each gets the whole GPU, and each attention phase runs
// beside the other nano-batch's GEMM phase: memory-bound attention under compute-bound GEMMs,
// the overlap NanoFlow's Fig. 5 builds. Its steady-state period per layer is the longest cycle
// of that dependency graph, max(G_X + G_Y, G_X + A_X, G_Y + A_Y), never under A_X + A_Y (the
// attentions share the memory), plus what the overlapped work loses to sharing the GPU:
// `interference` times the overlapped time (the simulator's GEMM-attention interference term).
// At interference 1 no cut is predicted to beat the whole step. The engine measured its own
// (docs/BENCHMARKS.md, "nano-batch overlap on an H100"): with cuBLAS GEMMs and our CUDA-core
// decode attention the pipelined step was never faster than the whole step (interference
// about 1, as bench/gpu/overlap_interference.cu found for that kernel); 0.71 is what a kernel
// that reads at bandwidth on few SMs got in that probe.
#pragma once

#include <cstdint>
#include <span>

namespace blend::cuda {

// One chunk of a step, as the cost model sees it.
struct ChunkWork {
  int32_t tokens = 0;  // tokens computed (1 for a decode)
  int32_t cached = 0;  // tokens already in the KV cache before them
};

// The step's costs in seconds per unit, all layers together; measured by the backend on the
// GPU at hand (its GEMM rate and its weight-read rate, cuda_backend.cc).
struct NanoCost {
  double gemm_seconds_per_token = 0;  // the GEMMs' time per token when compute-bound
  double weight_seconds = 0;          // one read of the weights: a GEMM phase's floor
  double kv_seconds_per_token = 0;    // attention's time per cached token read (a decode)
  double prefill_kv_tile = 64;        // query rows that share one read of the keys in a prefill
  // Share of the overlapped time lost to sharing the GPU: 1 as measured with our kernels (no
  // cut then wins, so BLEND_CUDA_NANO_BATCHES=auto runs whole steps until a kernel overlaps).
  double interference = 1.0;
};

struct NanoSplit {
  int32_t cut = 0;          // chunks [0, cut) are nano-batch X, the rest Y; 0 = do not split
  double sequential_s = 0;  // the step run whole, by the model
  double pipelined_s = 0;   // the best cut's pipeline, by the model (= sequential_s if cut 0)
};

// GEMM time of `tokens` tokens: compute at gemm_seconds_per_token, never under one weight read.
double nano_gemm_seconds(const NanoCost& cost, double tokens);
// KV tokens one chunk's attention reads: its keys once per query tile (once for a decode).
double nano_attention_reads(const ChunkWork& chunk, double prefill_kv_tile);
// Attention time of one chunk: its reads at kv_seconds_per_token.
double nano_attention_seconds(const NanoCost& cost, const ChunkWork& chunk);
// The pipeline's time for nano-batches with GEMM times gx, gy and attention times ax, ay.
double nano_pipeline_seconds(const NanoCost& cost, double gx, double ax, double gy, double ay);

// The cut with the shortest pipeline. It splits only where the pipeline is predicted at most
// `min_ratio` of the sequential step (`always`: wherever there are two chunks, for tests).
NanoSplit choose_nano_split(std::span<const ChunkWork> chunks, const NanoCost& cost,
                            double min_ratio = 0.95, bool always = false);

}  // namespace blend::cuda
