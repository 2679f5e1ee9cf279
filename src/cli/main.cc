// `blend`: one executable, one subcommand per job (DESIGN.md §1).
#include <signal.h>

#include <cstdio>
#include <exception>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "server/version.h"

int main(int argc, char** argv) {
  // A file size limit (ulimit -f) reached while writing results is reported like a full disk
  // (EFBIG: "cannot write FILE: File too large") by the writer that hit it, instead of killing
  // the process mid-line with SIGXFSZ.
  ::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{
      "blend: serve and batch-run Llama-family models (BlendServe, NanoFlow, BROS, BlockLLM)"};
  app.set_version_flag("--version", blend::kBlendVersion, "Print blend's version and exit");
  app.require_subcommand(1);
  blend::cli::register_model_commands(app);
  blend::cli::register_tokenize_command(app);
  blend::cli::register_template_command(app);
  blend::cli::register_batch_command(app);
  blend::cli::register_plan_command(app);
  blend::cli::register_simulate_command(app);
  blend::cli::register_simulate_serve_command(app);
  blend::cli::register_profile_command(app);
  blend::cli::register_serve_command(app);
  blend::cli::register_workload_command(app);
  blend::cli::register_bench_command(app);
  blend::cli::register_zoo_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const blend::Error& e) {
    std::fprintf(stderr, "blend: error: %s\n", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // The last resort for a std::filesystem call on a user's path that nothing wrapped (the
    // model loaders name theirs): still the user's input, so a user error naming the path.
    std::fprintf(stderr, "blend: error: %s: %s\n", e.path1().string().c_str(),
                 e.code().message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "blend: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
