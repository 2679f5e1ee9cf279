// Where the request traces are: the repository's data/traces (licences and sources in its
// README.md), found through a path compiled in at build time the way the tokenizer folder is,
// so that `blend workload synth`, `simulate-serve` and `bench serve` run from any directory of
// a fresh clone. $BLEND_TRACES_DIR overrides it; so does each command's --traces.
#pragma once

#include <filesystem>
#include <string>

namespace blend::workload {

std::filesystem::path default_traces_dir();

// What to say when a trace file is missing: where the traces come from and how to point at them.
std::string missing_traces_hint();

}  // namespace blend::workload
