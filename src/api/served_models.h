// The models a server or a batch run answers to, by ModelId (engine/engine.h: several models in
// one engine), and which of them a request body names with its "model" field.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "core/types.h"

namespace blend {

class ChatTemplate;

struct ServedModel {
  std::string name;                             // what "model" says to pick it
  const ChatTemplate* chat_template = nullptr;  // null: chat requests fail with a clear message
  const SamplingDefaults* sampling_defaults = nullptr;  // its generation_config.json
  std::string root;                   // its folder (a LoRA model's: the adapter's), as vLLM lists
  std::optional<std::string> parent;  // a LoRA model's base model, when that is served too
};

// The model called `name`, if one is.
std::optional<ModelId> find_served_model(std::span<const ServedModel> models,
                                         std::string_view name);

// The model a request body names: the one called body["model"], or model 0 when the body names
// none. An unknown name is ApiError 404 (param "model"), as OpenAI and vLLM answer; with `any_name`
// and a single model, every name picks it (`blend batch` without
// --served-model-name). A "model" that is not a string is left to the request parser.
ModelId resolve_model(const nlohmann::json& body, std::span<const ServedModel> models,
                      bool any_name = false);

}  // namespace blend
