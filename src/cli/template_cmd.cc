#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace blend::cli {
void register_template_command(CLI::App&) {}
}  // namespace blend::cli
