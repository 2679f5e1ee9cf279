#include "gguf/gguf.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <type_traits>

#include "core/error.h"
#include "core/quant.h"

namespace blend {

size_t ggml_type_size(uint32_t ggml_type) {
  switch (ggml_type) {
    case static_cast<uint32_t>(GgmlType::kF32):
      return 4;
    case static_cast<uint32_t>(GgmlType::kF16):
    case static_cast<uint32_t>(GgmlType::kBF16):
      return 2;
    default:
      return 0;
  }
}

size_t GgufValue::array_size() const {
  if (type != GgufType::kArray) return 0;
  return std::max({strings.size(), ints.size(), floats.size()});
}

const GgufValue* GgufFile::find(const std::string& key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

const GgufValue& GgufFile::at(const std::string& key) const {
  if (const GgufValue* v = find(key)) return *v;
  throw Error("gguf: no metadata key '" + key + "'");
}

const GgufTensorInfo* GgufFile::tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// ---- reader ------------------------------------------------------------------------------

namespace {

class Reader {
 public:
  explicit Reader(const std::filesystem::path& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw Error(path.string() + ": cannot open");
    in_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(in_.tellg());
    in_.seekg(0);
  }
  uint64_t size() const { return size_; }
  uint64_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(path_.string() + ": " + what + " (at byte " + std::to_string(pos_) + ")");
  }
  void read(void* p, uint64_t n) {
    if (n > size_ - pos_) fail("truncated GGUF file");
    in_.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
    if (!in_) fail("read error");
    pos_ += n;
  }
  template <typename T>
  T get() {
    T v;
    read(&v, sizeof v);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (n > size_ - pos_) fail("string length " + std::to_string(n) + " beyond end of file");
    std::string s(n, '\0');
    read(s.data(), n);
    return s;
  }

 private:
  std::filesystem::path path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
};

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

// Reads one integer of type T into both `u` and `i` (sign- or zero-extended as T is).
template <typename T>
void read_int(Reader& r, GgufValue& v) {
  const T x = r.get<T>();
  if constexpr (std::is_signed_v<T>) {
    v.i = x;
    v.u = static_cast<uint64_t>(v.i);
  } else {
    v.u = x;
    v.i = static_cast<int64_t>(v.u);
  }
}

// Reads one scalar of `t` into (u, i, f, b).
void read_scalar(Reader& r, GgufType t, GgufValue& v) {
  switch (t) {
    case GgufType::kUint8:
      return read_int<uint8_t>(r, v);
    case GgufType::kInt8:
      return read_int<int8_t>(r, v);
    case GgufType::kUint16:
      return read_int<uint16_t>(r, v);
    case GgufType::kInt16:
      return read_int<int16_t>(r, v);
    case GgufType::kUint32:
      return read_int<uint32_t>(r, v);
    case GgufType::kInt32:
      return read_int<int32_t>(r, v);
    case GgufType::kUint64:
      return read_int<uint64_t>(r, v);
    case GgufType::kInt64:
      return read_int<int64_t>(r, v);
    case GgufType::kFloat32:
      v.f = r.get<float>();
      return;
    case GgufType::kFloat64:
      v.f = r.get<double>();
      return;
    case GgufType::kBool: {
      const uint8_t b = r.get<uint8_t>();
      if (b > 1) r.fail("bool value " + std::to_string(b));
      v.b = b != 0;
      v.u = b;
      v.i = b;
      return;
    }
    default:
      r.fail("unknown metadata value type " + std::to_string(static_cast<uint32_t>(t)));
  }
}

GgufType read_type(Reader& r) {
  const uint32_t t = r.get<uint32_t>();
  if (t > static_cast<uint32_t>(GgufType::kFloat64))
    r.fail("unknown metadata value type " + std::to_string(t));
  return static_cast<GgufType>(t);
}

}  // namespace

GgufFile read_gguf(const std::filesystem::path& path) {
  Reader r(path);
  GgufFile g;
  g.file_size = r.size();
  if (r.size() < 24) r.fail("too short for a GGUF header");
  if (r.get<uint32_t>() != kGgufMagic) r.fail("not a GGUF file (bad magic)");
  g.version = r.get<uint32_t>();
  if (g.version != 2 && g.version != 3)
    r.fail("unsupported GGUF version " + std::to_string(g.version));
  const uint64_t n_tensors = r.get<uint64_t>();
  const uint64_t n_kv = r.get<uint64_t>();
  // Every entry takes at least 8 bytes of key length plus 4 of type: bound the counts by size.
  if (n_kv > r.size() / 12 || n_tensors > r.size() / 24)
    r.fail("implausible tensor/metadata count");
  std::set<std::string> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.str();
    if (!keys.insert(key).second) r.fail("duplicate metadata key '" + key + "'");
    GgufValue v;
    v.type = read_type(r);
    if (v.type == GgufType::kString) {
      v.s = r.str();
    } else if (v.type == GgufType::kArray) {
      v.array_type = read_type(r);
      const uint64_t n = r.get<uint64_t>();
      if (v.array_type == GgufType::kArray) r.fail("nested arrays are not supported");
      const uint64_t min_size = v.array_type == GgufType::kString ? 8 : scalar_size(v.array_type);
      if (n > (r.size() - r.pos()) / std::max<uint64_t>(1, min_size))
        r.fail("array of " + std::to_string(n) + " elements beyond end of file");
      for (uint64_t j = 0; j < n; ++j) {
        if (v.array_type == GgufType::kString) {
          v.strings.push_back(r.str());
        } else {
          GgufValue e;
          read_scalar(r, v.array_type, e);
          if (v.array_type == GgufType::kFloat32 || v.array_type == GgufType::kFloat64)
            v.floats.push_back(e.f);
          else
            v.ints.push_back(e.i);
        }
      }
    } else {
      read_scalar(r, v.type, v);
    }
    g.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = g.find("general.alignment")) {
    if (a->type != GgufType::kUint32 || a->u == 0 || (a->u & (a->u - 1)) != 0)
      r.fail("general.alignment must be a power-of-two uint32");
    g.alignment = a->u;
  }
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    t.name = r.str();
    const uint32_t n_dims = r.get<uint32_t>();
    if (n_dims == 0 || n_dims > 4)
      r.fail("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dims");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r.get<uint64_t>();
      if (ne == 0 || numel > std::numeric_limits<uint64_t>::max() / ne)
        r.fail("tensor '" + t.name + "' has a bad shape");
      numel *= ne;
      t.ne.push_back(ne);
    }
    t.type = r.get<uint32_t>();
    t.offset = r.get<uint64_t>();
    if (t.offset % g.alignment != 0) r.fail("tensor '" + t.name + "' offset is not aligned");
    // Sized for every type with a known block layout (quant.h); 0 for the others, which a
    // reader of the data refuses by name.
    if (const std::optional<GgmlBlockLayout> layout = ggml_block_layout(t.type)) {
      if (t.ne[0] % layout->block_elems != 0)
        r.fail("tensor '" + t.name + "': rows of " + std::to_string(t.ne[0]) +
               " elements are not whole " + layout->name + " blocks of " +
               std::to_string(layout->block_elems));
      t.nbytes = numel / layout->block_elems * layout->block_bytes;
    }
    g.tensors.push_back(std::move(t));
  }
  g.data_offset = gguf_align_up(r.pos(), g.alignment);
  for (const auto& t : g.tensors) {
    if (t.offset > g.file_size || t.nbytes > g.file_size - t.offset ||
        g.data_offset > g.file_size - t.offset - t.nbytes)
      r.fail("tensor '" + t.name + "' data lies beyond the end of the file");
  }
  return g;
}

}  // namespace blend
