#include "core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace blend {

bool path_exists(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  // ENOTDIR: a file where a folder was expected, so nothing below it.
  if (errno == ENOENT || errno == ENOTDIR) return false;
  throw Error(path.string() + ": " + std::strerror(errno));
}

std::ifstream open_regular_file(const std::filesystem::path& path, uint64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error("cannot open " + path.string() + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw Error(path.string() + ": not a regular file (a directory, FIFO or device)");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw Error(path.string() + ": " + std::to_string(st.st_size) + " bytes, over the " +
                std::to_string(max_bytes) + "-byte limit for this file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path.string());
  return in;
}

std::string read_regular_file(const std::filesystem::path& path, uint64_t max_bytes) {
  std::ifstream in = open_regular_file(path, max_bytes);
  std::string bytes;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size > 0) {
    bytes.resize(static_cast<size_t>(size));
    in.seekg(0);
    in.read(bytes.data(), size);
  }
  if (!in) throw Error("cannot read " + path.string());
  return bytes;
}

int open_regular_fd(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path.string() + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path.string() + ": not a regular file (a directory, FIFO or device)");
  }
  return fd;
}

}  // namespace blend
