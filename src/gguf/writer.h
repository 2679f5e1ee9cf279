// The bytes of a GGUF file being written (gguf.md): metadata key/values encoded as the reader
// (gguf.h) reads them back, and the output file with its alignment padding. Little-endian, as
// is every host blend builds for. Used by export_gguf (export.h); not a public interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace blend::gguf_internal {

// Metadata key/value pairs in the order they are put; a key put twice is a blend::Error.
class KvBuffer {
 public:
  void put_u32(const std::string& key, uint32_t v);
  void put_f32(const std::string& key, double v);  // stored as float32
  void put_bool(const std::string& key, bool v);
  void put_string(const std::string& key, std::string_view v);
  void put_strings(const std::string& key, const std::vector<std::string>& v);
  void put_i32s(const std::string& key, const std::vector<int32_t>& v);
  bool has(const std::string& key) const { return keys_.count(key) != 0; }
  size_t count() const { return keys_.size(); }
  const std::string& bytes() const { return buf_; }

 private:
  void begin(const std::string& key, GgufType type);
  void raw_u32(uint32_t v);
  void raw_u64(uint64_t v);
  void raw_string(std::string_view s);

  std::string buf_;
  std::set<std::string> keys_;
};

// A file written front to back; a failed write or close is a blend::Error naming it.
class OutFile {
 public:
  explicit OutFile(const std::filesystem::path& path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const void* p, size_t n);
  // Zero bytes up to the next multiple of `alignment`.
  void pad_to(uint64_t alignment);
  uint64_t pos() const { return pos_; }
  void close();

 private:
  std::filesystem::path path_;
  FILE* f_ = nullptr;
  uint64_t pos_ = 0;
};

}  // namespace blend::gguf_internal
