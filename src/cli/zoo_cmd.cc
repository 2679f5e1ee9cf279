// `blend zoo analyze`: which blocks of a zoo's models are equivalent to the base's (BlockLLM
// §4.1), measured with the logit lens on a calibration prompt set (blocks/equivalence.h).
// `blend zoo stitch`: a stitching block between two models of different widths (§4.4,
// blocks/stitch.h), trained and evaluated on held-out prompts.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "blocks/adaptive.h"
#include "blocks/equivalence.h"
#include "blocks/stitch.h"
#include "cli/commands.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/safetensors.h"
#include "model/zoo.h"

namespace blend::cli {
namespace {

struct AnalyzeArgs {
  std::string zoo, model, against, prompts, out;
  double threshold = 0.98;
  int threads = 0;
};

// The calibration texts: one per line of `path`, or the built-in set when it is empty.
std::vector<std::string> calibration_texts(const std::string& path) {
  if (path.empty()) return default_calibration_prompts();
  std::vector<std::string> texts;
  std::ifstream in(path);
  if (!in) throw Error("--prompts " + path + ": cannot read");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) texts.push_back(line);
  if (texts.empty()) throw Error("--prompts " + path + ": no prompt (one per line)");
  return texts;
}

void run_analyze(const AnalyzeArgs& a) {
  if (!(a.threshold > 0 && a.threshold <= 1)) throw Error("--threshold must be in (0, 1]");
  const std::vector<ModelFolder> folders = model_folders(a.model, "", a.zoo);
  EngineOptions options;
  options.threads = a.threads;
  options.kv_memory_gb = 0.5;
  Engine engine(folders, options);
  CpuBackend* backend = &cpu_backend_for(engine.backend(), "zoo analyze");
  if (!engine.models_share_tokenizer())
    throw Error(
        "zoo analyze: the models' tokenizers differ; calibration text would mean "
        "different tokens to each");

  std::vector<std::vector<TokenId>> prompts;
  for (const std::string& t : calibration_texts(a.prompts))
    prompts.push_back(engine.tokenizer().encode(t));
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

struct StitchArgs {
  std::string head, tail, prompts, out, json;
  int64_t points = 4;
  StitchOptions options;
  int threads = 0;
};

void run_stitch(const StitchArgs& a) {
  EngineOptions options;
  options.threads = a.threads;
  options.kv_memory_gb = 0.25;
  Engine head(a.head, options), tail(a.tail, options);
  CpuBackend* head_backend = &cpu_backend_for(head.backend(), "zoo stitch");
  CpuBackend* tail_backend = &cpu_backend_for(tail.backend(), "zoo stitch");
  const TensorStore tail_weights = TensorStore::open_dir(a.tail);
  // Even-numbered prompts train the block, odd-numbered ones evaluate it (held out).
  std::vector<std::vector<TokenId>> train, held_out;
  const std::vector<std::string> texts = calibration_texts(a.prompts);
  if (texts.size() < 2) throw Error("zoo stitch: at least 2 prompts (one to train, one to test)");
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<TokenId> ids = head.tokenizer().encode(texts[i]);
    if (tail.tokenizer().encode(texts[i]) != ids)
      throw Error("zoo stitch: the two models tokenize prompt " + std::to_string(i + 1) +
                  " differently; a stitch needs one vocabulary");
    (i % 2 == 0 ? train : held_out).push_back(std::move(ids));
  }
  StitchOptions o = a.options;
  o.points =
      proportional_stitch_points(head.config().num_layers, tail.config().num_layers, a.points);
  const StitchModels models{.head = head_backend,
                            .tail = tail_backend,
                            .tail_weights = &tail_weights,
                            .page_size = options.page_size};
  std::printf("stitching %s (width %lld, %lld layers) -> %s (width %lld, %lld layers)\n",
              a.head.c_str(), static_cast<long long>(head.config().hidden_size),
              static_cast<long long>(head.config().num_layers), a.tail.c_str(),
              static_cast<long long>(tail.config().hidden_size),
              static_cast<long long>(tail.config().num_layers));
  int64_t train_positions = 0;
  for (const auto& p : train) train_positions += static_cast<int64_t>(p.size());
  if (train_positions * static_cast<int64_t>(o.points.size()) < head.config().hidden_size + 2)
    std::printf(
        "note: %lld training positions at %zu points for %lld inputs: the least squares "
        "is underdetermined and the ridge term picks the fit (give more --prompts)\n",
        static_cast<long long>(train_positions), o.points.size(),
        static_cast<long long>(head.config().hidden_size + 2));
  StitchOptions least_squares = o;
  least_squares.steps_per_stage = 0;
  const StitchBlock initial = train_stitch(models, train, least_squares);
  std::vector<StitchStage> stages;
  const StitchBlock trained =
      o.steps_per_stage > 0 ? train_stitch(models, train, o, &stages) : initial;
  nlohmann::json report = {{"head", a.head},
                           {"tail", a.tail},
                           {"steps_per_stage", o.steps_per_stage},
                           {"learning_rate", o.learning_rate},
                           {"ridge", o.ridge},
                           {"rows_per_step", o.rows_per_step},
                           {"train_prompts", train.size()},
                           {"train_positions", train_positions},
                           {"held_out_prompts", held_out.size()},
                           {"stages", nlohmann::json::array()},
                           {"points", nlohmann::json::array()}};
  for (const StitchStage& s : stages) {
    std::printf("  stage at head layer %lld -> tail layer %lld: lens KL %.5f -> %.5f nats%s\n",
                static_cast<long long>(s.point.head_layer),
                static_cast<long long>(s.point.tail_layer), s.kl_before, s.kl_after,
                s.kept ? "" : " (steps undone: the loss rose)");
    report["stages"].push_back({{"head_layer", s.point.head_layer},
                                {"tail_layer", s.point.tail_layer},
                                {"kl_before", s.kl_before},
                                {"kl_after", s.kl_after},
                                {"kept", s.kept}});
  }
  std::printf("held-out prompts (%zu), stitched chain against the tail model:\n", held_out.size());
  std::printf("  %-22s %-17s %8s %9s %9s\n", "point (head -> tail)", "stitch", "cosine", "top-1",
              "KL nats");
  // The one block for every point (least squares, then trained), against a block fitted to each
  // point alone: what generalising across points costs. All evaluated in one pass.
  std::vector<StitchBlock> own;
  for (const StitchPoint& p : o.points) {
    StitchOptions alone = least_squares;
    alone.points = {p};
    own.push_back(train_stitch(models, train, alone));
  }
  std::vector<StitchCase> cases;
  std::vector<const char*> names;
  std::vector<size_t> point_of;  // each case's index in o.points
  for (size_t i = 0; i < o.points.size(); ++i)
    for (const auto& [name, block] :
         {std::pair<const char*, const StitchBlock*>{"least squares", &initial},
          {"trained", &trained},
          {"this point alone", &own[i]}}) {
      if (block == &trained && o.steps_per_stage == 0) continue;
      cases.push_back({.block = block, .point = o.points[i]});
      names.push_back(name);
      point_of.push_back(i);
    }
  const std::vector<StitchQuality> quality = evaluate_stitches(models, cases, held_out);
  for (size_t i = 0; i < o.points.size(); ++i) {
    const StitchPoint& p = o.points[i];
    nlohmann::json entry = {{"head_layer", p.head_layer}, {"tail_layer", p.tail_layer}};
    for (size_t c = 0; c < cases.size(); ++c) {
      if (point_of[c] != i) continue;
      const StitchQuality& q = quality[c];
      std::printf("  %-22s %-17s %8.4f %9.4f %9.5f\n",
                  (std::to_string(p.head_layer) + " -> " + std::to_string(p.tail_layer)).c_str(),
                  names[c], q.cosine, q.agreement, q.kl);
      entry[names[c]] = {{"cosine", q.cosine},
                         {"top_token_agreement", q.agreement},
                         {"kl_nats", q.kl},
                         {"positions", q.positions}};
    }
    report["points"].push_back(entry);
  }
  if (!a.out.empty()) {
    trained.save(a.out);
    std::printf("wrote %s (stitch.weight f32 [%lld, %lld])\n", a.out.c_str(),
                static_cast<long long>(trained.out), static_cast<long long>(trained.in + 2));
  }
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << report.dump(2) << "\n";
    if (!out) throw Error("--json " + a.json + ": cannot write");
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

  auto st = std::make_shared<StitchArgs>();
  CLI::App* stitch = zoo->add_subcommand(
      "stitch", "Train a stitching block between two models of different widths (BlockLLM 4.4)");
  stitch->add_option("--head", st->head, "Model whose first layers run (the narrower one, say)")
      ->required();
  stitch->add_option("--tail", st->tail, "Model whose last layers and head run")->required();
  stitch->add_option("--points", st->points,
                     "Stitching points, at evenly spaced depths (default 4)");
  stitch->add_option("--steps", st->options.steps_per_stage,
                     "Adam steps per point, shallow to deep (default 40; 0: least squares only)");
  stitch->add_option("--lr", st->options.learning_rate,
                     "Adam step size, relative to the weights' RMS (default 1e-3)");
  stitch->add_option("--rows-per-step", st->options.rows_per_step,
                     "Positions of each point per Adam step (default 128)");
  stitch->add_option("--seed", st->options.seed, "Seed of the steps' row draws (default 1)");
  stitch->add_option("--ridge", st->options.ridge,
                     "Least-squares ridge, relative to the mean squared input (default 1e-4)");
  stitch->add_option(
      "--prompts", st->prompts,
      "Prompts, one per line; even lines train, odd ones test (default: built-in 8)");
  stitch->add_option("--out", st->out, "Write the trained block (safetensors)");
  stitch->add_option("--json", st->json, "Write the stages and the evaluation as JSON");
  stitch->add_option("--threads", st->threads, "Compute threads (default: all)");
  stitch->callback([st] { run_stitch(*st); });
}

}  // namespace blend::cli
