// GGUF v3 (llama.cpp's single-file model format, ggml-org/ggml docs/gguf.md): export of a
// Hugging Face model folder, and a small reader for the header.
//
// export_gguf() writes what llama.cpp's convert_hf_to_gguf.py writes for the same folder:
//  - architecture "llama" for LlamaForCausalLM and MistralForCausalLM, "qwen2" for
//    Qwen2ForCausalLM; the converter's hyper-parameter keys ({arch}.context_length,
//    embedding_length, block_count, feed_forward_length, attention.head_count[_kv],
//    rope.freq_base, attention.layer_norm_rms_epsilon, attention.key_length/value_length when
//    config.json names head_dim or it differs from hidden/heads, and for llama vocab_size and
//    rope.dimension_count), general.file_type, general.alignment = 32;
//  - "linear" RoPE scaling as {arch}.rope.scaling.type/factor; Llama-3 ("llama3") scaling as the
//    F32 tensor rope_freqs.weight of per-frequency factors (LlamaModel.generate_extra_tensors);
//  - the byte-level BPE tokenizer of tokenizer.json: tokenizer.ggml.model "gpt2", pre
//    "llama-bpe" (Llama-3 split regex) or "qwen2", every token string in id order (vocab +
//    added tokens, "[PAD<i>]" of type unused for ids the tokenizer lacks), token types (1 normal,
//    3 control = special added tokens or "<|...|>", 4 user-defined), merges as "a b" (array
//    merges have their spaces encoded as U+0120, like the converter), bos/eos/unk/sep/pad ids
//    from tokenizer_config.json's token strings then config.json's *_token_id, eot for
//    "<|eot_id|>" / "<|im_end|>", add_bos/add_eos flags, chat templates. Anything but a
//    byte-level BPE tokenizer with a known pre-tokenizer is a blend::Error, never a GGUF that
//    tokenizes differently;
//  - tensors under llama.cpp's names (token_embd, blk.N.attn_norm/attn_q/attn_k/attn_v/
//    attn_output/ffn_norm/ffn_gate/ffn_up/ffn_down, output_norm, output unless tied), dims
//    reversed (ne[0] = the Hugging Face last dim), 1-D tensors (norms, biases) in F32, matrices
//    in the requested dtype. For "llama", q_proj and k_proj rows (and biases) are permuted from
//    Hugging Face's rotate-half RoPE layout to GGML's interleaved one exactly as
//    LlamaModel.permute does (gguf_permuted_source_row). Tensor data is streamed row by row from
//    the memory-mapped safetensors, never held in memory as a whole.
// The file is written to a temporary name and renamed into place, so a failed export leaves no
// partial FILE.gguf. Mistral's sliding window is not recorded (the converter does not either).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

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

// The ggml tensor types export_gguf writes (ggml_type numbering).
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kBF16 = 30 };

// llama_ftype values for general.file_type.
enum class GgufFileType : uint32_t { kAllF32 = 0, kMostlyF16 = 1, kMostlyBF16 = 32 };

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kGgufVersion = 3;
constexpr uint32_t kGgufAlignment = 32;

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
  uint64_t nbytes = 0;       // for F32/F16/BF16; 0 for types this reader does not size
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

// Reads and checks the header (magic, version 2 or 3, counts, string lengths, that every F32/F16/
// BF16 tensor lies inside the file at an aligned offset). A bad or truncated file is a
// blend::Error naming it.
GgufFile read_gguf(const std::filesystem::path& path);

struct GgufExportOptions {
  std::optional<DType> dtype;  // matrices; unset: the checkpoint's dtype
  std::string name;            // general.name; empty: the model folder's name
};

struct GgufExportSummary {
  std::string architecture;  // "llama" | "qwen2"
  DType dtype = DType::kBF16;
  size_t tensor_count = 0;
  size_t metadata_count = 0;
  uint64_t file_bytes = 0;
};

GgufExportSummary export_gguf(const std::filesystem::path& model_dir,
                              const std::filesystem::path& out_file,
                              const GgufExportOptions& options = {});

// LlamaModel.permute as a row map: row `row` of the permuted [rows, ...] q/k tensor is row
// gguf_permuted_source_row(row, n_head, rows) of the Hugging Face tensor (n_head = heads for q,
// kv heads for k).
int64_t gguf_permuted_source_row(int64_t row, int64_t n_head, int64_t rows);

// rope_freqs.weight for rope_scaling type "llama3": head_dim/2 factors, computed in float32 as
// the converter does (torch float32). Empty for other scaling types.
std::vector<float> llama3_rope_factors(const ModelConfig& config);

}  // namespace blend
