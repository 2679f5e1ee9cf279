#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <optional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"

namespace blend {
namespace {

TensorToWrite iota_tensor(std::string name, DType dtype, std::vector<int64_t> shape) {
  TensorToWrite t{std::move(name), dtype, std::move(shape), nullptr};
  t.fill = [dtype](size_t offset, std::span<std::byte> out) {
    const size_t es = dtype_size(dtype);
    for (size_t i = 0; i < out.size() / es; ++i) {
      const float v = static_cast<float>(offset / es + i) * 0.5f;
      if (dtype == DType::kF32) {
        std::memcpy(out.data() + i * 4, &v, 4);
      } else {
        const uint16_t h = dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(out.data() + i * 2, &h, 2);
      }
    }
  };
  return t;
}

// Rewrites the JSON header of a safetensors file (keeping the data section).
void patch_header(const std::filesystem::path& path,
                  const std::function<void(nlohmann::json&)>& edit) {
  std::string bytes = testing::read_file(path);
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len));
  edit(header);
  std::string text = header.dump();
  const uint64_t new_len = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &new_len, 8);
  testing::write_file(path, out + text + bytes.substr(8 + len));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Several threads write chunks at their offsets: the same bytes as one thread's stream, here
// with tensors of several 16 MiB chunks, empty and tiny ones between them.
TEST(Safetensors, ParallelWriteGivesTheSameBytes) {
  testing::TempDir dir;
  const std::vector<TensorToWrite> tensors = {
      iota_tensor("a", DType::kF32, {3}), iota_tensor("big", DType::kF32, {5, 1 << 21}),
      iota_tensor("empty", DType::kBF16, {0, 4}), iota_tensor("b", DType::kBF16, {1 << 23, 3}),
      iota_tensor("c", DType::kF16, {7})};
  write_safetensors(dir / "one.safetensors", tensors, {{"format", "pt"}});
  write_safetensors(dir / "three.safetensors", tensors, {{"format", "pt"}}, 3);
  EXPECT_TRUE(testing::read_file(dir / "one.safetensors") ==
              testing::read_file(dir / "three.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "three.safetensors.tmp"));
  const auto file = SafetensorsFile::open(dir / "three.safetensors");
  EXPECT_EQ(file->tensors().at("big").at((5 << 21) - 1), static_cast<float>((5 << 21) - 1) * 0.5f);
}

// A fill that throws on one thread stops the others, and no file (nor its temporary) is left.
TEST(Safetensors, ParallelWriteFailureLeavesNoFile) {
  testing::TempDir dir;
  TensorToWrite bad = iota_tensor("bad", DType::kF32, {1 << 24});
  bad.fill = [](size_t offset, std::span<std::byte> out) {
    if (offset >= (32u << 20)) throw Error("fill failed at " + std::to_string(offset));
    std::memset(out.data(), 0, out.size());
  };
  const auto path = dir / "model.safetensors";
  EXPECT_NE(error_of([&] { write_safetensors(path, {bad}, {}, 4); }).find("fill failed"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.tmp"));
}

TEST(Safetensors, WriteThenReadEveryDtype) {
  testing::TempDir dir;
  const auto path = dir / "model.safetensors";
  write_safetensors(
      path,
      {iota_tensor("a", DType::kF32, {3, 5}), iota_tensor("b", DType::kBF16, {7}),
       iota_tensor("c", DType::kF16, {2, 2, 3}), iota_tensor("empty", DType::kF32, {0, 4})},
      {{"format", "pt"}});
  auto file = SafetensorsFile::open(path);
  ASSERT_EQ(file->tensors().size(), 4u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  const TensorView& a = file->tensors().at("a");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(a.nbytes, 60u);
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.at(i), 0.5f * static_cast<float>(i));
  const TensorView& b = file->tensors().at("b");
  EXPECT_EQ(b.dtype, DType::kBF16);
  EXPECT_EQ(b.at(6), 3.0f);
  const TensorView& c = file->tensors().at("c");
  EXPECT_EQ(c.dtype, DType::kF16);
  EXPECT_EQ(c.at(11), 5.5f);
  EXPECT_EQ(file->tensors().at("empty").numel(), 0);
  // The header is padded to 8 bytes, as the reference writer does.
  uint64_t header_len;
  std::memcpy(&header_len, testing::read_file(path).data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
}

// A Q8_0 tensor is U8 bytes [rows, 34 x blocks] named Q8_0 in the metadata; it reads back as a
// [rows, values] view of dtype Q8_0 whose elements are d * q. Anything inconsistent is refused.
TEST(Safetensors, Q8_0TensorsAreU8BytesNamedInTheMetadata) {
  testing::TempDir dir;
  const auto path = dir / "model.safetensors";
  // Two rows of two blocks: block b of row r has scale (r + 1) * 0.5 and values e - 16.
  auto q8 = [](size_t offset, std::span<std::byte> out) {
    for (size_t i = 0; i < out.size(); ++i) {
      const size_t at = offset + i, block = at / 34, byte = at % 34;
      const uint16_t h = f32_to_f16(static_cast<float>(block / 2 + 1) * 0.5f);
      out[i] = byte < 2 ? static_cast<std::byte>(h >> (8 * byte))
                        : static_cast<std::byte>(int8_t(byte - 2 - 16));
    }
  };
  write_safetensors(path, {{"w", DType::kQ8_0, {2, 64}, q8}, iota_tensor("n", DType::kF32, {3})},
                    {{"format", "pt"}});
  const nlohmann::json header = [&] {
    const std::string bytes = testing::read_file(path);
    uint64_t len;
    std::memcpy(&len, bytes.data(), 8);
    return nlohmann::json::parse(bytes.substr(8, len));
  }();
  EXPECT_EQ(header["w"]["dtype"], "U8");
  EXPECT_EQ(header["w"]["shape"], nlohmann::json({2, 68}));
  EXPECT_EQ(header["__metadata__"]["blend.dtype.w"], "Q8_0");
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  auto file = SafetensorsFile::open(path);
  const TensorView& w = file->tensors().at("w");
  EXPECT_EQ(w.dtype, DType::kQ8_0);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(w.nbytes, 136u);
  EXPECT_EQ(w.at(0), -8.0f);        // row 0, block 0: 0.5 * -16
  EXPECT_EQ(w.at(33), 0.5f * -15);  // row 0, block 1, value 1
  EXPECT_EQ(w.at(64 + 31), 15.0f);  // row 1: scale 1.0, value 15
  EXPECT_EQ(tensor_bytes(DType::kQ8_0, {2, 64}), 136u);
  EXPECT_THROW(dtype_size(DType::kQ8_0), Error);

  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"a block type not read", [](auto& h) { h["__metadata__"]["blend.dtype.w"] = "Q5_K"; },
       "the block types read are Q8_0, Q5_0, Q4_K and Q6_K"},
      {"another block type's row bytes",
       [](auto& h) { h["__metadata__"]["blend.dtype.w"] = "Q4_K"; },
       "a Q4_K tensor is stored as U8 [rows, 144 x blocks]"},
      {"a tensor that is not there",
       [](auto& h) { h["__metadata__"]["blend.dtype.missing"] = "Q8_0"; }, "names no tensor"},
      {"a float tensor named Q8_0", [](auto& h) { h["__metadata__"]["blend.dtype.n"] = "Q8_0"; },
       "stored as U8"},
      {"rows not whole blocks",
       [](auto& h) {
         h["w"]["shape"] = {8, 17};
       },
       "34 x blocks"},
      {"U8 without the key", [](auto& h) { h["__metadata__"].erase("blend.dtype.w"); },
       "unsupported dtype U8"},
  };
  const std::string good = testing::read_file(path);
  for (const Case& c : cases) {
    testing::write_file(path, good);
    patch_header(path, c.edit);
    const std::string msg = error_of([&] { SafetensorsFile::open(path); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
  }
}

TEST(Safetensors, TruncatedFileNamesFileAndTensor) {
  testing::TempDir dir;
  const auto path = dir / "model.safetensors";
  write_safetensors(path, {iota_tensor("first", DType::kF32, {16}),
                           iota_tensor("layers.0.weight", DType::kF32, {64})});
  const std::string bytes = testing::read_file(path);
  testing::write_file(path, bytes.substr(0, bytes.size() - 10));
  const std::string msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layers.0.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

  // Cut inside the header, and below the length prefix.
  testing::write_file(path, bytes.substr(0, 20));
  EXPECT_NE(error_of([&] { SafetensorsFile::open(path); }).find("header"), std::string::npos);
  testing::write_file(path, bytes.substr(0, 5));
  EXPECT_NE(error_of([&] { SafetensorsFile::open(path); }).find("truncated"), std::string::npos);
  testing::write_file(path, "");
  EXPECT_THROW(SafetensorsFile::open(path), Error);
}

TEST(Safetensors, CorruptedHeadersAreErrors) {
  testing::TempDir dir;
  const auto path = dir / "m.safetensors";
  auto fresh = [&] {
    write_safetensors(
        path, {iota_tensor("w", DType::kBF16, {4, 4}), iota_tensor("v", DType::kBF16, {4})});
  };
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"shape/size mismatch",
       [](auto& h) {
         h["w"]["shape"] = {4, 5};
       },
       "needs"},
      {"reversed offsets",
       [](auto& h) {
         h["w"]["data_offsets"] = {32, 0};
       },
       "reversed"},
      {"past the end",
       [](auto& h) {
         h["v"]["data_offsets"] = {32, 4000};
       },
       "truncated"},
      {"overlap",
       [](auto& h) {
         h["v"]["data_offsets"] = {0, 8};
         h["v"]["shape"] = {4};
       },
       "overlap"},
      {"bad dtype", [](auto& h) { h["w"]["dtype"] = "I64"; }, "unsupported dtype"},
      {"negative dim",
       [](auto& h) {
         h["w"]["shape"] = {-4, -4};
       },
       "negative"},
      {"missing offsets", [](auto& h) { h["w"].erase("data_offsets"); }, "data_offsets"},
      {"not an object", [](auto& h) { h = nlohmann::json::array(); }, "not a JSON object"},
  };
  for (const auto& c : cases) {
    fresh();
    patch_header(path, c.edit);
    const std::string msg = error_of([&] { SafetensorsFile::open(path); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find("m.safetensors"), std::string::npos) << c.what << ": " << msg;
  }
  // A header length far beyond the file.
  fresh();
  std::string bytes = testing::read_file(path);
  const uint64_t huge = 1ull << 40;
  std::memcpy(bytes.data(), &huge, 8);
  testing::write_file(path, bytes);
  EXPECT_NE(error_of([&] { SafetensorsFile::open(path); }).find("header length"),
            std::string::npos);
  // Garbage JSON.
  fresh();
  bytes = testing::read_file(path);
  bytes[9] = '#';
  testing::write_file(path, bytes);
  EXPECT_NE(error_of([&] { SafetensorsFile::open(path); }).find("invalid JSON"), std::string::npos);
  // A number beyond a double (JSON's out_of_range, not a parse_error): found by bench/fuzz.sh,
  // it escaped SafetensorsFile::open as an uncaught exception and aborted the process.
  const std::string text = R"({"w":{"dtype":"F32","shape":[],"data_offsets":[0,44e4444]}})";
  const uint64_t len = text.size();
  std::string overflow(8, '\0');
  std::memcpy(overflow.data(), &len, 8);
  testing::write_file(path, overflow + text + "abcd");
  EXPECT_NE(error_of([&] { SafetensorsFile::open(path); }).find("number overflow"),
            std::string::npos);
}

// Writes a two-tensor file by hand with `pad` spaces after the JSON and `header_len` as the
// length prefix (default: the true length).
std::string hand_written(size_t pad, std::optional<uint64_t> header_len = std::nullopt) {
  const std::string text =
      std::string(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)") +
      R"("v":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})" + std::string(pad, ' ');
  const uint64_t len = header_len.value_or(text.size());
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  const float data[3] = {1.0f, 2.0f, 3.0f};
  return out + text + std::string(reinterpret_cast<const char*>(data), sizeof(data));
}

TEST(Safetensors, DataSectionMustBeCoveredExactly) {
  testing::TempDir dir;
  const auto path = dir / "m.safetensors";
  testing::write_file(path, hand_written(4));
  EXPECT_EQ(SafetensorsFile::open(path)->tensors().at("v").at(0), 3.0f);

  // A length prefix one byte short still parses (the header ends in padding) but shifts every
  // tensor by a byte: it used to load and give NaN logits. Now the spare byte is refused.
  const size_t true_len = hand_written(4).size() - 8 - 12;
  testing::write_file(path, hand_written(4, true_len - 1));
  std::string msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find("1 trailing bytes"), std::string::npos) << msg;

  // Trailing bytes after the last tensor.
  testing::write_file(path, hand_written(4) + "x");
  msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find("trailing"), std::string::npos) << msg;

  // A gap before a tensor, and a gap at the start.
  write_safetensors(path, {iota_tensor("w", DType::kF32, {4}), iota_tensor("v", DType::kF32, {2})});
  patch_header(path, [](auto& h) { h.erase("w"); });
  msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find("16 bytes before tensor 'v' belong to no tensor"), std::string::npos) << msg;
  // Tensors stored out of header order but tiling the data are fine (the reference sorts).
  write_safetensors(path, {iota_tensor("w", DType::kF32, {4}), iota_tensor("v", DType::kF32, {2})});
  patch_header(path, [](auto& h) {
    h["v"]["data_offsets"] = {0, 8};
    h["w"]["data_offsets"] = {8, 24};
  });
  EXPECT_EQ(SafetensorsFile::open(path)->tensors().size(), 2u);

  // The header must start with '{' and __metadata__ must map strings to strings.
  std::string bytes = hand_written(4);
  const uint64_t len = true_len;
  bytes = bytes.substr(0, 8) + " " + bytes.substr(8, len - 1) + bytes.substr(8 + len);
  testing::write_file(path, bytes);
  msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find("does not start with '{'"), std::string::npos) << msg;
  write_safetensors(path, {iota_tensor("w", DType::kF32, {4})});
  patch_header(path, [](auto& h) { h["__metadata__"] = {{"format", 1}}; });
  msg = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_NE(msg.find("__metadata__['format']"), std::string::npos) << msg;
}

TEST(Safetensors, NonRegularFilesAreRefusedWithoutBlocking) {
  testing::TempDir dir;
  const auto path = dir / "model.safetensors";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  // Opening a FIFO for reading blocks until a writer comes. Run the open aside; if it has not
  // answered in 20 s, open the FIFO for writing so the reader wakes up, and fail.
  auto result = std::async(std::launch::async,
                           [&] { return error_of([&] { TensorStore::open_dir(dir.path()); }); });
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    ADD_FAILURE() << "opening a FIFO named model.safetensors blocked";
  }
  const std::string msg = result.get();
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;

  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  EXPECT_NE(error_of([&] { SafetensorsFile::open(path); }).find("not a regular file"),
            std::string::npos);
}

TEST(Safetensors, ShardedStoreWithIndex) {
  testing::TempDir dir;
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {iota_tensor("x", DType::kF32, {2}), iota_tensor("y", DType::kF32, {3})});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {iota_tensor("z", DType::kF32, {4})});
  nlohmann::json index = {{"weight_map",
                           {{"x", "model-00001-of-00002.safetensors"},
                            {"y", "model-00001-of-00002.safetensors"},
                            {"z", "model-00002-of-00002.safetensors"}}}};
  testing::write_file(dir / "model.safetensors.index.json", index.dump());
  TensorStore store = TensorStore::open_dir(dir.path());
  EXPECT_EQ(store.tensors().size(), 3u);
  EXPECT_EQ(store.get("z").at(3), 1.5f);
  EXPECT_EQ(store.get("z", {4}).numel(), 4);
  EXPECT_NE(error_of([&] { store.get("z", {2, 2}); }).find("expected [2, 2]"), std::string::npos);
  EXPECT_NE(error_of([&] { store.get("nope"); }).find("missing tensor 'nope'"), std::string::npos);

  // The index names a tensor its shard does not hold.
  index["weight_map"]["w"] = "model-00002-of-00002.safetensors";
  testing::write_file(dir / "model.safetensors.index.json", index.dump());
  EXPECT_NE(error_of([&] { TensorStore::open_dir(dir.path()); }).find("'w'"), std::string::npos);
  // The index points outside the folder.
  index["weight_map"]["w"] = "../evil.safetensors";
  testing::write_file(dir / "model.safetensors.index.json", index.dump());
  EXPECT_NE(error_of([&] { TensorStore::open_dir(dir.path()); }).find("outside"),
            std::string::npos);
  // A shard is missing.
  index["weight_map"].erase("w");
  testing::write_file(dir / "model.safetensors.index.json", index.dump());
  std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
  EXPECT_NE(error_of([&] { TensorStore::open_dir(dir.path()); }).find("model-00002"),
            std::string::npos);
}

TEST(Safetensors, EmptyFolderIsAnError) {
  testing::TempDir dir;
  EXPECT_THROW(TensorStore::open_dir(dir.path()), Error);
}

}  // namespace
}  // namespace blend
