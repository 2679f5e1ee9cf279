#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"

namespace blend {
namespace {

using nlohmann::json;

// A header larger than this is corruption, not a model (the reference reader uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw Error(path.string() + ": " + what);
}

}  // namespace

void store_float(float v, DType dtype, std::byte* out) {
  if (dtype == DType::kF32) {
    std::memcpy(out, &v, 4);
    return;
  }
  const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
  std::memcpy(out, &h, 2);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float TensorView::at(int64_t i) const {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, data + i * 4, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, data + i * 2, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, data + i * 2, 2);
      return f16_to_f32(h);
    }
    case DType::kQ8_0:
    case DType::kQ5_0:
    case DType::kQ4_K:
    case DType::kQ6_K: {
      const int64_t cols = shape.empty() ? 1 : shape.back();
      return block_row_element(dtype, data + i / cols * row_bytes(dtype, cols), i % cols);
    }
  }
  return 0.0f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const int fd = open_regular_fd(path);  // a FIFO would block mmap's reader forever
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, "cannot stat");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(path, "truncated: " + std::to_string(file_size) + " bytes, no header");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) fail(path, std::string("mmap failed: ") + std::strerror(errno));
  file->map_ = map;
  file->map_size_ = file_size;
  const auto* base = static_cast<const std::byte*>(map);

  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian on every machine we build for
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8)
    fail(path, "corrupted or truncated: header length " + std::to_string(header_len) +
                   " exceeds the file (" + std::to_string(file_size) + " bytes)");
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base) + 8,
                         reinterpret_cast<const char*>(base) + 8 + header_len);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    fail(path, std::string("corrupted header (invalid JSON): ") + e.what());
  }
  if (!header.is_object()) fail(path, "corrupted header: not a JSON object");
  // The reference reader requires the header to start with '{' (trailing spaces pad it).
  if (static_cast<char>(base[8]) != '{') fail(path, "corrupted header: does not start with '{'");

  const std::byte* data = base + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;
  struct Range {
    uint64_t begin, end;
    std::string name;
    bool operator<(const Range& o) const { return std::tie(begin, end) < std::tie(o.begin, o.end); }
  };
  std::vector<Range> ranges;
  if (auto meta = header.find("__metadata__"); meta != header.end()) {
    if (!meta->is_object()) fail(path, "__metadata__ is not an object");
    for (const auto& [k, v] : meta->items()) {
      if (!v.is_string()) fail(path, "__metadata__['" + k + "'] is not a string");
      file->metadata_[k] = v.get<std::string>();
    }
  }
  // Block-quantized tensors (U8 bytes of their blocks, each named in the metadata), each found.
  std::map<std::string, DType> block_tensors;
  for (const auto& [key, value] : file->metadata_)
    if (key.starts_with(kBlockDtypeKey)) {
      const std::string name = key.substr(kBlockDtypeKey.size());
      const std::optional<DType> block = parse_block_dtype(value);
      if (!block)
        fail(path, "__metadata__['" + key + "'] is '" + value +
                       "'; the block types read are Q8_0, Q5_0, Q4_K and Q6_K");
      if (!header.contains(name))
        fail(path, "__metadata__['" + key + "'] names no tensor of the file");
      block_tensors[name] = *block;
    }
  for (const auto& item : header.items()) {
    // Not a structured binding: clang 14 (the fuzz build) cannot capture one in `bad` below.
    const std::string& name = item.key();
    const json& entry = item.value();
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& what) { fail(path, "tensor '" + name + "': " + what); };
    if (!entry.is_object()) bad("entry is not an object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) bad("missing dtype");
    if (sh == entry.end() || !sh->is_array()) bad("missing shape");
    if (off == entry.end() || !off->is_array() || off->size() != 2 ||
        !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      bad("missing or malformed data_offsets");
    const auto found = block_tensors.find(name);
    const bool block = found != block_tensors.end();
    const auto dtype =
        block ? std::optional<DType>(found->second) : parse_dtype(dt->get<std::string>());
    if (block && dt->get<std::string>() != "U8")
      bad("is " + dt->get<std::string>() + " but __metadata__ names it " +
          std::string(dtype_name(*dtype)) + " (stored as U8 bytes)");
    if (!dtype) bad("unsupported dtype " + dt->get<std::string>() + " (supported: BF16, F16, F32)");

    TensorView view;
    view.name = name;
    view.dtype = *dtype;
    view.file = &file->path_;
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) bad("shape holds a negative or non-integer dimension");
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim)
        bad("shape overflows");
      numel *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    if (block) {  // stored [rows, bytes of a row]; the view's shape is [rows, elements]
      const int64_t bytes = block_bytes(*dtype);
      if (view.shape.size() != 2 || view.shape[1] % bytes != 0)
        bad("a " + std::string(dtype_name(*dtype)) + " tensor is stored as U8 [rows, " +
            std::to_string(bytes) + " x blocks], not " + shape_string(view.shape));
      view.shape[1] = view.shape[1] / bytes * block_elems(*dtype);
    }
    const uint64_t begin = (*off)[0].get<uint64_t>();
    const uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end) bad("data_offsets are reversed");
    if (end > data_size)
      bad("data ends at byte " + std::to_string(end) + " but the file holds only " +
          std::to_string(data_size) + " data bytes (truncated?)");
    const uint64_t expected = block ? numel : numel * dtype_size(*dtype);
    if (end - begin != expected)
      bad("holds " + std::to_string(end - begin) + " bytes but shape " + shape_string(view.shape) +
          " of " + std::string(dtype_name(*dtype)) + " needs " + std::to_string(expected));
    view.data = data + begin;
    view.nbytes = static_cast<size_t>(expected);
    ranges.push_back({begin, end, name});
    file->tensors_.emplace(name, std::move(view));
  }
  // As the reference reader (safetensors' Metadata::validate): sorted by offset, the tensors
  // tile the data section exactly, from byte 0 to its last byte, with no gap and no overlap.
  // A header length off by one shifts every tensor by a byte and leaves one byte over.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const Range& r : ranges) {
    if (r.begin < covered)
      fail(path, "corrupted: tensor '" + r.name + "' overlaps the tensor before it");
    if (r.begin > covered)
      fail(path, "corrupted: " + std::to_string(r.begin - covered) + " bytes before tensor '" +
                     r.name + "' belong to no tensor");
    covered = r.end;
  }
  if (covered != data_size)
    fail(path, "corrupted: " + std::to_string(data_size - covered) +
                   " trailing bytes after the last tensor (wrong header length?)");
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

std::string language_model_tensor_name(const std::string& name) {
  // transformers 4.50-4.51 saved Gemma3ForConditionalGeneration's text model as
  // language_model.{model.*, lm_head.*}; 4.52 and later as model.language_model.* (and lm_head.*).
  for (const std::string_view wrapped : {"language_model.", "model.language_model."})
    if (name.starts_with(wrapped)) {
      const std::string rest = name.substr(wrapped.size());
      if (wrapped == "language_model.") return rest;  // model.layers..., lm_head.weight
      return "model." + rest;
    }
  return name;
}

TensorStore TensorStore::open_dir(const std::filesystem::path& dir) {
  TensorStore store;
  store.dir_ = dir;
  const auto index_path = dir / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  json weight_map;
  if (path_exists(index_path)) {
    std::ifstream in = open_regular_file(index_path, 64u << 20);
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
      fail(index_path, std::string("invalid JSON: ") + e.what());
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      fail(index_path, "missing weight_map");
    weight_map = index["weight_map"];
    for (const auto& [tensor, shard] : weight_map.items()) {
      if (!shard.is_string()) fail(index_path, "weight_map['" + tensor + "'] is not a file name");
      const std::string s = shard.get<std::string>();
      if (s.find('/') != std::string::npos || s == "..")
        fail(index_path, "weight_map['" + tensor + "'] points outside the folder: " + s);
      if (std::find(shard_names.begin(), shard_names.end(), s) == shard_names.end())
        shard_names.push_back(s);
    }
  } else if (path_exists(dir / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    throw Error(dir.string() + ": no model.safetensors or model.safetensors.index.json");
  }
  std::map<std::string, const TensorView*> as_saved;
  for (const auto& shard : shard_names) {
    store.files_.push_back(SafetensorsFile::open(dir / shard));
    for (const auto& [name, view] : store.files_.back()->tensors()) {
      if (!as_saved.emplace(name, &view).second)
        throw Error(dir.string() + ": tensor '" + name + "' appears in more than one shard");
    }
  }
  if (!weight_map.is_null()) {
    for (const auto& [tensor, shard] : weight_map.items()) {
      auto it = as_saved.find(tensor);
      if (it == as_saved.end() || it->second->file->filename() != shard.get<std::string>())
        throw Error(index_path.string() + ": tensor '" + tensor + "' is not in " +
                    shard.get<std::string>());
    }
  }
  for (const auto& [name, view] : as_saved) {
    const std::string text_name = language_model_tensor_name(name);
    if (!store.tensors_.emplace(text_name, view).second)
      throw Error(dir.string() + ": tensor '" + text_name + "' is saved twice (as '" + name +
                  "' and under the text model's name)");
  }
  return store;
}

const TensorView& TensorStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(dir_.string() + ": missing tensor '" + name + "'");
  return *it->second;
}

const TensorView& TensorStore::get(const std::string& name,
                                   const std::vector<int64_t>& shape) const {
  const TensorView& t = get(name);
  if (t.shape != shape)
    throw Error(t.file->string() + ": tensor '" + name + "' has shape " + shape_string(t.shape) +
                ", expected " + shape_string(shape));
  return t;
}

namespace {

constexpr size_t kWriteChunkBytes = 16u << 20;

void pwrite_all(int fd, const std::byte* data, size_t n, uint64_t offset,
                const std::filesystem::path& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(path, std::string("write failed: ") + std::strerror(errno));
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}

// The data part of write_safetensors on `threads` threads: every chunk of every tensor filled
// into a buffer of its thread's own and written at its offset in the file.
void write_chunks_in_parallel(const std::filesystem::path& tmp, const std::string& head,
                              const std::vector<TensorToWrite>& tensors,
                              const std::vector<uint64_t>& sizes, int threads) {
  struct Chunk {
    size_t tensor;
    uint64_t offset;  // in the tensor
    size_t bytes;
    uint64_t file_offset;
  };
  std::vector<Chunk> chunks;
  uint64_t pos = head.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (uint64_t done = 0; done < sizes[i]; done += kWriteChunkBytes)
      chunks.push_back({i, done,
                        static_cast<size_t>(std::min<uint64_t>(kWriteChunkBytes, sizes[i] - done)),
                        pos + done});
    pos += sizes[i];
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  const auto worker = [&] {
    try {
      std::vector<std::byte> buffer(kWriteChunkBytes);
      for (size_t c; !failed && (c = next++) < chunks.size();) {
        const Chunk& k = chunks[c];
        tensors[k.tensor].fill(static_cast<size_t>(k.offset),
                               std::span<std::byte>(buffer.data(), k.bytes));
        pwrite_all(fd, buffer.data(), k.bytes, k.file_offset, tmp);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  try {
    pwrite_all(fd, reinterpret_cast<const std::byte*>(head.data()), head.size(), 0, tmp);
  } catch (...) {
    error = std::current_exception();
  }
  if (!error) {
    std::vector<std::thread> pool;
    const size_t n_threads =
        std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(chunks.size(), 1));
    for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();
  }
  if (::close(fd) != 0 && !error) {
    try {
      fail(tmp, std::string("write failed: ") + std::strerror(errno));
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    std::rethrow_exception(error);
  }
}

}  // namespace

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata, int threads) {
  json header = json::object();
  std::map<std::string, std::string> all_metadata = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    const uint64_t n = tensor_bytes(t.dtype, t.shape);
    if (is_block_type(t.dtype)) {
      if (t.shape.size() != 2)
        throw Error("tensor '" + t.name + "': a block-quantized tensor is 2-D");
      const std::vector<int64_t> stored = {t.shape[0], static_cast<int64_t>(n) / t.shape[0]};
      header[t.name] = {{"dtype", "U8"}, {"shape", stored}, {"data_offsets", {offset, offset + n}}};
      all_metadata[std::string(kBlockDtypeKey) + t.name] = std::string(dtype_name(t.dtype));
    } else {
      header[t.name] = {{"dtype", dtype_name(t.dtype)},
                        {"shape", t.shape},
                        {"data_offsets", {offset, offset + n}}};
    }
    sizes.push_back(n);
    offset += n;
  }
  if (!all_metadata.empty()) header["__metadata__"] = all_metadata;
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  const auto tmp = std::filesystem::path(path.string() + ".tmp");
  if (threads > 1) {
    const uint64_t header_len = header_text.size();
    std::string head(reinterpret_cast<const char*>(&header_len), 8);
    head += header_text;
    write_chunks_in_parallel(tmp, head, tensors, sizes, threads);
    std::filesystem::rename(tmp, path);
    return;
  }
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot write " + tmp.string());
  const uint64_t header_len = header_text.size();
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  std::vector<std::byte> chunk(kWriteChunkBytes);
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (uint64_t done = 0; done < sizes[i];) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), sizes[i] - done));
      tensors[i].fill(static_cast<size_t>(done), std::span<std::byte>(chunk.data(), n));
      out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(n));
      done += n;
    }
  }
  out.close();
  if (!out) throw Error("write failed: " + tmp.string());
  std::filesystem::rename(tmp, path);
}

}  // namespace blend
