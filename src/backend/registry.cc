#include "backend/registry.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace blend {

std::vector<std::string> backend_kinds() {
  return {"cpu", "sim"};
}

std::unique_ptr<Backend> make_backend(const std::string& kind, const BackendInputs& in) {
  if (!in.config) throw Error("internal: make_backend(" + kind + ") without a model config");
  if (kind == "cpu") {
    if (!in.weights) throw Error("the cpu backend needs a model's weights");
    return make_cpu_backend(*in.config, *in.weights, in.options);
  }
  if (kind == "sim") return std::make_unique<SimBackend>(*in.config, in.sim, in.step_cost);
  std::string kinds;
  for (const std::string& k : backend_kinds()) kinds += (kinds.empty() ? "" : ", ") + k;
  throw Error("unknown backend '" + kind + "' (this build has: " + kinds + ")");
}

}  // namespace blend
