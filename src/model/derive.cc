#include "model/derive.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend {
namespace {

namespace fs = std::filesystem;

bool is_weight_file(const fs::path& path) {
  return path.extension() == ".safetensors" || path.filename() == "model.safetensors.index.json";
}

// Makes OUT (not BASE) hold every file of BASE but the weights (config, tokenizer, chat
// template), and no weights.
void copy_all_but_weights(const fs::path& base, const fs::path& out) {
  fs::create_directories(out);
  if (fs::equivalent(base, out)) throw Error("model derive: --out must differ from --base");
  for (const auto& entry : fs::directory_iterator(base))
    if (entry.is_regular_file() && !is_weight_file(entry.path()))
      fs::copy_file(entry.path(), out / entry.path().filename(),
                    fs::copy_options::overwrite_existing);
  for (const auto& entry : fs::directory_iterator(out))
    if (is_weight_file(entry.path())) fs::remove(entry.path());
}

std::vector<float> floats_of(const TensorView& view) {
  std::vector<float> v(static_cast<size_t>(view.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = view.at(static_cast<int64_t>(i));
  return v;
}

// c[n x p] = a[n x k] b[k x p], all row-major.
std::vector<float> matmul(const std::vector<float>& a, const std::vector<float>& b, int64_t n,
                          int64_t k, int64_t p) {
  std::vector<float> c(static_cast<size_t>(n * p));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* row = c.data() + i * p;
    for (int64_t j = 0; j < k; ++j) {
      const float s = a[static_cast<size_t>(i * k + j)];
      const float* brow = b.data() + j * p;
      for (int64_t q = 0; q < p; ++q) row[q] += s * brow[q];
    }
  }
  return c;
}

// A [rows x cols] matrix (rows >= cols) with orthonormal columns: Gaussian draws from `seed`
// (splitmix64 and Box-Muller: a function of the seed, up to the last bits of libm's log and
// cos), then modified Gram-Schmidt in double.
std::vector<double> orthonormal_columns(int64_t rows, int64_t cols, uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  auto uniform = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (static_cast<double>((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
  };
  std::vector<double> q(static_cast<size_t>(rows * cols));  // column-major: column c at c * rows
  for (double& v : q)
    v = std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  for (int64_t c = 0; c < cols; ++c) {
    double* col = q.data() + c * rows;
    for (int64_t prev = 0; prev < c; ++prev) {
      const double* p = q.data() + prev * rows;
      double dot = 0;
      for (int64_t r = 0; r < rows; ++r) dot += p[r] * col[r];
      for (int64_t r = 0; r < rows; ++r) col[r] -= dot * p[r];
    }
    double norm = 0;
    for (int64_t r = 0; r < rows; ++r) norm += col[r] * col[r];
    norm = std::sqrt(norm);
    for (int64_t r = 0; r < rows; ++r) col[r] /= norm;
  }
  return q;
}

}  // namespace

void derive_full_finetune(const std::filesystem::path& base, const std::filesystem::path& out,
                          const DeriveOptions& options) {
  const ModelConfig config = ModelConfig::from_dir(base);
  const TensorStore store = TensorStore::open_dir(base);
  check_tensors(config, store);
  if (options.layers.empty()) throw Error("model derive: name the layers to change (--layers)");
  if (!(options.scale > 0 && std::isfinite(options.scale)))
    throw Error("model derive: --scale must be positive and finite");
  std::set<int64_t> layers;
  for (int64_t l : options.layers) {
    if (l < 0 || l >= config.num_layers)
      throw Error("model derive: layer " + std::to_string(l) + " is outside the model's 0.." +
                  std::to_string(config.num_layers - 1));
    layers.insert(l);
  }
  copy_all_but_weights(base, out);

  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& spec : llama_tensor_specs(config)) {
    const TensorView& view = store.get(spec.name);
    bool changed = false;
    for (int64_t l : layers) changed = changed || spec.name.starts_with(layer_tensor_name(l, ""));
    TensorToWrite t;
    t.name = spec.name;
    t.dtype = view.dtype;
    t.shape = view.shape;
    const size_t esize = dtype_size(view.dtype);
    t.fill = [&view, spec, &config, changed, esize, seed = options.seed, scale = options.scale](
                 size_t offset, std::span<std::byte> bytes) {
      if (!changed) {
        std::memcpy(bytes.data(), view.data + offset, bytes.size());
        return;
      }
      const auto first = static_cast<int64_t>(offset / esize);
      for (size_t i = 0; i < bytes.size() / esize; ++i) {
        const int64_t index = first + static_cast<int64_t>(i);
        store_float(view.at(index) +
                        static_cast<float>(scale) * random_init_value(spec, config, seed, index),
                    view.dtype, bytes.data() + i * esize);
      }
    };
    tensors.push_back(std::move(t));
  }
  write_safetensors(out / "model.safetensors", tensors, {{"format", "pt"}});
}

void derive_widened(const std::filesystem::path& base, const std::filesystem::path& out,
                    int64_t hidden, uint64_t seed) {
  const ModelConfig config = ModelConfig::from_dir(base);
  const TensorStore store = TensorStore::open_dir(base);
  const DType dtype = check_tensors(config, store);
  const int64_t from = config.hidden_size;
  if (hidden <= from)
    throw Error("model derive --widen: the new hidden size " + std::to_string(hidden) +
                " must exceed the base's " + std::to_string(from));
  ModelConfig wide = config;
  wide.hidden_size = hidden;
  wide.tie_word_embeddings = false;
  wide.validate();
  copy_all_but_weights(base, out);
  {
    // The base's config.json with the new width, so fields blend does not model stay as written.
    const fs::path path = base / "config.json";
    std::ifstream in(path);
    nlohmann::json j = nlohmann::json::parse(in);
    j["hidden_size"] = hidden;
    j["head_dim"] = config.head_dim;
    j["tie_word_embeddings"] = false;
    std::ofstream(out / "config.json") << j.dump(2) << "\n";
  }

  // q[from x hidden] = Q^T (row a holds column a of Q); q_rows[hidden x from] = Q.
  const std::vector<double> cols = orthonormal_columns(hidden, from, seed);
  std::vector<float> q_t(static_cast<size_t>(from * hidden)), q(q_t.size());
  for (int64_t a = 0; a < from; ++a)
    for (int64_t b = 0; b < hidden; ++b) {
      const auto v = static_cast<float>(cols[static_cast<size_t>(a * hidden + b)]);
      q_t[static_cast<size_t>(a * hidden + b)] = v;
      q[static_cast<size_t>(b * from + a)] = v;
    }
  const auto norm_value = static_cast<float>(std::sqrt(static_cast<double>(from) / hidden));

  // The norm whose output a reading projection takes.
  auto norm_before = [&](const std::string& name) -> std::string {
    if (name == "lm_head.weight") return "model.norm.weight";
    const size_t dot = name.find(".", std::string("model.layers.").size());
    const std::string layer = name.substr(0, dot + 1);
    for (const char* p : {"self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."})
      if (name.rfind(layer + p, 0) == 0) return layer + "input_layernorm.weight";
    for (const char* p : {"mlp.gate_proj.", "mlp.up_proj."})
      if (name.rfind(layer + p, 0) == 0) return layer + "post_attention_layernorm.weight";
    throw Error("model derive --widen: no known norm before " + name);
  };
  // A reading projection w [n x from] becomes w diag(g) Q^T [n x hidden].
  auto reader = [&](const TensorView& w, const std::string& norm) {
    std::vector<float> scaled = floats_of(w);
    const std::vector<float> g = floats_of(store.get(norm));
    const int64_t n = w.shape[0];
    for (int64_t r = 0; r < n; ++r)
      for (int64_t a = 0; a < from; ++a) scaled[static_cast<size_t>(r * from + a)] *= g[a];
    return matmul(scaled, q_t, n, from, hidden);
  };

  std::vector<std::vector<float>> values;
  std::vector<TensorToWrite> tensors;
  auto add = [&](std::string name, std::vector<int64_t> shape, std::vector<float> v) {
    values.push_back(std::move(v));
    tensors.push_back(
        {.name = std::move(name),
         .dtype = dtype,
         .shape = std::move(shape),
         .fill = [data = &values.back(), dtype](size_t offset, std::span<std::byte> bytes) {
           const size_t es = dtype_size(dtype), first = offset / es;
           for (size_t i = 0; i < bytes.size() / es; ++i)
             store_float((*data)[first + i], dtype, bytes.data() + i * es);
         }});
  };
  values.reserve(llama_tensor_specs(wide).size());
  using K = TensorSpec::Kind;
  for (const TensorSpec& spec : llama_tensor_specs(wide)) {
    const TensorView* view = spec.kind == K::kLmHead && config.tie_word_embeddings
                                 ? &store.get("model.embed_tokens.weight")
                                 : &store.get(spec.name);
    switch (spec.kind) {
      case K::kEmbedding:  // rows e become Q e: E Q^T
        add(spec.name, spec.shape, matmul(floats_of(*view), q_t, view->shape[0], from, hidden));
        break;
      case K::kNorm:
        add(spec.name, spec.shape,
            view->numel() == from ? std::vector<float>(static_cast<size_t>(hidden), norm_value)
                                  : floats_of(*view));
        break;
      case K::kBias:
        add(spec.name, spec.shape, floats_of(*view));
        break;
      case K::kLinear:
      case K::kLmHead:
        add(spec.name, spec.shape, reader(*view, norm_before(spec.name)));
        break;
      case K::kResidualOutput:  // w [from x k] becomes Q w
        add(spec.name, spec.shape, matmul(q, floats_of(*view), hidden, from, view->shape[1]));
        break;
    }
  }
  write_safetensors(out / "model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace blend
