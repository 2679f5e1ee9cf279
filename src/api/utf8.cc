#include "api/utf8.h"

#include "api/api_error.h"

namespace blend {

void check_utf8(std::string_view s, const std::string& param) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) throw ApiError(400, "invalid UTF-8 in '" + param + "'", param);
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2)
        throw ApiError(400, "invalid UTF-8 in '" + param + "'", param);
    i += n;
  }
}

}  // namespace blend
