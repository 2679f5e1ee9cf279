#include "api/api_error.h"

#include "core/request.h"

namespace blend {

nlohmann::json ApiError::body() const {
  using nlohmann::json;
  return {{"error",
           {{"message", what()},
            {"type", type_},
            {"param", param_.empty() ? json(nullptr) : json(param_)},
            {"code", code_.empty() ? json(nullptr) : json(code_)}}}};
}

ApiError generation_error(const GenerationResult& failed) {
  if (!failed.error_param.empty()) return ApiError(400, failed.error, failed.error_param);
  return ApiError(500, failed.error, "", "server_error");
}

}  // namespace blend
