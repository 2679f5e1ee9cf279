// Opening model-folder files that a user downloaded: only regular files. A FIFO or a device
// named config.json or model.safetensors would otherwise block a reader forever (or stream
// without end); these helpers refuse them before any read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace blend {

// Opens `path` for reading; throws blend::Error naming it when it is missing, not a regular
// file, or larger than `max_bytes`.
std::ifstream open_regular_file(const std::filesystem::path& path, uint64_t max_bytes);

// Opens `path` read-only without blocking (O_NONBLOCK, so a FIFO cannot stall the open) and
// checks with fstat on the same descriptor that it is a regular file. Returns the descriptor;
// throws blend::Error naming the file otherwise.
int open_regular_fd(const std::filesystem::path& path);

}  // namespace blend
