#include "model/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace blend {

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
