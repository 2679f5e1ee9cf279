// LoRA adapters in PEFT's layout (https://huggingface.co/docs/peft): a folder with
// adapter_config.json and adapter_model.safetensors holding, for each adapted linear layer W of a
// base model, factors A [r, in] and B [out, r]. The adapted layer computes
//   y = x W^T + scale * (x A^T) B^T,   scale = lora_alpha / r  (lora_alpha / sqrt(r) with rsLoRA),
// as PEFT's LoraLayer does at inference (dropout is a training-time op).
//
// The rule of config.json applies here too: a field is understood, or irrelevant at inference
// (ignored on purpose, listed in lora.cc), or refused with an error naming it. DoRA, LoRA biases,
// modules_to_save, per-module rank or alpha patterns, layer replication and adapters on the
// embedding or lm_head change the math and are refused; so is any key we do not know.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"

namespace blend {

struct TensorView;
class SafetensorsFile;

// The linear layers of a Llama layer an adapter may change, in PEFT's module names.
enum class LoraModule { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kLoraModules = 7;
const char* lora_module_name(LoraModule module);  // "q_proj", ..., "down_proj"

// Whether `dir` holds a PEFT adapter (adapter_config.json).
bool is_lora_adapter(const std::filesystem::path& dir);

// base_model_name_or_path of the adapter in `dir` ("" when absent or null). Throws blend::Error
// when adapter_config.json is unreadable or not a JSON object.
std::string lora_base_model(const std::filesystem::path& dir);

class LoraAdapter {
 public:
  // Reads and checks the adapter in `dir` against the base model's `config`: every tensor's
  // name, shape and pairing (A with B). Throws blend::Error naming the file and field or tensor.
  static std::unique_ptr<LoraAdapter> open(const std::filesystem::path& dir,
                                           const ModelConfig& config);
  ~LoraAdapter();

  struct Factors {
    const TensorView* a = nullptr;  // [rank, in]
    const TensorView* b = nullptr;  // [out, rank]
    explicit operator bool() const { return a != nullptr; }
  };
  const std::filesystem::path& dir() const { return dir_; }
  int64_t rank() const { return rank_; }
  double scale() const { return scale_; }
  // The factors of one module of one layer; empty when the adapter leaves it alone.
  const Factors& factors(int64_t layer, LoraModule module) const {
    return layers_[static_cast<size_t>(layer)][static_cast<size_t>(module)];
  }
  bool adapts_layer(int64_t layer) const;
  int64_t bytes() const;  // of all factors in the file

 private:
  LoraAdapter() = default;
  std::filesystem::path dir_;
  int64_t rank_ = 0;
  double scale_ = 1;
  std::unique_ptr<SafetensorsFile> file_;
  std::vector<std::array<Factors, kLoraModules>> layers_;
};

struct LoraDeriveOptions {
  uint64_t seed = 1;
  int64_t rank = 8;
  double alpha = 16;
  std::vector<LoraModule> targets = {LoraModule::kQ, LoraModule::kV};
};

// `blend model derive --lora`: writes OUT as a PEFT adapter of the model folder BASE with random
// factors on every layer's `targets`: A as PEFT's Kaiming-uniform init draws it, B (zero at a
// real adapter's start) drawn so the change to each adapted output is about half its size: large
// enough that outputs differ from the base. base_model_name_or_path is BASE's absolute path.
void derive_lora(const std::filesystem::path& base, const std::filesystem::path& out,
                 const LoraDeriveOptions& options);

// Parses "q_proj,v_proj" (or "all-linear"); throws blend::Error on an unknown module.
std::vector<LoraModule> parse_lora_targets(const std::string& list);

}  // namespace blend
