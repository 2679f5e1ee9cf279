#include "model/derive.h"

#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "core/error.h"
#include "model/config.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend {

void derive_full_finetune(const std::filesystem::path& base, const std::filesystem::path& out,
                          const DeriveOptions& options) {
  namespace fs = std::filesystem;
  const ModelConfig config = ModelConfig::from_dir(base);
  const TensorStore store = TensorStore::open_dir(base);
  check_tensors(config, store);
  if (options.layers.empty()) throw Error("model derive: name the layers to change (--layers)");
  if (!(options.scale > 0 && std::isfinite(options.scale)))
    throw Error("model derive: --scale must be positive and finite");
  std::set<int64_t> layers;
  for (int64_t l : options.layers) {
    if (l < 0 || l >= config.num_layers)
      throw Error("model derive: layer " + std::to_string(l) + " is outside the model's 0.." +
                  std::to_string(config.num_layers - 1));
    layers.insert(l);
  }
  fs::create_directories(out);
  if (fs::equivalent(base, out)) throw Error("model derive: --out must differ from --base");

  // Every file but the weights comes along unchanged.
  for (const auto& entry : fs::directory_iterator(base)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || entry.path().extension() == ".safetensors" ||
        name == "model.safetensors.index.json")
      continue;
    fs::copy_file(entry.path(), out / name, fs::copy_options::overwrite_existing);
  }
  for (const auto& entry : fs::directory_iterator(out))
    if (entry.path().extension() == ".safetensors" ||
        entry.path().filename() == "model.safetensors.index.json")
      fs::remove(entry.path());

  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& spec : llama_tensor_specs(config)) {
    const TensorView& view = store.get(spec.name);
    bool changed = false;
    for (int64_t l : layers) changed = changed || spec.name.starts_with(layer_tensor_name(l, ""));
    TensorToWrite t;
    t.name = spec.name;
    t.dtype = view.dtype;
    t.shape = view.shape;
    const size_t esize = dtype_size(view.dtype);
    t.fill = [&view, spec, &config, changed, esize, seed = options.seed, scale = options.scale](
                 size_t offset, std::span<std::byte> bytes) {
      if (!changed) {
        std::memcpy(bytes.data(), view.data + offset, bytes.size());
        return;
      }
      const auto first = static_cast<int64_t>(offset / esize);
      for (size_t i = 0; i < bytes.size() / esize; ++i) {
        const int64_t index = first + static_cast<int64_t>(i);
        store_float(view.at(index) +
                        static_cast<float>(scale) * random_init_value(spec, config, seed, index),
                    view.dtype, bytes.data() + i * esize);
      }
    };
    tensors.push_back(std::move(t));
  }
  write_safetensors(out / "model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace blend
