// blend model init | derive | info | export-gguf
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "gguf/export.h"
#include "gguf/gguf.h"
#include "gguf/import.h"
#include "model/derive.h"
#include "model/lora.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "text/tokenizer.h"

namespace blend::cli {
namespace {

struct InitArgs {
  std::string preset;
  std::string out;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  std::string tokenizer;
  double shard_mib = 0;
  bool allow_large = false;  // past the 6 GiB limit; the Llama-3-vocabulary shape-only presets
  int64_t layers = 0;        // 0: the preset's
  bool untie = false;        // a separate lm_head where the preset ties it to the embedding
  int threads = 0;           // 0: all
};

DType parse_dtype_flag(const std::string& s) {
  if (s == "bf16") return DType::kBF16;
  if (s == "f32") return DType::kF32;
  if (s == "f16") return DType::kF16;
  throw Error("--dtype must be bf16, f16 or f32, not '" + s + "'");
}

// The embedding table's parameters, and the lm_head's when it is a matrix of its own.
int64_t embedding_parameters(const ModelConfig& config) {
  return config.vocab_size * config.hidden_size * (config.tie_word_embeddings ? 1 : 2);
}

void run_init(const InitArgs& a) {
  auto config = a.allow_large ? find_large_model_preset(a.preset) : find_model_preset(a.preset);
  if (!config) {
    std::string names, large;
    for (const auto& n : model_preset_names()) names += " " + n;
    for (const auto& n : large_model_preset_names()) large += " " + n;
    if (find_large_model_preset(a.preset))
      throw Error("preset '" + a.preset + "' is large (" +
                  std::to_string(find_large_model_preset(a.preset)->num_parameters() / 1000000) +
                  "M parameters): pass --allow-large to write it (check the disk first)");
    if (find_model_shape(a.preset))
      throw Error("preset '" + a.preset +
                  "' is shape-only (its vocabulary is not the Llama-3 tokenizer's); generated "
                  "presets:" +
                  names + "; with --allow-large also:" + large);
    throw Error("unknown preset '" + a.preset + "'; generated presets:" + names +
                "; with --allow-large also:" + large);
  }
  if (a.layers > 0) {
    // Gemma's per-layer types follow the preset's pattern over the new depth.
    std::vector<bool>& types = config->gemma.sliding_layers;
    const size_t period = types.size();
    for (size_t i = period; period > 0 && i < static_cast<size_t>(a.layers); ++i)
      types.push_back(types[i % period]);
    if (config->gemma.enabled) types.resize(static_cast<size_t>(a.layers));
    config->num_layers = a.layers;
  }
  if (a.untie) config->tie_word_embeddings = false;
  RandomInitOptions options;
  options.seed = a.seed;
  options.dtype = parse_dtype_flag(a.dtype);
  options.tokenizer_dir =
      a.tokenizer.empty() ? default_tokenizer_dir() : std::filesystem::path(a.tokenizer);
  options.max_shard_bytes = static_cast<uint64_t>(a.shard_mib * 1024 * 1024);
  if (a.allow_large) options.max_total_bytes = UINT64_MAX;  // the free disk space still bounds it
  options.threads = a.threads;
  const auto t0 = std::chrono::steady_clock::now();
  write_random_model(*config, a.out, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The presets keep their namesake's layer shapes but carry the Llama-3 vocabulary: say where
  // the parameters are, so "smollm-135m: 180.1M" does not read as a miscount.
  std::printf(
      "wrote %s: %s%s, %.1fM parameters (%.1fM in the layers, %.1fM in the %s embedding "
      "of a %lld-token vocabulary), %s, in %.1f s\n",
      a.out.c_str(), a.preset.c_str(),
      a.layers > 0 ? (" (layers: " + std::to_string(a.layers) + ")").c_str() : "",
      static_cast<double>(config->num_parameters()) / 1e6,
      static_cast<double>(config->num_parameters() - embedding_parameters(*config)) / 1e6,
      static_cast<double>(embedding_parameters(*config)) / 1e6,
      config->tie_word_embeddings ? "tied" : "untied (input + lm_head)",
      static_cast<long long>(config->vocab_size), a.dtype.c_str(), seconds);
}

void run_info(const std::string& dir) {
  const ModelConfig config = ModelConfig::from_dir(dir);
  const TensorStore store = TensorStore::open_dir(dir);
  const DType dtype = check_tensors(config, store, QuantizedWeights::kAllowMatrices);
  // The tokenizer too: a folder whose tokenizer blend cannot run (SentencePiece-style,
  // Metaspace) must fail here, not pass `model info` and fail at the first request.
  const Tokenizer tokenizer = Tokenizer::from_dir(dir);
  uint64_t bytes = 0;
  int64_t q8_0 = 0;
  nlohmann::json block_tensors = nlohmann::json::object();  // by type: {"Q4_K": 168, ...}
  for (const auto& [name, view] : store.tensors()) {
    bytes += view->nbytes;
    q8_0 += view->dtype == DType::kQ8_0;
    if (is_block_type(view->dtype)) {
      const std::string type(dtype_name(view->dtype));
      block_tensors[type] = block_tensors.value(type, 0) + 1;
    }
  }
  nlohmann::json info = {
      {"architecture", config.architecture},
      {"hidden_size", config.hidden_size},
      {"num_layers", config.num_layers},
      {"num_heads", config.num_heads},
      {"num_kv_heads", config.num_kv_heads},
      {"head_dim", config.head_dim},
      {"intermediate_size", config.intermediate_size},
      {"vocab_size", config.vocab_size},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"parameters", config.num_parameters()},
      {"embedding_parameters", embedding_parameters(config)},
      {"non_embedding_parameters", config.num_parameters() - embedding_parameters(config)},
      {"tensors", store.tensors().size()},
      {"weight_bytes", bytes},
      {"dtype", dtype_name(dtype)},  // of the float tensors; block-type matrices counted below
      {"q8_0_tensors", q8_0},
      {"block_tensors", block_tensors},
      {"eos_token_ids", config.eos_token_ids},
      {"tokenizer_vocab_size", tokenizer.vocab_size()}};
  std::printf("%s\n", info.dump(2).c_str());
}

struct ExportGgufArgs {
  std::string model;
  std::string out;
  std::string dtype;  // empty: the checkpoint's
  std::string name;   // general.name; empty: the folder's
};

void run_export_gguf(const ExportGgufArgs& a) {
  GgufExportOptions options;
  if (!a.dtype.empty()) options.dtype = parse_dtype_flag(a.dtype);
  options.name = a.name;
  const GgufExportSummary s = export_gguf(a.model, a.out, options);
  std::printf("wrote %s: GGUF v3, architecture %s, %zu tensors, %zu metadata keys, %s, %.1f MiB\n",
              a.out.c_str(), s.architecture.c_str(), s.tensor_count, s.metadata_count,
              std::string(dtype_name(s.dtype)).c_str(),
              static_cast<double>(s.file_bytes) / (1024.0 * 1024.0));
}

struct QuantizeArgs {
  std::string model;
  std::string out;
  std::string type;
  std::string name;
};

void run_quantize(const QuantizeArgs& a) {
  GgufExportOptions options;
  options.quantization = parse_quant_preset(a.type);
  if (!options.quantization)
    throw Error("--type " + a.type + ": not supported (Q8_0, Q4_K_M; llama-quantize's names)");
  options.name = a.name;
  const GgufExportSummary s = export_gguf(a.model, a.out, options);
  std::string types;
  for (const auto& [type, n] : s.type_counts)
    types += (types.empty() ? "" : ", ") + std::to_string(n) + " " + type;
  std::printf("wrote %s: GGUF v3, architecture %s, %s, %zu tensors (%s), %.1f MiB\n", a.out.c_str(),
              s.architecture.c_str(), s.matrix_type.c_str(), s.tensor_count, types.c_str(),
              static_cast<double>(s.file_bytes) / (1024.0 * 1024.0));
}

struct ImportGgufArgs {
  std::string gguf;
  std::string out;
  int threads = 0;  // 0: all
};

void run_import_gguf(const ImportGgufArgs& a) {
  const int threads = a.threads > 0
                          ? a.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const GgufImportSummary s = import_gguf(a.gguf, a.out, threads);
  const std::string kept =
      s.kept_block_types.empty() ? "" : " (" + s.kept_block_types + " matrices kept as blocks)";
  std::printf("wrote %s: %s (GGUF %s), %zu tensors of %s, as %s%s\n", a.out.c_str(),
              s.architecture.c_str(), s.gguf_architecture.c_str(), s.tensor_count,
              s.source_types.c_str(), std::string(dtype_name(s.dtype)).c_str(), kept.c_str());
}

struct DeriveArgs {
  std::string base, out;
  bool full = false, lora = false;
  int64_t widen = 0;  // > 0: a wider model computing the same function
  DeriveOptions options;
  int64_t rank = 8;
  double alpha = 16;
  std::string targets = "q_proj,v_proj";
};

void run_derive(const DeriveArgs& a) {
  if (a.widen != 0) {
    if (a.full || a.lora || !a.options.layers.empty() || a.options.scale != 1)
      throw Error("model derive --widen: takes only --base, --out and --seed");
    derive_widened(a.base, a.out, a.widen, a.options.seed);
    std::printf("wrote %s: %s widened to hidden size %lld (seed %llu)\n", a.out.c_str(),
                a.base.c_str(), static_cast<long long>(a.widen),
                static_cast<unsigned long long>(a.options.seed));
    return;
  }
  if (a.full == a.lora)
    throw Error(
        "model derive: say what to derive: --full --layers LIST, --lora [--rank R], or --widen N");
  if (a.lora) {
    if (!a.options.layers.empty())
      throw Error("model derive --lora: --layers is for --full (the adapter covers every layer)");
    if (a.options.scale != 1)
      throw Error("model derive --lora: --scale is for --full (--alpha scales an adapter)");
    const LoraDeriveOptions o{.seed = a.options.seed,
                              .rank = a.rank,
                              .alpha = a.alpha,
                              .targets = parse_lora_targets(a.targets)};
    derive_lora(a.base, a.out, o);
    std::printf("wrote %s: a LoRA adapter of %s (r %lld, alpha %g, %s, seed %llu)\n", a.out.c_str(),
                a.base.c_str(), static_cast<long long>(a.rank), a.alpha, a.targets.c_str(),
                static_cast<unsigned long long>(a.options.seed));
    return;
  }
  derive_full_finetune(a.base, a.out, a.options);
  std::printf("wrote %s: %s with layers", a.out.c_str(), a.base.c_str());
  for (int64_t l : a.options.layers) std::printf(" %lld", static_cast<long long>(l));
  std::printf(" changed (seed %llu, scale %g)\n", static_cast<unsigned long long>(a.options.seed),
              a.options.scale);
}

}  // namespace

void register_model_commands(CLI::App& app) {
  CLI::App* model = app.add_subcommand("model", "Create and inspect model folders");
  model->require_subcommand(1);

  auto init_args = std::make_shared<InitArgs>();
  CLI::App* init = model->add_subcommand(
      "init", "Write a model folder with deterministic random weights and the Llama-3 tokenizer");
  init->add_option("--preset", init_args->preset,
                   "tiny | smollm-135m | llama-3.2-1b; with --allow-large also llama-3-8b | "
                   "llama-3-70b")
      ->required();
  init->add_option("--out", init_args->out, "Output folder")->required();
  init->add_option("--seed", init_args->seed, "Weight seed");
  init->add_option("--dtype", init_args->dtype, "bf16 | f16 | f32");
  init->add_option("--tokenizer", init_args->tokenizer,
                   "Folder with tokenizer.json and tokenizer_config.json");
  init->add_option("--shard-size", init_args->shard_mib,
                   "Split weights into shards of at most this many MiB (with an index)");
  init->add_flag("--allow-large", init_args->allow_large,
                 "Write models over 6 GiB (bounded by the free disk space) and the large presets "
                 "(llama-3-8b: 16 GB in bf16)");
  init->add_option("--layers", init_args->layers,
                   "Layers instead of the preset's (a 70B shape in less memory)")
      ->check(CLI::Range(int64_t{1}, ModelConfig::kMaxLayers));
  init->add_flag("--untie-embeddings", init_args->untie,
                 "Write a separate lm_head where the preset ties it to the embedding (random "
                 "tied weights make every position's logits peak at its own token)");
  init->add_option("--threads", init_args->threads, "Threads computing the weights (default: all)")
      ->check(CLI::Range(0, 65536));
  init->callback([init_args] { run_init(*init_args); });

  auto derive_args = std::make_shared<DeriveArgs>();
  CLI::App* derive = model->add_subcommand(
      "derive", "Write a fine-tuned tenant of a base model folder (serving several models)");
  derive->add_option("--base", derive_args->base, "Base model folder")->required();
  derive->add_option("--out", derive_args->out, "Output folder")->required();
  derive->add_option("--seed", derive_args->options.seed, "Seed of the perturbation");
  derive->add_flag("--full", derive_args->full,
                   "A full fine-tune: the listed layers change, all else stays bit-identical");
  derive->add_flag(
      "--lora", derive_args->lora,
      "A LoRA adapter in PEFT layout (adapter_config.json, adapter_model.safetensors)");
  derive->add_option("--widen", derive_args->widen,
                     "A model of this hidden size computing what the base computes (stitching "
                     "tests)");
  derive->add_option("--rank", derive_args->rank, "LoRA rank r (with --lora; default 8)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  derive->add_option("--alpha", derive_args->alpha, "LoRA alpha (with --lora; default 16)");
  derive->add_option("--targets", derive_args->targets,
                     "Adapted modules, e.g. q_proj,v_proj (default) or all-linear (with --lora)");
  derive->add_option("--layers", derive_args->options.layers,
                     "Layers to change, e.g. --layers 0 3 (with --full)");
  derive->add_option("--scale", derive_args->options.scale,
                     "How much the layers change, relative to a fresh weight (with --full; "
                     "default 1)");
  derive->callback([derive_args] { run_derive(*derive_args); });

  auto info_dir = std::make_shared<std::string>();
  CLI::App* info = model->add_subcommand("info", "Load a model folder, check it, print a summary");
  info->add_option("--model", *info_dir, "Model folder or GGUF file")
      ->transform(model_source_transform())
      ->required();
  info->callback([info_dir] { run_info(*info_dir); });

  auto gguf_args = std::make_shared<ExportGgufArgs>();
  CLI::App* gguf = model->add_subcommand(
      "export-gguf", "Write a model folder as one GGUF v3 file (llama.cpp's format)");
  gguf->add_option("--model", gguf_args->model, "Model folder")->required();
  gguf->add_option("--out", gguf_args->out, "Output .gguf file")->required();
  gguf->add_option("--dtype", gguf_args->dtype,
                   "bf16 | f16 | f32 for the matrices (default: the checkpoint's dtype)");
  gguf->add_option("--name", gguf_args->name,
                   "general.name (default: the model folder's name); llama.cpp keys some "
                   "tokenizer quirks on it (a name with \"phi3\" wants Phi-3's own tokens)");
  gguf->callback([gguf_args] { run_export_gguf(*gguf_args); });

  auto quantize_args = std::make_shared<QuantizeArgs>();
  CLI::App* quantize = model->add_subcommand(
      "quantize", "Write a model folder as a quantized GGUF file (llama-quantize's types)");
  quantize->add_option("--model", quantize_args->model, "Model folder")->required();
  quantize->add_option("--out", quantize_args->out, "Output .gguf file")->required();
  quantize->add_option("--type", quantize_args->type, "Q8_0 | Q4_K_M")->required();
  quantize->add_option("--name", quantize_args->name,
                       "general.name (default: the model folder's name), as export-gguf's");
  quantize->callback([quantize_args] { run_quantize(*quantize_args); });

  auto import_args = std::make_shared<ImportGgufArgs>();
  CLI::App* import = model->add_subcommand(
      "import-gguf",
      "Write the model folder a GGUF file stands for (what --model FILE.gguf reads, cached)");
  import->add_option("--model", import_args->gguf, "GGUF file")->required();
  import->add_option("--out", import_args->out, "Output folder (must not exist)")->required();
  import->add_option("--threads", import_args->threads, "Threads (default: all)")
      ->check(CLI::Range(0, 65536));
  import->callback([import_args] { run_import_gguf(*import_args);
});
}  // namespace blend::cli

}  // namespace blend::cli
