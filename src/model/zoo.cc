#include "model/zoo.h"

#include <algorithm>

#include "core/error.h"
#include "core/regular_file.h"
#include "model/lora.h"

namespace blend {

std::string model_folder_name(const std::filesystem::path& dir) {
  std::string name = dir.filename().string();
  return name.empty() ? dir.parent_path().filename().string() : name;
}

namespace {

// The model folder a LoRA adapter applies to (see model_folders).
std::filesystem::path adapter_base(const std::filesystem::path& adapter,
                                   const std::vector<ModelFolder>& models) {
  namespace fs = std::filesystem;
  const std::string base = lora_base_model(adapter);
  if (base.empty())
    throw Error("--zoo: the adapter " + adapter.string() +
                " names no base_model_name_or_path; cannot tell which model it adapts");
  const fs::path path(base);
  for (const fs::path& dir : {path.is_absolute() ? path : adapter / path})
    if (path_exists(dir / "config.json")) return dir;
  const std::string name = model_folder_name(path);
  for (const ModelFolder& m : models)
    if (m.name == name) return m.dir;
  std::string names;
  for (const ModelFolder& m : models) names += (names.empty() ? "" : ", ") + m.name;
  throw Error("--zoo: the adapter " + adapter.string() + " is for '" + base +
              "', which is neither a model folder nor a model of the zoo (" +
              (names.empty() ? "none" : names) + ")");
}

}  // namespace

std::vector<ModelFolder> model_folders(const std::filesystem::path& model,
                                       const std::string& model_name,
                                       const std::filesystem::path& zoo,
                                       const std::vector<std::string>& lora_modules) {
  namespace fs = std::filesystem;
  if (model.empty() && zoo.empty()) throw Error("give a model: --model DIR or --zoo DIR");
  if (model.empty() && !model_name.empty())
    throw Error(
        "--served-model-name names the --model folder; zoo models go by their folder names");
  std::vector<ModelFolder> out;
  if (!model.empty()) {
    const std::string name = model_name.empty() ? model_folder_name(model) : model_name;
    if (is_lora_adapter(model))
      out.push_back({name, adapter_base(model, {}), model});
    else
      out.push_back({name, model, {}});
  }
  if (!zoo.empty()) {
    std::error_code ec;
    if (!fs::is_directory(zoo, ec))
      throw Error("--zoo " + zoo.string() + ": not a folder" +
                  (ec ? " (" + ec.message() + ")" : ""));
    std::vector<fs::path> dirs;
    for (const auto& entry : fs::directory_iterator(zoo, ec)) {
      // An entry the filesystem cannot resolve (a symlink loop) is named, not skipped.
      const bool is_dir = entry.is_directory(ec);
      if (ec) throw Error("--zoo: " + entry.path().string() + ": " + ec.message());
      if (is_dir) dirs.push_back(entry.path());
    }
    if (ec) throw Error("--zoo " + zoo.string() + ": " + ec.message());
    std::sort(dirs.begin(), dirs.end());
    if (dirs.empty()) throw Error("--zoo " + zoo.string() + ": holds no model folder");
    std::vector<fs::path> adapters;
    for (const fs::path& dir : dirs) {
      if (is_lora_adapter(dir)) {
        adapters.push_back(dir);
        continue;
      }
      if (!path_exists(dir / "config.json"))
        throw Error("--zoo: " + dir.string() +
                    " has no config.json or adapter_config.json: not a model or adapter folder");
      out.push_back({model_folder_name(dir), dir, {}});
    }
    const std::vector<ModelFolder> full = out;
    for (const fs::path& dir : adapters)
      out.push_back({model_folder_name(dir), adapter_base(dir, full), dir});
    std::sort(out.begin() + (model.empty() ? 0 : 1), out.end(),
              [](const ModelFolder& a, const ModelFolder& b) { return a.name < b.name; });
  }
  for (const std::string& module : lora_modules) {
    const size_t eq = module.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == module.size())
      throw Error("--lora-modules takes NAME=DIR, got '" + module + "'");
    if (model.empty()) throw Error("--lora-modules applies adapters to --model; give one");
    if (is_lora_adapter(model))
      throw Error("--lora-modules applies adapters to --model, which is an adapter itself");
    const fs::path dir = module.substr(eq + 1);
    if (!is_lora_adapter(dir))
      throw Error("--lora-modules " + module + ": " + dir.string() +
                  " holds no adapter_config.json: not a LoRA adapter folder");
    out.push_back({module.substr(0, eq), model, dir});
  }
  check_model_names(out);
  return out;
}

std::filesystem::path chat_template_dir(const ModelFolder& folder) {
  if (!folder.adapter.empty() && (path_exists(folder.adapter / "chat_template.jinja") ||
                                  path_exists(folder.adapter / "tokenizer_config.json")))
    return folder.adapter;
  return folder.dir;
}

void check_model_names(const std::vector<ModelFolder>& models) {
  for (size_t i = 0; i < models.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (models[i].name == models[j].name)
        throw Error("two models are named '" + models[i].name + "'; model names must differ");
}

}  // namespace blend
