#include "gguf/export.h"

#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/quant.h"
#include "gguf/gguf.h"
#include "gguf/quant_recipe.h"
#include "gguf/tensor_data.h"
#include "gguf/tokenizer_metadata.h"
#include "gguf/writer.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace blend {

using gguf_internal::add_tokenizer_metadata;
using gguf_internal::gguf_tensor_name;
using gguf_internal::KvBuffer;
using gguf_internal::OutFile;
using gguf_internal::PlannedTensor;
using gguf_internal::read_json;
using gguf_internal::release_pages;
using gguf_internal::write_tensor_data;
using nlohmann::json;

namespace {

GgufFileType file_type_of(DType d) {
  switch (d) {
    case DType::kF32:
      return GgufFileType::kAllF32;
    case DType::kF16:
      return GgufFileType::kMostlyF16;
    case DType::kBF16:
      return GgufFileType::kMostlyBF16;
    case DType::kQ8_0:
      return GgufFileType::kMostlyQ8_0;
    case DType::kQ5_0:  // a folder's float dtype is never a block type
    case DType::kQ4_K:
    case DType::kQ6_K:
      break;
  }
  return GgufFileType::kAllF32;
}

// What llama.cpp's gemma2 / gemma3 read beyond the Llama keys: the caps, the window, which
// layers slide (one 0/1 per layer, as sliding_window_pattern's array form) and Gemma 3's
// local RoPE base.
void put_gemma_metadata(KvBuffer& kv, const std::string& arch, const ModelConfig& config) {
  const GemmaSettings& g = config.gemma;
  if (g.attn_logit_softcapping > 0)
    kv.put_f32(arch + ".attn_logit_softcapping", g.attn_logit_softcapping);
  if (g.final_logit_softcapping > 0)
    kv.put_f32(arch + ".final_logit_softcapping", g.final_logit_softcapping);
  if (g.attn_logit_softcapping > 0 && arch != "gemma2")
    throw Error("gguf: llama.cpp's " + arch + " has no attention soft-capping");
  if (g.sliding_window > 0) {
    kv.put_u32(arch + ".attention.sliding_window", static_cast<uint32_t>(g.sliding_window));
    std::vector<int32_t> pattern;
    for (bool s : g.sliding_layers) pattern.push_back(s ? 1 : 0);
    kv.put_i32s(arch + ".attention.sliding_window_pattern", pattern);
  }
  if (g.rope_local_theta) kv.put_f32(arch + ".rope.freq_base_swa", *g.rope_local_theta);
}

}  // namespace

GgufExportSummary export_gguf(const std::filesystem::path& model_dir,
                              const std::filesystem::path& out_file,
                              const GgufExportOptions& options) {
  const ModelConfig config = ModelConfig::from_dir(model_dir);
  const json raw_config = read_json(model_dir / "config.json");
  const TensorStore store = TensorStore::open_dir(model_dir);
  const DType src_dtype = check_tensors(config, store);
  const DType dtype = options.dtype.value_or(src_dtype);

  // llama.cpp's names; Qwen2 and Qwen3 (per-head q/k norms) use NEOX RoPE there, so their
  // q/k rows keep the Hugging Face order (LlamaModel.undo_permute is Llama's alone).
  const bool qwen3 = config.architecture == "Qwen3ForCausalLM";
  const bool qwen = qwen3 || config.architecture == "Qwen2ForCausalLM";
  // Phi-3 is NEOX RoPE in llama.cpp too; its fused attn_qkv / ffn_up keep their rows. Gemma 2 / 3
  // are NEOX RoPE there as well.
  const bool phi3 = config.architecture == "Phi3ForCausalLM";
  const bool gemma = config.gemma.enabled;
  const std::string arch = phi3                                         ? "phi3"
                           : qwen3                                      ? "qwen3"
                           : qwen                                       ? "qwen2"
                           : config.architecture == "Gemma2ForCausalLM" ? "gemma2"
                           : config.architecture == "Gemma3ForCausalLM" ? "gemma3"
                                                                        : "llama";
  const bool permute = !qwen && !phi3 && !gemma;
  // llama.cpp's llama, qwen2, qwen3 and phi3 graphs attend over the whole context: a window the
  // model uses (Mistral 7B v0.1's 4,096) would make the file a different model past it. (Gemma's
  // per-layer windows are its own: llama.cpp's gemma graphs have them.)
  if (config.sliding_window && *config.sliding_window < config.max_position_embeddings)
    throw Error(model_dir.string() + ": sliding_window " + std::to_string(*config.sliding_window) +
                " is not exported: llama.cpp's " + arch +
                " architecture attends over the whole context, so the GGUF file would compute a "
                "different model past " +
                std::to_string(*config.sliding_window) + " tokens");
  // llama.cpp's gemma2 reads no output.weight (Gemma2Model drops lm_head); it scales attention
  // by head_dim^-1/2 except on its 27B shape, never by query_pre_attn_scalar.
  if (arch == "gemma2" && !config.tie_word_embeddings)
    throw Error("gguf: llama.cpp's gemma2 has no separate lm_head (tie_word_embeddings=false)");
  if (gemma && config.gemma.query_pre_attn_scalar != static_cast<double>(config.head_dim))
    throw Error("gguf: query_pre_attn_scalar " + json(config.gemma.query_pre_attn_scalar).dump() +
                " differs from head_dim " + std::to_string(config.head_dim) +
                ", which llama.cpp's " + arch + " scales by");
  std::string name = options.name;
  if (name.empty()) {
    name = std::filesystem::absolute(model_dir).lexically_normal().filename().string();
    if (name.empty())
      name =
          std::filesystem::absolute(model_dir).lexically_normal().parent_path().filename().string();
  }

  // Tensors: rope_freqs first (generate_extra_tensors), then the checkpoint's in HF order.
  std::vector<PlannedTensor> plan;
  if (std::vector<float> f = llama3_rope_factors(config); !f.empty()) {
    if (qwen || gemma)
      throw Error("gguf: llama3 RoPE scaling on a " + config.architecture + " is not supported");
    PlannedTensor t;
    t.name = "rope_freqs.weight";
    t.shape = {static_cast<int64_t>(f.size())};
    t.values = std::move(f);
    plan.push_back(std::move(t));
  }
  // longrope's factors as Phi3MiniModel.generate_extra_tensors writes them (one copy, which
  // llama.cpp shares between the layers).
  if (config.rope_scaling.type == "longrope") {
    for (const auto& [gguf_name, factors] :
         {std::pair{"rope_factors_long.weight", &config.rope_scaling.long_factor},
          std::pair{"rope_factors_short.weight", &config.rope_scaling.short_factor}}) {
      PlannedTensor t;
      t.name = gguf_name;
      t.shape = {static_cast<int64_t>(factors->size())};
      t.values.assign(factors->begin(), factors->end());
      plan.push_back(std::move(t));
    }
  }
  for (const TensorSpec& spec : llama_tensor_specs(config)) {
    PlannedTensor t;
    int64_t layer = -1;
    t.name = gguf_tensor_name(spec.name, layer);
    if (gemma && spec.name.ends_with(".post_attention_layernorm.weight"))  // the output's norm
      t.name = "blk." + std::to_string(layer) + ".post_attention_norm.weight";
    t.shape = spec.shape;
    t.source = &store.get(spec.name, spec.shape);
    const bool one_d = spec.shape.size() <= 1 || t.name.ends_with("_norm.weight");
    t.type = one_d ? GgmlType::kF32 : ggml_type_of(dtype);
    if (gemma && spec.kind == TensorSpec::Kind::kNorm) {
      // llama.cpp multiplies by the stored weight: Gemma's (1 + w), as its converter writes it.
      t.values.resize(static_cast<size_t>(t.source->numel()));
      for (size_t i = 0; i < t.values.size(); ++i)
        t.values[i] = 1.0f + t.source->at(static_cast<int64_t>(i));
      t.source = nullptr;
    }
    if (permute) {
      if (spec.name.ends_with("q_proj.weight") || spec.name.ends_with("q_proj.bias"))
        t.permute_heads = config.num_heads;
      if (spec.name.ends_with("k_proj.weight") || spec.name.ends_with("k_proj.bias"))
        t.permute_heads = config.num_kv_heads;
    }
    plan.push_back(std::move(t));
  }
  if (options.quantization) {
    std::vector<QuantTensor> tensors;
    for (const PlannedTensor& t : plan)
      tensors.push_back({t.name, std::vector<int64_t>(t.shape.rbegin(), t.shape.rend()), t.type});
    const std::vector<GgmlType> types = llama_quantize_types(
        *options.quantization, {arch, config.num_layers, config.num_heads, config.num_kv_heads},
        tensors);
    for (size_t i = 0; i < plan.size(); ++i) plan[i].type = types[i];
  }
  uint64_t offset = 0;
  for (auto& t : plan) {
    const GgmlBlockLayout layout = *ggml_block_layout(static_cast<uint32_t>(t.type));
    const int64_t cols = t.shape.empty() ? 1 : t.shape.back();
    if (cols % layout.block_elems != 0)
      throw Error("gguf: " + t.name + " has rows of " + std::to_string(cols) +
                  " elements, not whole " + layout.name + " blocks of " +
                  std::to_string(layout.block_elems));
    t.nbytes = static_cast<uint64_t>(t.numel()) / layout.block_elems * layout.block_bytes;
    t.offset = offset;
    offset = gguf_align_up(offset + t.nbytes, kGgufAlignment);
  }

  // Metadata, in the converter's order.
  KvBuffer kv;
  kv.put_string("general.architecture", arch);
  kv.put_string("general.type", "model");
  kv.put_string("general.name", name);
  kv.put_u32(arch + ".block_count", static_cast<uint32_t>(config.num_layers));
  kv.put_u32(arch + ".context_length", static_cast<uint32_t>(config.max_position_embeddings));
  if (phi3) {
    // llama.cpp takes the long factors when its context is over this (model/rope.h: blend's
    // rule is the same one on its own --max-model-len).
    const int64_t original = config.rope_scaling.type == "longrope"
                                 ? config.rope_scaling.original_max_position_embeddings
                                 : config.max_position_embeddings;
    kv.put_u32(arch + ".rope.scaling.original_context_length", static_cast<uint32_t>(original));
  }
  kv.put_u32(arch + ".embedding_length", static_cast<uint32_t>(config.hidden_size));
  kv.put_u32(arch + ".feed_forward_length", static_cast<uint32_t>(config.intermediate_size));
  kv.put_u32(arch + ".attention.head_count", static_cast<uint32_t>(config.num_heads));
  kv.put_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(config.num_kv_heads));
  if (config.rope_scaling.type == "linear") {
    kv.put_string(arch + ".rope.scaling.type", "linear");
    kv.put_f32(arch + ".rope.scaling.factor", config.rope_scaling.factor);
  }
  kv.put_f32(arch + ".rope.freq_base", config.rope_theta);
  kv.put_f32(arch + ".attention.layer_norm_rms_epsilon", config.rms_norm_eps);
  if (raw_config.contains("head_dim") || config.head_dim * config.num_heads != config.hidden_size) {
    kv.put_u32(arch + ".attention.key_length", static_cast<uint32_t>(config.head_dim));
    kv.put_u32(arch + ".attention.value_length", static_cast<uint32_t>(config.head_dim));
  }
  kv.put_u32(
      "general.file_type",
      static_cast<uint32_t>(options.quantization ? quant_preset_file_type(*options.quantization)
                                                 : file_type_of(dtype)));
  if (gemma) put_gemma_metadata(kv, arch, config);
  if (phi3) {
    kv.put_u32(arch + ".rope.dimension_count", static_cast<uint32_t>(config.rotary_dim()));
    // 0 = none, as the converter writes it (llama.cpp runs Phi-3 without its window).
    kv.put_u32(arch + ".attention.sliding_window",
               static_cast<uint32_t>(config.sliding_window.value_or(0)));
    if (config.rope_scaling.type == "longrope")
      kv.put_f32(arch + ".rope.scaling.attn_factor", config.rope_scaling.attention_factor);
  } else if (!qwen && !gemma) {
    kv.put_u32(arch + ".vocab_size", static_cast<uint32_t>(config.vocab_size));
    kv.put_u32(arch + ".rope.dimension_count", static_cast<uint32_t>(config.head_dim));
  }
  kv.put_u32("general.quantization_version", 2);
  kv.put_u32("general.alignment", kGgufAlignment);
  add_tokenizer_metadata(kv, model_dir, config, raw_config);

  // Tensor infos.
  std::string ti;
  auto put_u32 = [&](uint32_t v) { ti.append(reinterpret_cast<const char*>(&v), 4); };
  auto put_u64 = [&](uint64_t v) { ti.append(reinterpret_cast<const char*>(&v), 8); };
  for (const auto& t : plan) {
    put_u64(t.name.size());
    ti += t.name;
    put_u32(static_cast<uint32_t>(t.shape.size()));
    for (size_t j = t.shape.size(); j-- > 0;) put_u64(static_cast<uint64_t>(t.shape[j]));
    put_u32(static_cast<uint32_t>(t.type));
    put_u64(t.offset);
  }

  // Write to a temporary file next to the target, then rename.
  if (out_file.has_parent_path()) std::filesystem::create_directories(out_file.parent_path());
  const std::filesystem::path tmp = out_file.string() + ".tmp";
  uint64_t file_bytes = 0;
  try {
    OutFile out(tmp);
    const uint32_t magic = kGgufMagic, version = kGgufVersion;
    const uint64_t n_tensors = plan.size(), n_kv = kv.count();
    out.write(&magic, 4);
    out.write(&version, 4);
    out.write(&n_tensors, 8);
    out.write(&n_kv, 8);
    out.write(kv.bytes().data(), kv.bytes().size());
    out.write(ti.data(), ti.size());
    out.pad_to(kGgufAlignment);
    const uint64_t data_start = out.pos();
    for (const auto& t : plan) {
      if (out.pos() != data_start + t.offset) throw Error("gguf: internal offset mismatch");
      write_tensor_data(out, t);
      if (t.source) release_pages(*t.source);
      out.pad_to(kGgufAlignment);
    }
    file_bytes = out.pos();
    out.close();
    std::filesystem::rename(tmp, out_file);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
  GgufExportSummary summary;
  summary.architecture = arch;
  summary.dtype = dtype;
  summary.matrix_type = options.quantization
                            ? quant_preset_name(*options.quantization)
                            : ggml_type_display_name(static_cast<uint32_t>(ggml_type_of(dtype)));
  std::map<uint32_t, size_t> counts;
  for (const PlannedTensor& t : plan) ++counts[static_cast<uint32_t>(t.type)];
  for (const auto& [type, n] : counts)
    summary.type_counts.emplace_back(ggml_type_display_name(type), n);
  summary.tensor_count = plan.size();
  summary.metadata_count = kv.count();
  summary.file_bytes = file_bytes;
  return summary;
}

}  // namespace blend
