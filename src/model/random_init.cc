#include "model/random_init.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/safetensors.h"

namespace blend {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Uniform in [-1, 1) from the top 24 bits of the counter-based hash.
inline float unit_uniform(uint64_t key, int64_t index) {
  const uint64_t r = splitmix64(key ^ (static_cast<uint64_t>(index) * 0xd1b54a32d192ed03ull));
  return static_cast<float>(static_cast<int64_t>(r >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

struct Distribution {
  float center = 0.0f;
  float half_width = 0.0f;  // uniform(center - hw, center + hw)
};

// Scales keep activations O(1) through every layer: linear layers have std 1/sqrt(fan_in);
// the two projections that write into the residual stream are further scaled by
// 1/sqrt(2 * layers) (GPT-2's residual scaling) so the stream does not grow with depth.
// Norm weights sit near 1 but not at 1, so a test notices if a norm weight is ignored.
Distribution distribution(const TensorSpec& spec, const ModelConfig& c) {
  const float sqrt3 = std::sqrt(3.0f);  // uniform(-a, a) has std a / sqrt(3)
  using K = TensorSpec::Kind;
  switch (spec.kind) {
    case K::kEmbedding:
      return {0.0f, sqrt3 * 1.0f};
    case K::kNorm:
      return {1.0f, 0.1f};
    case K::kBias:
      return {0.0f, 0.02f};
    case K::kLinear:
      return {0.0f, sqrt3 / std::sqrt(static_cast<float>(spec.fan_in))};
    case K::kResidualOutput:
      return {0.0f, sqrt3 / std::sqrt(static_cast<float>(spec.fan_in) * 2.0f *
                                      static_cast<float>(c.num_layers))};
    case K::kLmHead:
      return {0.0f, sqrt3 / std::sqrt(static_cast<float>(spec.fan_in))};
  }
  return {};
}

uint64_t bytes_of(const TensorSpec& spec, DType dtype) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
  return n;
}

void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw Error("cannot write " + path.string());
}

// The per-tensor part of the generator, computed once per tensor rather than per element.
struct TensorGenerator {
  TensorGenerator(const TensorSpec& spec, const ModelConfig& config, uint64_t seed)
      : dist(distribution(spec, config)), key(splitmix64(seed ^ fnv1a(spec.name))) {}
  float operator()(int64_t index) const {
    return dist.center + dist.half_width * unit_uniform(key, index);
  }
  Distribution dist;
  uint64_t key;
};

}  // namespace

float random_init_value(const TensorSpec& spec, const ModelConfig& config, uint64_t seed,
                        int64_t index) {
  return TensorGenerator(spec, config, seed)(index);
}

std::filesystem::path default_tokenizer_dir() {
  if (const char* env = std::getenv("BLEND_TOKENIZER_DIR"); env && *env) return env;
#ifdef BLEND_DEFAULT_TOKENIZER_DIR
  return BLEND_DEFAULT_TOKENIZER_DIR;
#else
  return {};
#endif
}

void write_random_model(const ModelConfig& config, const std::filesystem::path& out_dir,
                        const RandomInitOptions& options) {
  config.validate();
  const auto specs = llama_tensor_specs(config);
  uint64_t total = 0;
  for (const auto& s : specs) total += bytes_of(s, options.dtype);
  if (total > options.max_total_bytes)
    throw Error("model would take " + std::to_string(total >> 20) + " MiB, over the " +
                std::to_string(options.max_total_bytes >> 20) +
                " MiB limit for generated models (use it as a shape in the simulator instead)");
  // The nearest existing folder at or above out_dir holds the file system it will be written to.
  std::filesystem::path existing = std::filesystem::absolute(out_dir);
  while (!std::filesystem::exists(existing) && existing.has_parent_path() &&
         existing.parent_path() != existing)
    existing = existing.parent_path();
  std::error_code space_error;
  const std::filesystem::space_info space = std::filesystem::space(existing, space_error);
  uint64_t replaced = 0;  // the weights of an earlier init into the same folder
  if (std::filesystem::is_directory(out_dir))
    for (const auto& entry : std::filesystem::directory_iterator(out_dir))
      if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
        replaced += entry.file_size();
  if (!space_error && total > space.available + replaced)
    throw Error("model would take " + std::to_string(total >> 20) + " MiB, and " +
                existing.string() + " has " + std::to_string(space.available >> 20) + " MiB free");
  const auto tok_json = options.tokenizer_dir / "tokenizer.json";
  const auto tok_config = options.tokenizer_dir / "tokenizer_config.json";
  if (!std::filesystem::exists(tok_json) || !std::filesystem::exists(tok_config))
    throw Error("tokenizer files not found in '" + options.tokenizer_dir.string() +
                "' (run scripts/setup.sh, or pass --tokenizer DIR)");

  std::filesystem::create_directories(out_dir);
  ModelConfig written = config;
  written.dtype = options.dtype;
  write_json(out_dir / "config.json", written.to_json());
  nlohmann::json gen = {{"do_sample", false}};
  if (config.bos_token_id) gen["bos_token_id"] = *config.bos_token_id;
  if (!config.eos_token_ids.empty()) gen["eos_token_id"] = config.eos_token_ids;
  write_json(out_dir / "generation_config.json", gen);
  std::filesystem::copy_file(tok_json, out_dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(tok_config, out_dir / "tokenizer_config.json",
                             std::filesystem::copy_options::overwrite_existing);

  // Group tensors into shards (one when max_shard_bytes is 0).
  std::vector<std::vector<const TensorSpec*>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& s : specs) {
    const uint64_t n = bytes_of(s, options.dtype);
    if (options.max_shard_bytes && in_shard > 0 && in_shard + n > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&s);
    in_shard += n;
  }

  const DType dtype = options.dtype;
  const size_t esize = dtype_size(dtype);
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t si = 0; si < shards.size(); ++si) {
    std::vector<TensorToWrite> tensors;
    for (const TensorSpec* spec : shards[si]) {
      TensorToWrite t;
      t.name = spec->name;
      t.dtype = dtype;
      t.shape = spec->shape;
      // Each element is a pure function of its index: the chunks may be filled in any order,
      // on any thread, without changing a byte.
      t.fill = [gen = TensorGenerator(*spec, config, options.seed), dtype, esize](
                   size_t offset, std::span<std::byte> out) {
        const int64_t first = static_cast<int64_t>(offset / esize);
        const int64_t count = static_cast<int64_t>(out.size() / esize);
        std::byte* data = out.data();
        if (dtype == DType::kF32) {
          for (int64_t i = 0; i < count; ++i) {
            const float v = gen(first + i);
            std::memcpy(data + i * 4, &v, 4);
          }
        } else {
          const bool bf16 = dtype == DType::kBF16;
          for (int64_t i = 0; i < count; ++i) {
            const float v = gen(first + i);
            const uint16_t h = bf16 ? f32_to_bf16(v) : f32_to_f16(v);
            std::memcpy(data + i * 2, &h, 2);
          }
        }
      };
      tensors.push_back(std::move(t));
    }
    const std::string file_name =
        shards.size() == 1 ? "model.safetensors"
                           : "model-" + std::to_string(100001 + si).substr(1) + "-of-" +
                                 std::to_string(100000 + shards.size()).substr(1) + ".safetensors";
    write_safetensors(out_dir / file_name, tensors, {{"format", "pt"}}, threads);
    for (const TensorSpec* spec : shards[si]) weight_map[spec->name] = file_name;
  }
  const auto index_path = out_dir / "model.safetensors.index.json";
  if (shards.size() > 1) {
    write_json(index_path, {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  } else {
    std::filesystem::remove(index_path);
  }
}

}  // namespace blend
