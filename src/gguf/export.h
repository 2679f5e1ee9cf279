// Export of a Hugging Face model folder as GGUF v3 (the container: gguf/gguf.h).
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

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"
#include "gguf/quant_recipe.h"
#include "model/config.h"

namespace blend {

struct GgufExportOptions {
  std::optional<DType> dtype;  // matrices; unset: the checkpoint's dtype
  std::string name;            // general.name; empty: the model folder's name
  // The matrices quantized as llama-quantize's preset would (`blend model quantize`): each
  // tensor's type from llama_quantize_types (gguf/quant_recipe.h), its blocks from ggml's
  // reference quantizers; 1-D tensors stay F32.
  std::optional<QuantPreset> quantization;
};

struct GgufExportSummary {
  std::string architecture;  // "llama" | "qwen2"
  DType dtype = DType::kBF16;
  std::string matrix_type;  // "BF16", "Q8_0", "Q4_K_M", ...
  // How many tensors of each ggml type the file holds ("Q4_K" -> 12), in type-number order.
  std::vector<std::pair<std::string, size_t>> type_counts;
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
