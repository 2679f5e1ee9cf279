#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace blend::cli {
void register_model_commands(CLI::App&) {}
}  // namespace blend::cli
