// Reading a GGUF file as a model: import_gguf() writes the Hugging Face model folder the file
// stands for, which every part of blend then reads as it reads any other (the way transformers'
// from_pretrained(gguf_file=...) dequantizes a GGUF into its own model). The inverse of
// export_gguf (export.h), for what llama.cpp's converter writes:
//  - architectures "llama" (Llama, Mistral), "qwen2" and "qwen3"; the hyper-parameters of their
//    {arch}.* keys to config.json. A key of the architecture that would change the model and is
//    not read (MoE experts, a sliding window, YaRN RoPE, logit scales, per-layer head counts) is
//    a blend::Error naming it; general.* keys are descriptive and not read.
//  - Llama-3 RoPE scaling from rope_freqs.weight: the rope_scaling "llama3" parameters whose
//    factors (llama3_rope_factors) equal the tensor bit for bit, searched over the values Meta's
//    checkpoints use; a tensor that matches none is refused.
//  - the byte-level BPE tokenizer (tokenizer.ggml.model "gpt2", pre "llama-bpe", "qwen2" or
//    "gpt-2") to tokenizer.json: control tokens as special added tokens, user-defined ones as
//    added tokens, unused ones left out; Qwen2's NFC normalizer and Llama-3's ignore_merges, which
//    the pre-tokenizer name implies; a TemplateProcessing post-processor when add_bos_token (or
//    add_eos_token) is set. tokenizer_config.json gets bos/eos token strings, add_*_token and the
//    chat template(s). SentencePiece vocabularies ("llama": Llama 2, Mistral v0.1, Gemma, Phi-3)
//    and other pre-tokenizers are refused by name.
//  - the end-of-generation ids llama.cpp stops at (eos, eot, eom, and the control tokens
//    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>") as
//    config.json's eos_token_id.
//  - tensors under their Hugging Face names and shapes, Llama's q/k rows permuted back to the
//    rotate-half layout, of types F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
//    Q5_K, Q6_K: Q8_0, Q5_0, Q4_K and Q6_K matrices kept as their blocks (core/dtype.h's block
//    types, run by the cpu backend's integer kernels); the rest kept as bf16 when every other
//    matrix is BF16, as f16 when every one is F16, else dequantized to f32 (core/quant.h's
//    dequantize_row: exactly the values ggml dequantizes). A tensor of another type is refused
//    with its name and type, a tensor the model does not use by its name.
// The folder is written under a temporary name and renamed into place, so a failed import
// leaves nothing half-written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace blend {

struct GgufImportSummary {
  std::string gguf_architecture;  // "llama" | "qwen2" | "qwen3"
  std::string architecture;       // config.json's, e.g. "LlamaForCausalLM"
  DType dtype = DType::kF32;      // of the written safetensors' float tensors
  std::string source_types;       // the file's tensor types with counts: "Q4_K x98, Q6_K x13"
  size_t tensor_count = 0;
  // The block types whose matrices the folder keeps as blocks: "Q4_K, Q6_K"; empty if none.
  std::string kept_block_types;
};

// Writes the model folder of `gguf_file` at `out_dir` (which must not exist). `threads` fill the
// safetensors data at once (1 = the calling thread only).
GgufImportSummary import_gguf(const std::filesystem::path& gguf_file,
                              const std::filesystem::path& out_dir, int threads = 1);

// The GGUF file `path` names as a model: `path` itself when it is a regular file that begins
// with the GGUF magic, or the one *.gguf file of a folder that holds no config.json; nullopt
// when `path` is an ordinary model folder (or does not exist). A folder with several .gguf files
// and no config.json is a blend::Error listing them.
std::optional<std::filesystem::path> gguf_model_file(const std::filesystem::path& path);

// Where imported GGUF models are kept: $BLEND_GGUF_CACHE, else $XDG_CACHE_HOME/blend/gguf, else
// $HOME/.cache/blend/gguf.
std::filesystem::path gguf_cache_dir();

// The model folder to read for `--model path`: `path` unchanged unless it names a GGUF file
// (gguf_model_file), then that file's import in gguf_cache_dir(), written on first use and reused
// while the file keeps its path, size and modification time. The folder is named after the file
// ("Llama-3.2-1B-Q4_K_M.gguf" -> ".../<key>/Llama-3.2-1B-Q4_K_M"), so a served model goes by the
// file's name. Concurrent first uses each write their own temporary folder; the first rename wins.
std::filesystem::path resolve_model_source(const std::filesystem::path& path, int threads = 1);

}  // namespace blend
