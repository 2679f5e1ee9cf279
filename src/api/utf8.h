// UTF-8 validation of client text: a prompt we cannot represent is the client's error.
#pragma once

#include <string>
#include <string_view>

namespace blend {

// Throws ApiError (400, param `param`) unless `s` is well-formed UTF-8.
void check_utf8(std::string_view s, const std::string& param);

}  // namespace blend
