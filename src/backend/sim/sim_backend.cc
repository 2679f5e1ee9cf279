#include "backend/sim/sim_backend.h"

#include <algorithm>

#include "core/error.h"

namespace blend {

SimBackend::SimBackend(const ModelConfig& config, SimBackendOptions options, SimStepCost cost)
    : config_(config), options_(options), cost_(std::move(cost)) {
  if (options_.num_pages <= 0) throw Error("sim backend: the KV cache must hold at least a page");
  if (!cost_) throw Error("sim backend: no step cost model");
}

void SimBackend::forward(const ForwardBatch& batch, std::span<float>) {
  const SimStepTime t = cost_(batch);
  if (!(t.total >= 0)) throw Error("sim backend: the cost model gave a negative step time");
  clock_ += t.total;
  totals_.compute += t.compute;
  totals_.memory += t.memory;
  totals_.network += t.network;
  totals_.total += t.total;
  if (options_.record_steps) steps_.push_back(t);
}

}  // namespace blend
