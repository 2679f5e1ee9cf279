// A model folder's tokenizer as GGUF metadata (the tokenizer.* keys of export.h's list):
// tokenizer.json's byte-level BPE (vocabulary and added tokens in id order with their token
// types, merges, the llama.cpp pre-tokenizer name of its split regex), the special token ids and
// add_*_token flags of tokenizer_config.json / config.json, and the chat template(s). What
// llama.cpp could not tokenize the same way is a blend::Error naming the file. Used by
// export_gguf; not a public interface.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gguf/writer.h"
#include "model/config.h"

namespace blend::gguf_internal {

// The Split regexes of the tokenizers llama.cpp knows by the pre-tokenizer names "llama-bpe"
// (Llama 3) and "qwen2" (Qwen2 and Qwen3): the same but for Llama 3's digit groups of 1 to 3.
inline constexpr std::string_view kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
inline constexpr std::string_view kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class GgufTokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// A JSON file of the model folder; a missing or invalid one is a blend::Error naming it.
nlohmann::json read_json(const std::filesystem::path& path);

// Puts the tokenizer.* keys of the folder `dir` (config.json already read into `config` and
// `raw_config`) into `kv`, in the converter's order.
void add_tokenizer_metadata(KvBuffer& kv, const std::filesystem::path& dir,
                            const ModelConfig& config, const nlohmann::json& raw_config);

}  // namespace blend::gguf_internal
