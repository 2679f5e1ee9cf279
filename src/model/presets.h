// The model presets, in one table: every named model shape blend knows, and per preset whether
// `blend model init` can materialise it (random weights, the Llama-3 tokenizer, small enough to
// write here) or it is a shape only, for the cost model and the simulator (DESIGN.md §3).
// Materialisable presets use the Llama-3 tokenizer (vocab 128256), so their shapes match the
// named model except for the vocabulary. (The cost model adds OPT shapes of its own, which a
// ModelConfig cannot describe: cost/cost_model.h.)
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace blend {

inline constexpr int64_t kLlama3VocabSize = 128256;

struct ModelPreset {
  std::string name;
  bool materialisable = false;  // `blend model init` can write it
  ModelConfig config;
};

// Every preset, materialisable ones first, in the order `model init` lists them.
const std::vector<ModelPreset>& model_presets();

// A materialisable preset by name (nullopt for unknown and shape-only names).
std::optional<ModelConfig> find_model_preset(std::string_view name);
// What `blend model init --allow-large` writes: a materialisable preset, or a shape-only one of
// the Llama-3 architecture and vocabulary (llama-3-8b, llama-3-70b) with the Llama-3 tokenizer's
// token ids added (the shape table itself stays as the cost model reads it). nullopt for the
// rest: their vocabulary is not the tokenizer's.
std::optional<ModelConfig> find_large_model_preset(std::string_view name);
// Any preset by name, materialisable or shape-only.
std::optional<ModelConfig> find_model_shape(std::string_view name);

std::vector<std::string> model_preset_names();        // materialisable
std::vector<std::string> shape_only_preset_names();   // the rest
std::vector<std::string> large_model_preset_names();  // shape-only, `init --allow-large` writes

}  // namespace blend
