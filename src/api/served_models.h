// The models a server or a batch run answers to, by ModelId (engine/engine.h: several models in
// one engine), and which of them a request body names with its "model" field.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/types.h"

namespace blend {

class ChatTemplate;
class GrammarCompiler;
class Tokenizer;

struct ServedModel {
  std::string name;                             // what "model" says to pick it
  const ChatTemplate* chat_template = nullptr;  // null: chat requests fail with a clear message
  const SamplingDefaults* sampling_defaults = nullptr;  // its generation_config.json
  std::string root;                   // its folder (a LoRA model's: the adapter's), as vLLM lists
  std::optional<std::string> parent;  // a LoRA model's base model, when that is served too
  // Its text (attach_model_text): the tokenizer its requests are read and answered with, the
  // compiler of its response_format schemas, and the longest prompt text it takes before
  // tokenizing (max_prompt_bytes of that tokenizer).
  const Tokenizer* tokenizer = nullptr;
  GrammarCompiler* grammars = nullptr;
  int64_t max_prompt_bytes = 0;
};

// What a served model's text is made of: its tokenizer, the size of the model's vocabulary, its
// EOS ids, and the first model with the same tokenizer and EOS ids (Engine::tokenizer_owner).
struct ModelText {
  const Tokenizer* tokenizer = nullptr;
  int64_t vocab_size = 0;
  std::vector<TokenId> eos_token_ids;
  ModelId owner = 0;
};

// Gives each of `served` its text from `text` (by ModelId): models with one owner share one
// grammar compiler, and with it the token tables built over their vocabulary. The returned
// compilers must outlive `served`.
std::vector<std::unique_ptr<GrammarCompiler>> attach_model_text(std::span<ServedModel> served,
                                                                std::span<const ModelText> text,
                                                                int64_t max_sequence_tokens);

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
