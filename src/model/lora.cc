// LoraAdapter — reading adapter_config.json and adapter_model.safetensors as PEFT (0.10 .. 0.17)
// writes them for a LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM base.
//
// Understood: peft_type ("LORA"), task_type (CAUSAL_LM or null), r, lora_alpha, use_rslora,
//   target_modules (a list of the seven projections, "all-linear", or a regex string: the
//   tensors present say which modules are adapted, and must agree with a list),
//   layers_to_transform (null or a list the tensors must agree with), base_model_name_or_path.
// Refused unless at their neutral value (each changes the math): fan_in_fan_out, bias, use_dora,
//   modules_to_save, rank_pattern, alpha_pattern, layer_replication, lora_bias,
//   trainable_token_indices, target_parameters, use_qalora, alora_invocation_tokens,
//   megatron_config, arrow_config.
// Ignored on purpose (training or initialisation only, or bookkeeping): lora_dropout,
//   init_lora_weights, inference_mode, revision, auto_mapping, peft_version, loftq_config,
//   eva_config, corda_config, runtime_config, megatron_core, qalora_group_size, layers_pattern,
//   exclude_modules (the tensors present decide), ensure_weight_tying.
// Any other key is refused: a newer PEFT feature we do not implement could change the outputs.
#include "model/lora.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/regular_file.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kModuleNames[kLoraModules] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};

json read_adapter_config(const fs::path& dir) {
  const fs::path path = dir / "adapter_config.json";
  std::ifstream in = open_regular_file(path, 16u << 20);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(path.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(path.string() + ": not a JSON object");
  return j;
}

// in and out features of `module` in a layer of `c`.
std::pair<int64_t, int64_t> module_shape(const ModelConfig& c, LoraModule module) {
  switch (module) {
    case LoraModule::kQ:
      return {c.hidden_size, c.q_dim()};
    case LoraModule::kK:
    case LoraModule::kV:
      return {c.hidden_size, c.kv_dim()};
    case LoraModule::kO:
      return {c.q_dim(), c.hidden_size};
    case LoraModule::kGate:
    case LoraModule::kUp:
      return {c.hidden_size, c.intermediate_size};
    case LoraModule::kDown:
      return {c.intermediate_size, c.hidden_size};
  }
  return {0, 0};
}

int module_index(const std::string& name) {
  for (int i = 0; i < kLoraModules; ++i)
    if (name == kModuleNames[i]) return i;
  return -1;
}

// Why a tensor name that is not base_model.model.model.layers.N.(self_attn|mlp).M.lora_(A|B)
// .weight is refused.
std::string unsupported_tensor_reason(const std::string& name) {
  if (name.find("lora_magnitude_vector") != std::string::npos)
    return "a DoRA magnitude vector (DoRA is not supported)";
  if (name.find("lora_embedding") != std::string::npos)
    return "a LoRA on the embedding (not supported)";
  if (name.find("modules_to_save") != std::string::npos)
    return "a fully trained module copy (modules_to_save is not supported)";
  if (name.ends_with(".bias")) return "a LoRA bias (not supported)";
  if (name.find("lm_head") != std::string::npos) return "a LoRA on the lm_head (not supported)";
  return "not a LoRA factor of a Llama layer's projection";
}

}  // namespace

const char* lora_module_name(LoraModule module) {
  return kModuleNames[static_cast<int>(module)];
}

bool is_lora_adapter(const fs::path& dir) {
  return path_exists(dir / "adapter_config.json");
}

std::string lora_base_model(const fs::path& dir) {
  const json j = read_adapter_config(dir);
  const auto it = j.find("base_model_name_or_path");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

LoraAdapter::~LoraAdapter() = default;

bool LoraAdapter::adapts_layer(int64_t layer) const {
  for (const Factors& f : layers_[static_cast<size_t>(layer)])
    if (f) return true;
  return false;
}

int64_t LoraAdapter::bytes() const {
  int64_t n = 0;
  for (const auto& [name, view] : file_->tensors()) n += static_cast<int64_t>(view.nbytes);
  return n;
}

std::unique_ptr<LoraAdapter> LoraAdapter::open(const fs::path& dir, const ModelConfig& config) {
  const json j = read_adapter_config(dir);
  const std::string where = (dir / "adapter_config.json").string() + ": ";
  auto fail = [&](const std::string& what) { throw Error(where + what); };
  // Phi-3's adapters target qkv_proj / gate_up_proj, which blend's modules do not name.
  if (config.fused_checkpoint_projections)
    fail("LoRA adapters on " + config.architecture +
         " (fused qkv_proj / gate_up_proj) are not supported");

  static const std::set<std::string> understood = {"peft_type",
                                                   "task_type",
                                                   "r",
                                                   "lora_alpha",
                                                   "use_rslora",
                                                   "target_modules",
                                                   "layers_to_transform",
                                                   "base_model_name_or_path"};
  // key -> what its neutral value is, as the error says it.
  static const std::map<std::string, std::string> neutral = {
      {"fan_in_fan_out", "false"},   {"bias", "\"none\""},    {"use_dora", "false"},
      {"modules_to_save", "null"},   {"rank_pattern", "{}"},  {"alpha_pattern", "{}"},
      {"layer_replication", "null"}, {"lora_bias", "false"},  {"trainable_token_indices", "null"},
      {"target_parameters", "null"}, {"use_qalora", "false"}, {"alora_invocation_tokens", "null"},
      {"megatron_config", "null"},   {"arrow_config", "null"}};
  static const std::set<std::string> ignored = {
      "lora_dropout",   "init_lora_weights", "inference_mode",     "revision",
      "auto_mapping",   "peft_version",      "loftq_config",       "eva_config",
      "corda_config",   "runtime_config",    "megatron_core",      "qalora_group_size",
      "layers_pattern", "exclude_modules",   "ensure_weight_tying"};
  for (const auto& [key, value] : j.items()) {
    if (understood.count(key) || ignored.count(key)) continue;
    const auto it = neutral.find(key);
    if (it == neutral.end())
      fail("unknown field '" + key +
           "': this PEFT feature is not supported (it may change outputs)");
    const bool is_neutral = value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
                            (value.is_string() && value.get<std::string>() == "none") ||
                            ((value.is_object() || value.is_array()) && value.empty());
    if (!is_neutral)
      fail("'" + key + "' is " + value.dump() + "; only " + it->second +
           " is supported (anything else changes the math)");
  }
  if (j.value("peft_type", std::string()) != "LORA")
    fail("peft_type is " + (j.contains("peft_type") ? j["peft_type"].dump() : "absent") +
         "; only LORA adapters are supported");
  if (j.contains("task_type") && !j["task_type"].is_null() && j["task_type"] != "CAUSAL_LM")
    fail("task_type is " + j["task_type"].dump() + "; only CAUSAL_LM adapters are supported");
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1)
    fail("'r' must be a positive integer");
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number())
    fail("'lora_alpha' must be a number");

  auto adapter = std::unique_ptr<LoraAdapter>(new LoraAdapter());
  adapter->dir_ = dir;
  adapter->rank_ = j["r"].get<int64_t>();
  const double alpha = j["lora_alpha"].get<double>();
  const bool rslora = j.value("use_rslora", false);
  adapter->scale_ =
      alpha / (rslora ? std::sqrt(static_cast<double>(adapter->rank_)) : adapter->rank_);

  std::set<int> listed;  // modules target_modules names (when it is a list)
  bool target_list = false;
  if (j.contains("target_modules") && j["target_modules"].is_array()) {
    target_list = true;
    for (const json& m : j["target_modules"]) {
      const int index = m.is_string() ? module_index(m.get<std::string>()) : -1;
      if (index < 0)
        fail("target_modules names " + m.dump() + "; LoRA is supported on " +
             "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj");
      listed.insert(index);
    }
  }
  std::set<int64_t> layers_allowed;
  const bool layer_list = j.contains("layers_to_transform") && !j["layers_to_transform"].is_null();
  if (layer_list) {
    const json& l = j["layers_to_transform"];
    if (l.is_number_integer())
      layers_allowed.insert(l.get<int64_t>());
    else if (l.is_array())
      for (const json& v : l) layers_allowed.insert(v.get<int64_t>());
    else
      fail("layers_to_transform must be null, an integer or a list of integers");
  }

  const fs::path file = dir / "adapter_model.safetensors";
  if (!path_exists(file)) {
    if (path_exists(dir / "adapter_model.bin"))
      throw Error(dir.string() +
                  ": the adapter is in adapter_model.bin (pickle), which is not read; save it "
                  "with safe_serialization=True (adapter_model.safetensors)");
    throw Error(dir.string() + ": no adapter_model.safetensors");
  }
  adapter->file_ = SafetensorsFile::open(file);
  adapter->layers_.resize(static_cast<size_t>(config.num_layers));
  const std::string prefix = "base_model.model.model.layers.";
  for (const auto& [name, view] : adapter->file_->tensors()) {
    // An init-capture: clang 14 cannot capture a structured binding implicitly.
    auto refuse = [&file, &name = name] {
      throw Error(file.string() + ": tensor '" + name + "' is " + unsupported_tensor_reason(name));
    };
    if (!name.starts_with(prefix)) refuse();
    size_t pos = prefix.size();
    size_t end = name.find('.', pos);
    if (end == std::string::npos || end == pos) refuse();
    const std::string layer_text = name.substr(pos, end - pos);
    if (layer_text.find_first_not_of("0123456789") != std::string::npos || layer_text.size() > 6)
      refuse();
    const int64_t layer = std::stoll(layer_text);
    std::string rest = name.substr(end + 1);  // self_attn.q_proj.lora_A.weight
    const bool attn = rest.starts_with("self_attn."), mlp = rest.starts_with("mlp.");
    if (!attn && !mlp) refuse();
    rest = rest.substr(attn ? 10 : 4);
    const size_t dot = rest.find('.');
    if (dot == std::string::npos) refuse();
    const int index = module_index(rest.substr(0, dot));
    const std::string factor = rest.substr(dot + 1);
    if (index < 0 || (index <= 3) != attn ||
        (factor != "lora_A.weight" && factor != "lora_B.weight"))
      refuse();
    if (layer >= config.num_layers)
      throw Error(file.string() + ": tensor '" + name + "' is for layer " + std::to_string(layer) +
                  ", but the base model has " + std::to_string(config.num_layers) + " layers");
    if (target_list && !listed.count(index))
      fail("the adapter holds " + name + " but target_modules does not name " +
           kModuleNames[index]);
    if (layer_list && !layers_allowed.count(layer))
      fail("the adapter holds " + name + " but layers_to_transform does not name layer " +
           std::to_string(layer));
    const auto [in, out] = module_shape(config, static_cast<LoraModule>(index));
    const bool is_a = factor == "lora_A.weight";
    const std::vector<int64_t> want =
        is_a ? std::vector<int64_t>{adapter->rank_, in} : std::vector<int64_t>{out, adapter->rank_};
    if (view.shape != want)
      throw Error(file.string() + ": tensor '" + name + "' has shape " + shape_string(view.shape) +
                  ", expected " + shape_string(want) + " (r = " + std::to_string(adapter->rank_) +
                  " and the base model's " + kModuleNames[index] + ")");
    Factors& f = adapter->layers_[static_cast<size_t>(layer)][static_cast<size_t>(index)];
    (is_a ? f.a : f.b) = &view;
  }
  bool any = false;
  for (size_t l = 0; l < adapter->layers_.size(); ++l)
    for (int m = 0; m < kLoraModules; ++m) {
      const Factors& f = adapter->layers_[l][static_cast<size_t>(m)];
      if ((f.a == nullptr) != (f.b == nullptr))
        throw Error(file.string() + ": layer " + std::to_string(l) + "'s " + kModuleNames[m] +
                    " has lora_" + (f.a ? "A" : "B") + " but no lora_" + (f.a ? "B" : "A"));
      any = any || f.a != nullptr;
    }
  if (!any) throw Error(file.string() + ": holds no LoRA factor");
  return adapter;
}

std::vector<LoraModule> parse_lora_targets(const std::string& list) {
  if (list == "all-linear")
    return {LoraModule::kQ,    LoraModule::kK,  LoraModule::kV,   LoraModule::kO,
            LoraModule::kGate, LoraModule::kUp, LoraModule::kDown};
  std::vector<LoraModule> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, comma - start);
    const int index = module_index(name);
    if (index < 0)
      throw Error("unknown LoRA target '" + name +
                  "' (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, all-linear)");
    if (std::find(out.begin(), out.end(), static_cast<LoraModule>(index)) == out.end())
      out.push_back(static_cast<LoraModule>(index));
    start = comma + 1;
  }
  return out;
}

void derive_lora(const fs::path& base, const fs::path& out, const LoraDeriveOptions& options) {
  const ModelConfig config = ModelConfig::from_dir(base);
  const TensorStore store = TensorStore::open_dir(base);
  const DType dtype = check_tensors(config, store);
  if (options.rank < 1) throw Error("model derive --lora: --rank must be at least 1");
  if (options.targets.empty()) throw Error("model derive --lora: no target module");
  fs::create_directories(out);
  if (fs::equivalent(base, out)) throw Error("model derive: --out must differ from --base");
  if (fs::exists(out / "config.json"))
    throw Error("model derive --lora: " + out.string() +
                " holds a model folder (config.json); an adapter folder must not");

  json targets = json::array();
  for (LoraModule m : options.targets) targets.push_back(lora_module_name(m));
  const json cfg = {{"peft_type", "LORA"},
                    {"task_type", "CAUSAL_LM"},
                    {"base_model_name_or_path", fs::absolute(base).lexically_normal().string()},
                    {"r", options.rank},
                    {"lora_alpha", options.alpha},
                    {"lora_dropout", 0.0},
                    {"target_modules", targets},
                    {"bias", "none"},
                    {"fan_in_fan_out", false},
                    {"use_rslora", false},
                    {"use_dora", false},
                    {"modules_to_save", nullptr},
                    {"layers_to_transform", nullptr},
                    {"layers_pattern", nullptr},
                    {"rank_pattern", json::object()},
                    {"alpha_pattern", json::object()},
                    {"init_lora_weights", true},
                    {"inference_mode", true},
                    {"revision", nullptr}};
  {
    std::ofstream f(out / "adapter_config.json");
    f << cfg.dump(2) << "\n";
    if (!f) throw Error("cannot write " + (out / "adapter_config.json").string());
  }

  // A: PEFT's init (Kaiming uniform, a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))). B: uniform with
  // the half-width that makes scale * B A x about half as large as W x for inputs of unit scale
  // (the base's linear weights have std 1/sqrt(in) under `model init`; a trained model's are of
  // that order): std(A x) = 1/sqrt(3) per rank component, so std(scale * B A x) =
  // scale * std(B) * sqrt(r / 3), set to 0.5.
  const double scale = options.alpha / static_cast<double>(options.rank);
  const double b_std = 0.5 / (scale * std::sqrt(static_cast<double>(options.rank) / 3.0));
  std::vector<TensorToWrite> tensors;
  for (int64_t layer = 0; layer < config.num_layers; ++layer)
    for (LoraModule m : options.targets) {
      const auto [in, out_features] = module_shape(config, m);
      const std::string stem = "base_model.model.model.layers." + std::to_string(layer) +
                               (static_cast<int>(m) <= 3 ? ".self_attn." : ".mlp.") +
                               lora_module_name(m);
      for (const bool is_a : {true, false}) {
        TensorSpec spec;
        spec.name = stem + (is_a ? ".lora_A.weight" : ".lora_B.weight");
        spec.kind = TensorSpec::Kind::kLinear;
        spec.shape = is_a ? std::vector<int64_t>{options.rank, in}
                          : std::vector<int64_t>{out_features, options.rank};
        // kLinear draws U(-sqrt(3/fan_in), sqrt(3/fan_in)): std 1/sqrt(fan_in). For A that is
        // sqrt(3) too wide for PEFT's init, and for B the fan_in giving b_std is 1/b_std^2.
        spec.fan_in = is_a ? in * 3 : static_cast<int64_t>(std::llround(1.0 / (b_std * b_std)));
        if (spec.fan_in < 1) spec.fan_in = 1;
        TensorToWrite t;
        t.name = spec.name;
        t.dtype = dtype;
        t.shape = spec.shape;
        t.fill = [spec, &config, dtype, seed = options.seed](size_t offset,
                                                             std::span<std::byte> bytes) {
          const size_t es = dtype_size(dtype);
          const auto first = static_cast<int64_t>(offset / es);
          for (size_t i = 0; i < bytes.size() / es; ++i) {
            store_float(random_init_value(spec, config, seed, first + static_cast<int64_t>(i)),
                        dtype, bytes.data() + i * es);
          }
        };
        tensors.push_back(std::move(t));
      }
    }
  write_safetensors(out / "adapter_model.safetensors", tensors, {{"format", "pt"}});
}

}  // namespace blend
