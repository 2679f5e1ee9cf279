// `blend zoo analyze`: which blocks of a zoo's models are equivalent to the base's (BlockLLM
// §4.1), measured with the logit lens on a calibration prompt set (blocks/equivalence.h).
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "blocks/adaptive.h"
#include "blocks/equivalence.h"
#include "cli/commands.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/zoo.h"

namespace blend::cli {
namespace {

struct AnalyzeArgs {
  std::string zoo, model, against, prompts, out;
  double threshold = 0.98;
  int threads = 0;
};

void run_analyze(const AnalyzeArgs& a) {
  if (!(a.threshold > 0 && a.threshold <= 1)) throw Error("--threshold must be in (0, 1]");
  const std::vector<ModelFolder> folders = model_folders(a.model, "", a.zoo);
  EngineOptions options;
  options.threads = a.threads;
  options.kv_memory_gb = 0.5;
  Engine engine(folders, options);
  auto* backend = dynamic_cast<CpuBackend*>(&engine.backend());
  if (!backend) throw Error("zoo analyze needs the cpu backend");
  if (!engine.models_share_tokenizer())
    throw Error(
        "zoo analyze: the models' tokenizers differ; calibration text would mean "
        "different tokens to each");

  std::vector<std::string> texts;
  if (a.prompts.empty()) {
    texts = default_calibration_prompts();
  } else {
    std::ifstream in(a.prompts);
    if (!in) throw Error("--prompts " + a.prompts + ": cannot read");
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) texts.push_back(line);
    if (texts.empty()) throw Error("--prompts " + a.prompts + ": no prompt (one per line)");
  }
  std::vector<std::vector<TokenId>> prompts;
  for (const std::string& t : texts) prompts.push_back(engine.tokenizer().encode(t));
  const int64_t page_size = options.page_size;
  if (similarity_pages(prompts, page_size) > backend->num_pages())
    throw Error("zoo analyze: the calibration prompts are too long for the KV cache (" +
                std::to_string(similarity_pages(prompts, page_size)) + " pages needed)");

  ModelId base = 0;
  if (!a.against.empty()) {
    const std::optional<ModelId> found = engine.find_model(a.against);
    if (!found) throw Error("--against " + a.against + ": no model of that name");
    base = *found;
  }
  int64_t tokens = 0;
  for (const auto& p : prompts) tokens += static_cast<int64_t>(p.size());
  nlohmann::json report = {{"against", engine.model_name(base)},
                           {"threshold", a.threshold},
                           {"calibration", {{"prompts", prompts.size()}, {"tokens", tokens}}},
                           {"models", nlohmann::json::array()}};
  std::printf("blocks against '%s' (logit-lens cosine, %zu prompts, %lld tokens, threshold %.3f)\n",
              engine.model_name(base).c_str(), prompts.size(), static_cast<long long>(tokens),
              a.threshold);
  for (ModelId m = 0; m < engine.num_models(); ++m) {
    if (m == base) continue;
    const auto blocks = compare_blocks(*backend, page_size, base, m, prompts);
    nlohmann::json list = nlohmann::json::array();
    int identical = 0, equivalent = 0;
    double lowest = 1;
    for (const BlockSimilarity& s : blocks) {
      const bool eq = s.identical || s.similarity >= a.threshold;
      identical += s.identical ? 1 : 0;
      equivalent += eq && !s.identical ? 1 : 0;
      lowest = std::min(lowest, s.similarity);
      list.push_back({{"layer", s.layer},
                      {"block", layer_block_name(s.block)},
                      {"similarity", s.similarity},
                      {"identical", s.identical},
                      {"equivalent", eq}});
    }
    report["models"].push_back({{"model", engine.model_name(m)}, {"blocks", list}});
    std::printf("  %-24s %3zu blocks: %3d identical, %3d equivalent, %3zu different; lowest %.4f\n",
                engine.model_name(m).c_str(), blocks.size(), identical, equivalent,
                blocks.size() - static_cast<size_t>(identical + equivalent), lowest);
  }
  // Adaptive serving (BlockLLM §5.3): each model's chain with every block at or above the
  // threshold replaced by the reference's, against the model's own chain on the same prompts.
  const std::vector<AdaptiveChain> chains =
      adaptive_chains(report, a.threshold, engine.config().num_layers,
                      [&](const std::string& name) { return engine.find_model(name); });
  if (!chains.empty())
    std::printf("adaptive chains (equivalent blocks replaced by '%s'), against each model's own:\n",
                engine.model_name(base).c_str());
  for (const AdaptiveChain& c : chains) {
    const ModelId chain = backend->add_chain(c.chain);
    const ChainDivergence d = chain_divergence(*backend, page_size, c.model, chain, prompts);
    for (auto& entry : report["models"])
      if (entry["model"] == engine.model_name(c.model))
        entry["adaptive"] = {{"replaced", c.replaced},
                             {"top_token_agreement", d.agreement},
                             {"kl_nats", d.kl},
                             {"positions", d.positions}};
    std::printf("  %-24s %3d blocks replaced: top-token agreement %.4f, KL %.5f nats\n",
                engine.model_name(c.model).c_str(), c.replaced, d.agreement, d.kl);
  }
  if (!a.out.empty()) {
    std::ofstream out(a.out);
    out << report.dump(2) << "\n";
    if (!out) throw Error("--out " + a.out + ": cannot write");
    std::printf("wrote %s\n", a.out.c_str());
  }
}

}  // namespace

void register_zoo_command(CLI::App& app) {
  CLI::App* zoo = app.add_subcommand("zoo", "Inspect a zoo of related models (BlockLLM)");
  zoo->require_subcommand(1);
  auto args = std::make_shared<AnalyzeArgs>();
  CLI::App* analyze = zoo->add_subcommand(
      "analyze", "Compare every model's blocks with one model's (logit-lens cosine similarity)");
  analyze->add_option("--zoo", args->zoo, "Folder of model folders and LoRA adapters");
  analyze->add_option("--model", args->model, "One more model folder (first)");
  analyze->add_option("--against", args->against,
                      "The model the others are compared with (default: the first)");
  analyze->add_option("--threshold", args->threshold,
                      "Similarity at or above which two blocks are equivalent (default 0.98)");
  analyze->add_option("--prompts", args->prompts,
                      "Calibration prompts, one per line (default: a built-in set of 8)");
  analyze->add_option("--out", args->out, "Write every block's similarity as JSON");
  analyze->add_option("--threads", args->threads, "Compute threads (default: all)");
  analyze->callback([args] { run_analyze(*args); });
}

}  // namespace blend::cli
