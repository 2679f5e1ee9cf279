#include "api/served_models.h"

#include <nlohmann/json.hpp>

#include "api/api_error.h"

namespace blend {

std::optional<ModelId> find_served_model(std::span<const ServedModel> models,
                                         std::string_view name) {
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i].name == name) return static_cast<ModelId>(i);
  return std::nullopt;
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
