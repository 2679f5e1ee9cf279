// What the engine tests share: submit requests, step the engine until all are done, check its
// page and cache invariants, and return each result by request id.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace blend::testing {

inline std::map<std::string, GenerationResult> run_requests(
    Engine& engine, std::vector<GenerationRequest> requests) {
  std::map<std::string, GenerationResult> out;
  for (auto& r : requests)
    engine.submit(std::move(r), [&out](GenerationResult&& g) { out[g.id] = std::move(g); });
  engine.run_until_done();
  engine.check_invariants();
  return out;
}

}  // namespace blend::testing
