// Backend registry — makes a backend by name, so that the engine and the commands include no
// concrete backend (DESIGN.md §2: cpu, sim, and cuda where the build found the CUDA toolkit). Each
// kind takes what it needs from BackendInputs: the real backends a model's weights, the simulator a
// step-cost function.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/sim/sim_backend.h"

namespace blend {

class TensorStore;
class LoraAdapter;

struct BackendInputs {
  const ModelConfig* config = nullptr;
  const TensorStore* weights = nullptr;  // cpu (and cuda): the checkpoint's tensors
  // cpu: the checkpoints of further models (ModelId 1, 2, ...) of the same architecture as
  // `config` (fine-tunes of one base); blocks identical to an earlier model's are loaded once.
  // The other kinds refuse them.
  std::vector<const TensorStore*> more_weights;
  // cpu: empty, or one per model (weights, then more_weights): a LoRA adapter applied to that
  // model's checkpoint, or null. The other kinds refuse adapters.
  std::vector<const LoraAdapter*> adapters;
  BackendOptions options;
  // sim: what a step costs and the simulated model's KV page size.
  SimStepCost step_cost;
  SimBackendOptions sim;
};

// The kinds this build can make, e.g. {"cpu", "cuda", "sim"}.
std::vector<std::string> backend_kinds();

// Makes a backend of `kind`; throws blend::Error naming the kinds there are for an unknown one,
// and for inputs the kind needs and did not get.
std::unique_ptr<Backend> make_backend(const std::string& kind, const BackendInputs& inputs);

}  // namespace blend
