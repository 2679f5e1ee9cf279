#include "api/api_error.h"

namespace blend {

nlohmann::json ApiError::body() const {
  using nlohmann::json;
  return {{"error",
           {{"message", what()},
            {"type", type_},
            {"param", param_.empty() ? json(nullptr) : json(param_)},
            {"code", code_.empty() ? json(nullptr) : json(code_)}}}};
}

}  // namespace blend
