// GEMMs of the cpu backend: a linear layer y = x W^T (+ b) whose weight is converted and packed
// once at load into the layout the kernel wants, then run through oneDNN's matmul (bf16 x bf16
// -> f32 or f32 x f32 -> f32) or, for f32, OpenBLAS sgemm.
//
// Row contract: a call on m rows reads and writes padded_rows(m) rows of x and y (the extra rows
// are scratch the caller provides), and row i of y depends only on row i of x. In deterministic
// mode (row_tile > 0) every call runs the kernel on tiles of exactly row_tile rows, each tile
// cut into fixed slices of output columns that one thread computes alone, so each row goes
// through the same single-threaded kernel with the same K-loop whatever m is and wherever the
// row sits: a row's output bits do not depend on the batch it came in. (A multithreaded library
// call is not enough: oneDNN's AVX2 sgemm splits a 16-row tile between threads by shape, and a
// row's bits then depend on its place in the tile.) Each slice's kernel writes a dense
// per-thread tile that is then copied (or added) into y: oneDNN's optimized matmuls take no
// strided output, and a slice written straight into y's rows ran its reference kernel. The
// default mode runs one multithreaded kernel call over m rounded up to a multiple of 16 (fewer,
// larger calls; a row's bits may then depend on m through the library's blocking choices).
//
// Not thread-safe: one forward pass at a time (the kernels themselves use all threads).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <dnnl.hpp>

#include "backend/cpu/kquant_gemm.h"
#include "backend/cpu/memory.h"
#include "backend/cpu/q8_gemm.h"
#include "core/dtype.h"

namespace blend {
struct TensorView;
}

namespace blend::cpu {

enum class GemmLib { kOneDnn, kOpenBlas };

// Whether oneDNN has a bf16 matmul on this CPU (AVX-512 BF16, AMX, or AVX-512 where it emulates
// bf16). Machines with AVX2 only have none: bf16 checkpoints then compute in f32.
bool onednn_has_bf16_matmul();

// The row tile for deterministic mode: the first of `preferred`, 24, 48, 64 for which the
// deterministic path (packed weights, one thread a column slice) gives a row the same bits
// wherever it sits in the tile, found by running it on this machine (once per dtype and
// preference). Kernels treat a tile's last rows apart when the
// tile is not a multiple of their row blocking (AVX2 sgemm: 6 rows, so 32 fails and 24 passes),
// and that blocking is the ISA's, not ours to hard-code.
int64_t deterministic_row_tile(DType compute, int64_t preferred);

struct GemmOptions {
  DType compute = DType::kBF16;    // kBF16 or kF32: activations fed to GEMMs and packed weights
  GemmLib lib = GemmLib::kOneDnn;  // kOpenBlas needs compute == kF32
  int64_t row_tile = 0;  // > 0: deterministic mode, kernels run on tiles of this many rows
};

class GemmContext {
 public:
  explicit GemmContext(const GemmOptions& options);
  const GemmOptions& options() const { return options_; }
  size_t elem_size() const { return dtype_size(options_.compute); }
  // Rows the caller must provide in x and y for a call on m rows.
  int64_t padded_rows(int64_t m) const;
  // Distinct kernel instances created so far (one per row count and shape).
  size_t cached_primitives() const { return cache_.size(); }

 private:
  friend class Linear;
  // m, k, n, leading dimension of y, bias, accumulate, and the OpenMP threads the kernel was made
  // for: oneDNN fixes a kernel's thread count when it is created, so a pass on fewer threads
  // (CoreShare) needs kernels of its own.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int>;
  struct Kernel {
    dnnl::matmul matmul;
    dnnl::memory::desc scratchpad;  // user scratchpad (deterministic mode), else empty
  };
  Kernel& kernel(int64_t m, int64_t k, int64_t n, int64_t ldy, bool bias, bool accumulate,
                 const dnnl::memory::desc& weights);
  // Deterministic mode: each OpenMP thread's stream, kernel scratch (user scratchpad) and dense
  // output tile.
  struct ThreadState {
    dnnl::stream stream;
    Buffer scratch, out;
    size_t scratch_bytes = 0, out_bytes = 0;
  };
  // At least `threads` of them, each with a stream, scratch_bytes of scratch and out_bytes of
  // output.
  void prepare_threads(int threads, size_t scratch_bytes, size_t out_bytes);

  GemmOptions options_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<ThreadState> threads_;
  std::map<Key, Kernel> cache_;
};

class Linear {
 public:
  // Stacks the [n_i, k] weight matrices `parts` along the output dimension (fused Q/K/V or
  // gate/up) and packs them; `bias_parts` is empty or holds one [n_i] bias per part. Tensors may
  // be F32, BF16 or F16; they are converted to the context's compute dtype. Q8_0 parts stay
  // quantized and run the int8 kernels of q8_gemm.h when every part is Q8_0; a Q4_K_M file's
  // Q4_K, Q6_K and Q5_0 parts (Q8_0 beside them) run those of kquant_gemm.h when
  // KQuantMatrix::takes them; any other mix is dequantized to the compute dtype.
  Linear(GemmContext& ctx, const std::vector<const TensorView*>& parts,
         const std::vector<const TensorView*>& bias_parts = {});

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  // oneDNN column slices: 1 in the default mode, in deterministic mode a multiple of the threads
  // at load, each about the same number of weights.
  size_t num_slices() const { return slices_.size(); }
  // Implementation oneDNN picked (e.g. "brg:avx512_core_bf16") or "openblas".
  std::string impl() const;

  // y[m][n] = x[m][k] W^T + b, or y += ... when `accumulate`. x holds compute-dtype elements,
  // y f32; both row-major with padded_rows(m) rows available.
  void forward(const void* x, int64_t m, float* y, bool accumulate = false);

 private:
  // Output columns [first, first + count), packed for oneDNN's kernel.
  struct Slice {
    int64_t first = 0, count = 0;
    dnnl::memory::desc desc;
    Buffer data;
    dnnl::memory weights, bias;
    // Deterministic mode: its kernel on row_tile rows (in the context's cache), found on first
    // use.
    GemmContext::Kernel* tile_kernel = nullptr;
  };
  void pack(const std::byte* plain, Slice& slice);
  // Deterministic mode: the kernel of `s` on row_tile rows into a dense [row_tile][count] tile.
  GemmContext::Kernel& tile_kernel(const Slice& s) const;
  void run(int64_t rows, const void* x, float* y, bool accumulate);
  void run_tiles(int64_t tiles, const void* x, float* y, bool accumulate);

  GemmContext& ctx_;
  int64_t k_ = 0, n_ = 0;
  // oneDNN: one slice of all columns, or in deterministic mode slices of max_slice_ columns (the
  // last one may be narrower), as many as a multiple of the threads at load.
  std::vector<Slice> slices_;
  int64_t max_slice_ = 0;
  std::unique_ptr<Q8Matrix> q8_;          // Q8_0 weights (then no slices), or null
  std::unique_ptr<KQuantMatrix> kquant_;  // Q4_K / Q6_K / Q5_0 weights (then no slices), or null
  std::vector<float> plain_;              // OpenBLAS: weights [n][k] f32
  std::vector<float> bias_;               // [n] or empty
};

}  // namespace blend::cpu
