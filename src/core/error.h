// blend::Error — the one exception type the engine throws for bad input (files, requests,
// arguments). Callers at the edges (CLI, HTTP) turn it into a message and an exit code or an
// HTTP status; nothing inside the engine swallows it.
#pragma once

#include <stdexcept>
#include <string>

namespace blend {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace blend
