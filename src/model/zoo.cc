#include "model/zoo.h"

#include <algorithm>

#include "core/error.h"

namespace blend {

std::string model_folder_name(const std::filesystem::path& dir) {
  std::string name = dir.filename().string();
  return name.empty() ? dir.parent_path().filename().string() : name;
}

std::vector<ModelFolder> model_folders(const std::filesystem::path& model,
                                       const std::string& model_name,
                                       const std::filesystem::path& zoo) {
  namespace fs = std::filesystem;
  if (model.empty() && zoo.empty()) throw Error("give a model: --model DIR or --zoo DIR");
  if (model.empty() && !model_name.empty())
    throw Error(
        "--served-model-name names the --model folder; zoo models go by their folder names");
  std::vector<ModelFolder> out;
  if (!model.empty())
    out.push_back({model_name.empty() ? model_folder_name(model) : model_name, model});
  if (!zoo.empty()) {
    if (!fs::is_directory(zoo)) throw Error("--zoo " + zoo.string() + ": not a folder");
    std::vector<fs::path> dirs;
    for (const auto& entry : fs::directory_iterator(zoo))
      if (entry.is_directory()) dirs.push_back(entry.path());
    std::sort(dirs.begin(), dirs.end());
    if (dirs.empty()) throw Error("--zoo " + zoo.string() + ": holds no model folder");
    for (const fs::path& dir : dirs) {
      if (fs::exists(dir / "adapter_config.json"))
        throw Error("--zoo: " + dir.string() +
                    " is a LoRA adapter; adapters are not supported yet (full model folders are)");
      if (!fs::exists(dir / "config.json"))
        throw Error("--zoo: " + dir.string() + " has no config.json: not a model folder");
      out.push_back({model_folder_name(dir), dir});
    }
  }
  check_model_names(out);
  return out;
}

void check_model_names(const std::vector<ModelFolder>& models) {
  for (size_t i = 0; i < models.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (models[i].name == models[j].name)
        throw Error("two models are named '" + models[i].name + "'; model names must differ");
}

}  // namespace blend
