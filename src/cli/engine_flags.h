// The engine flags `blend batch` and `blend serve` share (KV sizing, batching, prefix cache,
// KV tiers, determinism), defined once.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "engine/engine.h"

namespace blend::cli {

void add_engine_flags(CLI::App* cmd, EngineOptions& options);

// BROS's iteration model (§4.1) from a `blend profile` file (serve --profile).
IterationCostModel read_iteration_model(const std::string& path);

}  // namespace blend::cli
