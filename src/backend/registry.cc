#include "backend/registry.h"

#include "backend/cpu/cpu_backend.h"
#ifdef BLEND_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/knobs.h"
#endif
#include "core/error.h"

namespace blend {

std::vector<std::string> backend_kinds() {
#ifdef BLEND_HAVE_CUDA
  return {"cpu", "cuda", "sim"};
#else
  return {"cpu", "sim"};
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& kind, const BackendInputs& in) {
  if (!in.config) throw Error("internal: make_backend(" + kind + ") without a model config");
  if (kind != "cuda" && !in.options.cuda_knobs.empty())
    throw Error("--cuda-" + in.options.cuda_knobs.begin()->first +
                " is a knob of the cuda backend; this run uses --backend " + kind);
  if (kind == "cpu") {
    if (!in.weights) throw Error("the cpu backend needs a model's weights");
    std::vector<const TensorStore*> all{in.weights};
    all.insert(all.end(), in.more_weights.begin(), in.more_weights.end());
    return make_cpu_backend(*in.config, all, in.options, CpuGemmLib::kOneDnn, in.adapters);
  }
  for (const LoraAdapter* adapter : in.adapters)
    if (adapter) throw Error("the " + kind + " backend serves no LoRA adapter; use --backend cpu");
  if (!in.more_weights.empty())
    throw Error("the " + kind + " backend serves one model; several models need --backend cpu");
#ifdef BLEND_HAVE_CUDA
  if (kind == "cuda") {
    if (!in.weights) throw Error("the cuda backend needs a model's weights");
    cuda::parse_knobs(in.options.cuda_knobs);  // a bad flag is named before the device is
    return make_cuda_backend(*in.config, *in.weights, in.options);
  }
#endif
  if (kind == "sim") return std::make_unique<SimBackend>(*in.config, in.sim, in.step_cost);
  std::string kinds;
  for (const std::string& k : backend_kinds()) kinds += (kinds.empty() ? "" : ", ") + k;
  throw Error("unknown backend '" + kind + "' (this build has: " + kinds + ")");
}

}  // namespace blend
