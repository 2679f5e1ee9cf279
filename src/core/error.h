// blend::Error — the one exception type the engine throws for bad input (files, requests,
// arguments). Callers at the edges (CLI, HTTP) turn it into a message and an exit code or an
// HTTP status; nothing inside the engine swallows it.
#pragma once

#include <stdexcept>
#include <string>

namespace blend {

// A message may quote input holding a NUL byte (a JSON "\u0000"); what() is a C string, so
// every reader of it (fprintf, the HTTP error body) would stop there and show a message cut
// short. The NUL is written as JSON writes it, \u0000, and the rest of the message is kept.
inline std::string spell_nul_bytes(std::string message) {
  for (size_t at = message.find('\0'); at != std::string::npos; at = message.find('\0', at))
    message.replace(at, 1, "\\u0000");
  return message;
}

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(spell_nul_bytes(message)) {}
};

}  // namespace blend
