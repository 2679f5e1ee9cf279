// The engine flags `blend batch` and `blend serve` share (KV sizing, batching, prefix cache,
// KV tiers, determinism), defined once.
#pragma once

#include <CLI/CLI.hpp>

#include "engine/engine.h"

namespace blend::cli {

void add_engine_flags(CLI::App* cmd, EngineOptions& options);

}  // namespace blend::cli
