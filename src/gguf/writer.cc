#include "gguf/writer.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace blend::gguf_internal {

void KvBuffer::put_u32(const std::string& key, uint32_t v) {
  begin(key, GgufType::kUint32);
  raw_u32(v);
}

void KvBuffer::put_f32(const std::string& key, double v) {
  begin(key, GgufType::kFloat32);
  raw_u32(std::bit_cast<uint32_t>(static_cast<float>(v)));
}

void KvBuffer::put_bool(const std::string& key, bool v) {
  begin(key, GgufType::kBool);
  buf_.push_back(v ? 1 : 0);
}

void KvBuffer::put_string(const std::string& key, std::string_view v) {
  begin(key, GgufType::kString);
  raw_string(v);
}

void KvBuffer::put_strings(const std::string& key, const std::vector<std::string>& v) {
  begin(key, GgufType::kArray);
  raw_u32(static_cast<uint32_t>(GgufType::kString));
  raw_u64(v.size());
  for (const auto& s : v) raw_string(s);
}

void KvBuffer::put_i32s(const std::string& key, const std::vector<int32_t>& v) {
  begin(key, GgufType::kArray);
  raw_u32(static_cast<uint32_t>(GgufType::kInt32));
  raw_u64(v.size());
  for (int32_t x : v) raw_u32(static_cast<uint32_t>(x));
}

void KvBuffer::begin(const std::string& key, GgufType type) {
  if (!keys_.insert(key).second) throw Error("gguf: duplicate metadata key '" + key + "'");
  raw_string(key);
  raw_u32(static_cast<uint32_t>(type));
}

void KvBuffer::raw_u32(uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);  // GGUF is little-endian, as is every host we build for
  buf_.append(b, 4);
}

void KvBuffer::raw_u64(uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  buf_.append(b, 8);
}

void KvBuffer::raw_string(std::string_view s) {
  raw_u64(s.size());
  buf_.append(s.data(), s.size());
}

OutFile::OutFile(const std::filesystem::path& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) throw Error(path.string() + ": cannot create: " + std::strerror(errno));
}

OutFile::~OutFile() {
  if (f_) std::fclose(f_);
}

void OutFile::write(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, f_) != n)
    throw Error(path_.string() + ": write failed: " + std::strerror(errno));
  pos_ += n;
}

void OutFile::pad_to(uint64_t alignment) {
  static const char zeros[64] = {};
  uint64_t pad = gguf_align_up(pos_, alignment) - pos_;
  while (pad) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(pad, sizeof zeros));
    write(zeros, k);
    pad -= k;
  }
}

void OutFile::close() {
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) throw Error(path_.string() + ": close failed: " + std::strerror(errno));
}

}  // namespace blend::gguf_internal
