// `blend model init`: writes a complete Hugging Face model folder (config.json,
// generation_config.json, safetensors weights, tokenizer.json, tokenizer_config.json) with
// deterministic random weights. Every element is a pure function of (seed, tensor name, index),
// so the same seed gives the same bytes whatever the dtype rounding, sharding, write order or
// number of threads filling it.
#pragma once

#include <cstdint>
#include <filesystem>

#include "model/config.h"
#include "model/weights.h"

namespace blend {

struct RandomInitOptions {
  uint64_t seed = 0;
  DType dtype = DType::kBF16;
  std::filesystem::path tokenizer_dir;    // holds tokenizer.json and tokenizer_config.json
  uint64_t max_shard_bytes = 0;           // 0: one model.safetensors; else shards + index.json
  uint64_t max_total_bytes = 6ull << 30;  // refuse to materialise anything larger
  int threads = 0;                        // threads computing and writing; 0: one per core
};

// The value init writes for element `index` of `spec` (before dtype rounding). Exposed so
// tests can check loaded weights without a second copy of the generator.
float random_init_value(const TensorSpec& spec, const ModelConfig& config, uint64_t seed,
                        int64_t index);

// Throws blend::Error, before writing anything, when the weights would pass
// options.max_total_bytes or the free space of the output's file system.
void write_random_model(const ModelConfig& config, const std::filesystem::path& out_dir,
                        const RandomInitOptions& options);

// The tokenizer directory used when none is given: $BLEND_TOKENIZER_DIR, else the one
// scripts/setup.sh fetched (a build-time path).
std::filesystem::path default_tokenizer_dir();

}  // namespace blend
