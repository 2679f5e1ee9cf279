// Test helpers: a GGUF file's header and tensor bytes as values, and a writer of such values, so
// that a test can take a file blend exported, change one thing (a key, a tensor's type or bytes)
// and write the file llama.cpp's converter or quantizer would have written.
#pragma once

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace blend::testing {

struct GgufTensorBytes {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  std::string bytes;
};

struct GgufContents {
  std::vector<std::pair<std::string, GgufValue>> metadata;
  std::vector<GgufTensorBytes> tensors;

  GgufValue* find(const std::string& key) {
    for (auto& [k, v] : metadata)
      if (k == key) return &v;
    return nullptr;
  }
  GgufTensorBytes* tensor(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  void set(const std::string& key, GgufValue v) {
    if (GgufValue* old = find(key))
      *old = std::move(v);
    else
      metadata.emplace_back(key, std::move(v));
  }
};

inline GgufValue gguf_string(const std::string& s) {
  GgufValue v;
  v.type = GgufType::kString;
  v.s = s;
  return v;
}
inline GgufValue gguf_u32(uint32_t x) {
  GgufValue v;
  v.type = GgufType::kUint32;
  v.u = x;
  v.i = x;
  return v;
}

inline GgufContents read_gguf_contents(const std::filesystem::path& path) {
  const GgufFile g = read_gguf(path);
  GgufContents c;
  c.metadata = g.metadata;
  std::ifstream in(path, std::ios::binary);
  for (const GgufTensorInfo& t : g.tensors) {
    GgufTensorBytes b{t.name, t.ne, t.type, std::string(t.nbytes, '\0')};
    in.seekg(static_cast<std::streamoff>(g.data_offset + t.offset));
    in.read(b.bytes.data(), static_cast<std::streamsize>(b.bytes.size()));
    c.tensors.push_back(std::move(b));
  }
  return c;
}

namespace gguf_file_detail {

inline void append(std::string& out, const void* p, size_t n) {
  out.append(static_cast<const char*>(p), n);
}
inline void put_u32(std::string& out, uint32_t v) {
  append(out, &v, 4);
}
inline void put_u64(std::string& out, uint64_t v) {
  append(out, &v, 8);
}
inline void put_str(std::string& out, const std::string& s) {
  put_u64(out, s.size());
  out += s;
}

inline void put_scalar(std::string& out, GgufType t, const GgufValue& v, size_t k) {
  const bool array = v.type == GgufType::kArray;
  const int64_t i = array ? (k < v.ints.size() ? v.ints[k] : 0) : v.i;
  const double f = array ? (k < v.floats.size() ? v.floats[k] : 0) : v.f;
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool: {
      const uint8_t b = static_cast<uint8_t>(t == GgufType::kBool && !array ? v.b : i);
      append(out, &b, 1);
      return;
    }
    case GgufType::kUint16:
    case GgufType::kInt16: {
      const uint16_t x = static_cast<uint16_t>(i);
      append(out, &x, 2);
      return;
    }
    case GgufType::kUint32:
    case GgufType::kInt32:
      put_u32(out, static_cast<uint32_t>(array ? i : (t == GgufType::kUint32 ? v.u : i)));
      return;
    case GgufType::kUint64:
    case GgufType::kInt64:
      put_u64(out, static_cast<uint64_t>(i));
      return;
    case GgufType::kFloat32: {
      const float x = static_cast<float>(f);
      append(out, &x, 4);
      return;
    }
    case GgufType::kFloat64:
      append(out, &f, 8);
      return;
    default:
      return;
  }
}

}  // namespace gguf_file_detail

// Writes `c` as a GGUF v3 file with 32-byte alignment (general.alignment must be 32 or absent).
inline void write_gguf_contents(const std::filesystem::path& path, const GgufContents& c) {
  using namespace gguf_file_detail;
  std::string out;
  put_u32(out, kGgufMagic);
  put_u32(out, kGgufVersion);
  put_u64(out, c.tensors.size());
  put_u64(out, c.metadata.size());
  for (const auto& [key, v] : c.metadata) {
    put_str(out, key);
    put_u32(out, static_cast<uint32_t>(v.type));
    if (v.type == GgufType::kString) {
      put_str(out, v.s);
    } else if (v.type == GgufType::kArray) {
      put_u32(out, static_cast<uint32_t>(v.array_type));
      put_u64(out, v.array_size());
      for (size_t k = 0; k < v.array_size(); ++k) {
        if (v.array_type == GgufType::kString)
          put_str(out, v.strings[k]);
        else
          put_scalar(out, v.array_type, v, k);
      }
    } else {
      put_scalar(out, v.type, v, 0);
    }
  }
  uint64_t offset = 0;
  for (const auto& t : c.tensors) {
    put_str(out, t.name);
    put_u32(out, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t n : t.ne) put_u64(out, n);
    put_u32(out, t.type);
    put_u64(out, offset);
    offset = gguf_align_up(offset + t.bytes.size(), kGgufAlignment);
  }
  out.resize(gguf_align_up(out.size(), kGgufAlignment), '\0');
  for (const auto& t : c.tensors) {
    out += t.bytes;
    out.resize(gguf_align_up(out.size(), kGgufAlignment), '\0');
  }
  std::ofstream f(path, std::ios::binary);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
}

}  // namespace blend::testing
