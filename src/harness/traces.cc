#include "harness/traces.h"

#include <cstdlib>

namespace blend::workload {

std::filesystem::path default_traces_dir() {
  if (const char* env = std::getenv("BLEND_TRACES_DIR"); env && *env) return env;
#ifdef BLEND_DEFAULT_TRACES_DIR
  return BLEND_DEFAULT_TRACES_DIR;
#else
  return "data/traces";
#endif
}

std::string missing_traces_hint() {
  return "the traces ship with blend's source tree in data/traces (see its README.md); pass "
         "--traces DIR or set BLEND_TRACES_DIR to a copy of that folder";
}

}  // namespace blend::workload
