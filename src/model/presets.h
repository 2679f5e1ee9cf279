// Model presets that `blend model init` can materialise with random weights. All use the
// Llama-3 tokenizer (vocab 128256), so their shapes match the named model except for vocab.
// Shapes of models too large to materialise here live in cost/model_shapes.h.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace blend {

inline constexpr int64_t kLlama3VocabSize = 128256;

std::optional<ModelConfig> find_model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

}  // namespace blend
