// Opening files that a user downloaded or named (model folders, chat templates): only regular
// files. A FIFO or a device named config.json or tokenizer.json would otherwise block a reader
// forever (or stream without end); these helpers refuse them before any read. A path the
// filesystem cannot resolve (a symlink loop, a folder it may not search) is a blend::Error
// naming it, not a std::filesystem::filesystem_error.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace blend {

// Whether anything is at `path`, following symlinks (a dangling link is absent). Throws
// blend::Error naming the path when the filesystem cannot tell (ELOOP, EACCES, ...), where
// std::filesystem::exists would throw or, with an error_code, answer "absent".
bool path_exists(const std::filesystem::path& path);

// Opens `path` for reading; throws blend::Error naming it when it is missing, not a regular
// file, or larger than `max_bytes`.
std::ifstream open_regular_file(const std::filesystem::path& path, uint64_t max_bytes);

// The bytes of `path`, with open_regular_file's checks; throws blend::Error naming it when the
// read fails.
std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes);

// Opens `path` read-only without blocking (O_NONBLOCK, so a FIFO cannot stall the open) and
// checks with fstat on the same descriptor that it is a regular file. Returns the descriptor;
// throws blend::Error naming the file otherwise.
int open_regular_fd(const std::filesystem::path& path);

}  // namespace blend
