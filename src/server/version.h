// blend's version, reported by `blend --version`, `blend serve --version` and GET /version.
#pragma once

namespace blend {

inline constexpr const char* kBlendVersion = "0.1.0";

}  // namespace blend
