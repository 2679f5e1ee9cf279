// The tensors of a GGUF export (export.h): llama.cpp's name for each Hugging Face tensor, the
// plan of one tensor (type, shape, source, q/k row permutation, place in the data section), and
// its data converted (F32/F16/BF16) and written row by row from the memory-mapped safetensors,
// never held in memory as a whole. Used by export_gguf; not a public interface.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "model/safetensors.h"

namespace blend::gguf_internal {

// One tensor of the file: from the checkpoint (`source`) or generated (`values`).
struct PlannedTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> shape;  // Hugging Face order (outermost first)
  const TensorView* source = nullptr;
  std::vector<float> values;  // generated tensors
  int64_t permute_heads = 0;  // > 0: LlamaModel.permute over rows with this many heads
  uint64_t nbytes = 0;
  uint64_t offset = 0;

  int64_t numel() const {
    int64_t e = 1;
    for (int64_t d : shape) e *= d;
    return e;
  }
};

// llama.cpp's name for the Hugging Face tensor `hf` ("blk.N.attn_q.weight", ...); `layer` is N,
// or -1 outside the layers. A tensor llama.cpp has no name for is a blend::Error.
std::string gguf_tensor_name(const std::string& hf, int64_t& layer);

// Writes t.nbytes bytes of t's data at the file's current position, converted to t.type (and
// its rows permuted when t.permute_heads > 0), at most ~8 MiB of it in memory at a time.
void write_tensor_data(OutFile& out, const PlannedTensor& t);

// Drops the (clean, file-backed) pages of a tensor that has been written, so exporting a
// multi-GB checkpoint does not keep all of it resident.
void release_pages(const TensorView& v);

}  // namespace blend::gguf_internal
