// A model folder's tokenizer as GGUF metadata (the tokenizer.* keys of export.h's list):
// tokenizer.json's byte-level BPE (vocabulary and added tokens in id order with their token
// types, merges, the llama.cpp pre-tokenizer name of its split regex), the special token ids and
// add_*_token flags of tokenizer_config.json / config.json, and the chat template(s). What
// llama.cpp could not tokenize the same way is a blend::Error naming the file. Used by
// export_gguf; not a public interface.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

#include "gguf/writer.h"
#include "model/config.h"

namespace blend::gguf_internal {

// A JSON file of the model folder; a missing or invalid one is a blend::Error naming it.
nlohmann::json read_json(const std::filesystem::path& path);

// Puts the tokenizer.* keys of the folder `dir` (config.json already read into `config` and
// `raw_config`) into `kv`, in the converter's order.
void add_tokenizer_metadata(KvBuffer& kv, const std::filesystem::path& dir,
                            const ModelConfig& config, const nlohmann::json& raw_config);

}  // namespace blend::gguf_internal
