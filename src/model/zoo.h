// A model zoo: several models served by one engine (engine/engine.h), each a Hugging Face model
// folder named by its folder name. `--zoo DIR` takes every subfolder of DIR (BlockLLM's zoo of
// fine-tunes of shared bases); `--model DIR` adds one more, first.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace blend {

struct ModelFolder {
  std::string name;  // what a request's "model" says to pick it
  std::filesystem::path dir;
};

// The name a model folder goes by: its last path component ("models/smollm/" -> "smollm").
std::string model_folder_name(const std::filesystem::path& dir);

// The models of `--model` (when not empty; named `model_name`, or by its folder when that is
// empty) followed by the subfolders of `--zoo` (when not empty), in name order. Throws
// blend::Error when neither is given, for a name without --model, when the zoo is not a folder or
// holds no model, for a subfolder that is a LoRA adapter (not supported yet) or no model folder at
// all, and for two models of one name.
// Throws blend::Error when two of `models` share a name (requests could not pick between them).
void check_model_names(const std::vector<ModelFolder>& models);

std::vector<ModelFolder> model_folders(const std::filesystem::path& model,
                                       const std::string& model_name,
                                       const std::filesystem::path& zoo);

}  // namespace blend
