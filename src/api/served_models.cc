#include "api/served_models.h"

#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/openai.h"
#include "core/error.h"
#include "grammar/json_schema.h"

namespace blend {

std::optional<ModelId> find_served_model(std::span<const ServedModel> models,
                                         std::string_view name) {
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i].name == name) return static_cast<ModelId>(i);
  return std::nullopt;
}

std::vector<std::unique_ptr<GrammarCompiler>> attach_model_text(std::span<ServedModel> served,
                                                                std::span<const ModelText> text,
                                                                int64_t max_sequence_tokens) {
  if (served.size() != text.size()) throw Error("attach_model_text: one text per served model");
  std::vector<std::unique_ptr<GrammarCompiler>> compilers;
  for (size_t m = 0; m < served.size(); ++m) {
    const ModelText& t = text[m];
    const auto owner = static_cast<size_t>(t.owner);
    if (owner > m || !t.tokenizer) throw Error("attach_model_text: a model's text is incomplete");
    served[m].tokenizer = t.tokenizer;
    if (owner == m) {  // its own tokenizer: a compiler, and one walk of its vocabulary
      compilers.push_back(std::make_unique<GrammarCompiler>(
          *t.tokenizer, static_cast<int32_t>(t.vocab_size), t.eos_token_ids));
      served[m].grammars = compilers.back().get();
      served[m].max_prompt_bytes = max_prompt_bytes(*t.tokenizer, max_sequence_tokens);
    } else {  // its owner's
      served[m].grammars = served[owner].grammars;
      served[m].max_prompt_bytes = served[owner].max_prompt_bytes;
    }
  }
  return compilers;
}

ModelId resolve_model(const nlohmann::json& body, std::span<const ServedModel> models,
                      bool any_name) {
  if (!body.is_object()) return 0;
  const auto m = body.find("model");
  if (m == body.end() || !m->is_string()) return 0;
  if (any_name && models.size() == 1) return 0;
  const std::string& name = m->get_ref<const std::string&>();
  if (const auto model = find_served_model(models, name)) return *model;
  throw ApiError(404, "The model '" + name + "' does not exist.", "model", "invalid_request_error",
                 "model_not_found");
}

}  // namespace blend
