// GGUF v3 (llama.cpp's single-file model format, ggml-org/ggml docs/gguf.md): the container's
// wire types and a reader of its header (metadata and tensor infos; tensor data stays on disk).
//
// The gguf/ folder, one concept a file:
//   gguf               the container: metadata value types, the ggml tensor types written,
//                      read_gguf
//   export             export_gguf: a Hugging Face model folder as the GGUF llama.cpp's
//                      convert_hf_to_gguf.py writes for it (what it promises is listed there)
//   writer             the bytes of a GGUF being written: metadata key/value encoding, the
//                      output file and its alignment padding
//   tokenizer_metadata tokenizer.json / tokenizer_config.json / chat templates -> tokenizer.* keys
//   tensor_data        tensor names, dtype conversion, q/k row permutation, tensor data streamed
//                      from the memory-mapped safetensors
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"

namespace blend {

// GGUF metadata value types (gguf.md "gguf_metadata_value_type").
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// llama_ftype values for general.file_type.
enum class GgufFileType : uint32_t {
  kAllF32 = 0,
  kMostlyF16 = 1,
  kMostlyQ8_0 = 7,
  kMostlyQ4_K_M = 15,
  kMostlyBF16 = 32
};

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kGgufVersion = 3;
constexpr uint32_t kGgufAlignment = 32;

// Bytes of one element of a ggml tensor type this code reads and writes (F32 4, F16 and BF16
// 2); 0 for any other (a reader does not size those).
size_t ggml_type_size(uint32_t ggml_type);
inline size_t ggml_type_size(GgmlType t) {
  return ggml_type_size(static_cast<uint32_t>(t));
}
// (The ggml tensor type of a checkpoint dtype is core/dtype.h's ggml_type_of; the tensor types
// themselves, GgmlType, are core/quant.h's.)

// n rounded up to a multiple of `alignment`.
inline uint64_t gguf_align_up(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// One metadata value. Scalars: integers in `u`/`i` (both set when representable), floats in `f`,
// bool in `b`, strings in `s`. Arrays (no nesting): `array_type` and one of `strings`, `ints`,
// `floats` (bools go to `ints`).
struct GgufValue {
  GgufType type = GgufType::kUint32;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  GgufType array_type = GgufType::kUint32;
  std::vector<std::string> strings;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  size_t array_size() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the innermost (contiguous) dimension
  uint32_t type = 0;         // ggml_type
  uint64_t offset = 0;       // relative to GgufFile::data_offset
  uint64_t nbytes = 0;       // for every type of quant.h's ggml_block_layout; else 0
};

// The header of a GGUF file: metadata in file order and tensor infos. Tensor data stays on disk
// at data_offset + offset.
struct GgufFile {
  uint32_t version = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata;
  std::vector<GgufTensorInfo> tensors;
  uint64_t alignment = kGgufAlignment;
  uint64_t data_offset = 0;
  uint64_t file_size = 0;

  const GgufValue* find(const std::string& key) const;
  // Throws blend::Error naming the key when it is absent.
  const GgufValue& at(const std::string& key) const;
  const GgufTensorInfo* tensor(const std::string& name) const;
};

// Reads and checks the header (magic, version 2 or 3, counts, string lengths, that every tensor
// of a known type lies inside the file at an aligned offset, in whole blocks). A bad or truncated
// file is a blend::Error naming it.
GgufFile read_gguf(const std::filesystem::path& path);

}  // namespace blend
