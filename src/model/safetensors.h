// Safetensors files (https://huggingface.co/docs/safetensors): a little-endian u64 header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the
// raw tensor bytes. Files are memory-mapped read-only; every offset, shape and size is checked
// against the file before a pointer is handed out, and the tensors must cover the data section
// exactly (no gap, overlap or trailing byte, as the reference reader requires), so a truncated
// or corrupted file is a blend::Error naming the file and tensor, never a crash or NaN weights.
// Only regular files are opened (a FIFO named model.safetensors is refused, not waited on).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace blend {

// A block-quantized tensor (Q8_0, Q5_0, Q4_K, Q6_K: core/dtype.h) is stored as U8 bytes of shape
// [rows, block bytes x blocks a row], named by the metadata key kBlockDtypeKey + its name with
// the type's ggml name as value ("Q4_K"); its view has that dtype and shape [rows, elements].
// Other readers see the bytes, never values they could take for weights.
inline constexpr std::string_view kBlockDtypeKey = "blend.dtype.";

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into the mapping; lives as long as its file
  size_t nbytes = 0;
  const std::filesystem::path* file = nullptr;

  int64_t numel() const;
  // Element i converted to float (any dtype). For tests and slow paths only.
  float at(int64_t i) const;
};

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder: DIR/model.safetensors, or the shards listed in
// DIR/model.safetensors.index.json ("weight_map": tensor -> file).
// The name a text model's tensor has in a checkpoint of that model alone: a multimodal wrapper's
// language model (Gemma3ForConditionalGeneration's language_model.model.* and
// language_model.lm_head.*, or model.language_model.* in transformers 4.52 and later) reads as
// model.* and lm_head.*; every other name is itself.
std::string language_model_tensor_name(const std::string& name);

class TensorStore {
 public:
  // The tensors of a model folder (model.safetensors, or the shards its index names), under
  // language_model_tensor_name's names; a tensor saved under both names is refused.
  static TensorStore open_dir(const std::filesystem::path& dir);

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws blend::Error naming the tensor (and the folder) when it is absent.
  const TensorView& get(const std::string& name) const;
  // Also checks the shape; the error names expected and actual shapes.
  const TensorView& get(const std::string& name, const std::vector<int64_t>& shape) const;
  const std::map<std::string, const TensorView*>& tensors() const { return tensors_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> tensors_;
};

// One tensor to write: its bytes come from a callback that fills `out` (the tensor's whole
// byte range, in chunks), so multi-GB models stream to disk without being held in memory.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // fill(offset_bytes, out): write out.size() bytes of the tensor starting at offset_bytes.
  std::function<void(size_t offset_bytes, std::span<std::byte> out)> fill;
};

// Writes a safetensors file atomically (temporary file + rename). Tensors are laid out in the
// order given, back to back (the format allows no holes); the header is space-padded to a
// multiple of 8 bytes as the reference writer does. With threads > 1 the data is filled and
// written in 16 MiB chunks by that many threads at once (pwrite at each chunk's offset), so
// the fill callbacks must be safe to call concurrently on different ranges; the bytes are the
// same as with one thread. A fill that throws stops the write and leaves no file.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, int threads = 1);

std::string shape_string(const std::vector<int64_t>& shape);

// Writes v as one element of `dtype` (f32 as is; bf16 and f16 rounded to nearest even) at out:
// what a TensorToWrite fill writes for a computed value.
void store_float(float v, DType dtype, std::byte* out);

}  // namespace blend
