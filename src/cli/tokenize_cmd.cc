#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace blend::cli {
void register_tokenize_command(CLI::App&) {}
}  // namespace blend::cli
