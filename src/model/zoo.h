// A model zoo: several models served by one engine (engine/engine.h), each a Hugging Face model
// folder named by its folder name. `--zoo DIR` takes every subfolder of DIR (BlockLLM's zoo of
// fine-tunes of shared bases); `--model DIR` adds one more, first.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace blend {

struct ModelFolder {
  std::string name;               // what a request's "model" says to pick it
  std::filesystem::path dir;      // the model folder (for a LoRA adapter: its base model's)
  std::filesystem::path adapter;  // a PEFT LoRA adapter folder applied to `dir`, or empty
};

// The name a model folder goes by: its last path component ("models/smollm/" -> "smollm").
std::string model_folder_name(const std::filesystem::path& dir);

// The models of `--model` (when not empty; named `model_name`, or by its folder when that is
// empty) followed by the subfolders of `--zoo` (when not empty), in name order. A subfolder
// holding a PEFT LoRA adapter (adapter_config.json) is served on its base model: the folder its
// base_model_name_or_path names when that is an existing folder (absolute, or relative to the
// adapter), else the model of this zoo (or --model) whose name is that path's last component
// ("org/Llama-3.2-1B" -> "Llama-3.2-1B"). `--model` may name an adapter folder too, whose base
// must then be a folder. Throws blend::Error when neither is given, for a name
// without --model, when the zoo is not a folder or holds no model, for a subfolder that is no
// model folder or adapter, for an adapter whose base is not found, and for two models of one
// name.
//
// `lora_modules` are vLLM's `--lora-modules NAME=DIR`: LoRA adapters applied to the `--model`
// folder whatever base their config names (as vLLM does), after the zoo, named NAME. Throws
// blend::Error for an entry without '=', an empty name or folder, a folder that is no adapter,
// or without --model.
std::vector<ModelFolder> model_folders(const std::filesystem::path& model,
                                       const std::string& model_name,
                                       const std::filesystem::path& zoo,
                                       const std::vector<std::string>& lora_modules = {});

// Where a model's chat template and special tokens are read: a LoRA adapter folder holding
// chat_template.jinja or tokenizer_config.json (PEFT saves the tokenizer's files beside an adapter
// trained with them), else the model folder, as transformers' AutoTokenizer would load them.
std::filesystem::path chat_template_dir(const ModelFolder& folder);

// Throws blend::Error when two of `models` share a name (requests could not pick between them).
void check_model_names(const std::vector<ModelFolder>& models);

}  // namespace blend
