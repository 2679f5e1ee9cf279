// The `blend` subcommands. Each file in cli/ registers one family on the CLI11 app; the
// callbacks throw blend::Error for bad input, which main() turns into a message and exit 1.
#pragma once

namespace CLI {
class App;
}

namespace blend::cli {

void register_model_commands(CLI::App& app);          // blend model init | info
void register_tokenize_command(CLI::App& app);        // blend tokenize
void register_template_command(CLI::App& app);        // blend template
void register_batch_command(CLI::App& app);           // blend batch
void register_plan_command(CLI::App& app);            // blend plan
void register_simulate_command(CLI::App& app);        // blend simulate
void register_simulate_serve_command(CLI::App& app);  // blend simulate-serve
void register_profile_command(CLI::App& app);         // blend profile
void register_serve_command(CLI::App& app);           // blend serve
void register_workload_command(CLI::App& app);        // blend workload synth
void register_bench_command(CLI::App& app);           // blend bench serve | soak
void register_bench_soak_command(CLI::App& bench);    // blend bench soak (under `bench`)
void register_zoo_command(CLI::App& app);             // blend zoo analyze

}  // namespace blend::cli
