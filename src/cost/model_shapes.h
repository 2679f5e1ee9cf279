// Shapes of the models the cost model and simulator reason about (DESIGN.md §3): the
// materialisable presets of model/presets.h plus large models that only exist as shapes here.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace blend {

// Any preset by name: small ones from model/presets.h, large shape-only ones from here.
std::optional<ModelConfig> find_model_shape(std::string_view name);
std::vector<std::string> shape_only_preset_names();

}  // namespace blend
