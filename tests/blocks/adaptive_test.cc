// blocks/adaptive and Engine::add_adaptive_chain: BlockLLM's adaptive serving (§5.3) on one
// engine. Chains come from an analysis at a threshold; a request that allows it runs through the
// borrowed blocks (a fine-tune whose every changed block is borrowed from the base answers as
// the base), one that does not runs its own, in the same batch; chain_divergence measures what
// that costs.
#include "blocks/adaptive.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "blocks/equivalence.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/run_requests.h"
#include "model/derive.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

// An analysis as `blend zoo analyze --out` writes it, for models base (0), tuned (1), other (2)
// of 2 layers.
json analysis() {
  return json::parse(R"({
    "against": "base", "threshold": 0.9,
    "models": [
      {"model": "tuned", "blocks": [
        {"layer": 0, "block": "attention", "similarity": 1.0, "identical": true},
        {"layer": 0, "block": "ffn", "similarity": 1.0, "identical": true},
        {"layer": 1, "block": "attention", "similarity": 0.95, "identical": false},
        {"layer": 1, "block": "ffn", "similarity": 0.5, "identical": false}]},
      {"model": "other", "blocks": [
        {"layer": 1, "block": "ffn", "similarity": 0.2, "identical": false}]}]})");
}

std::optional<ModelId> find(const std::string& name) {
  if (name == "base") return 0;
  if (name == "tuned") return 1;
  if (name == "other") return 2;
  return std::nullopt;
}

TEST(AdaptiveChains, BorrowEveryMeasuredBlockAtTheThreshold) {
  const auto chains = adaptive_chains(analysis(), 0, 2, find);  // the file's 0.9
  ASSERT_EQ(chains.size(), 1u);                                 // "other" has no block at 0.9
  const AdaptiveChain& c = chains[0];
  EXPECT_EQ(c.model, 1);
  EXPECT_EQ(c.against, 0);
  EXPECT_EQ(c.replaced, 1);
  EXPECT_EQ(c.chain.base, 1);
  // Layer 0's blocks are byte-identical: named as the base's, which they are.
  EXPECT_EQ(c.chain.attention, (std::vector<ModelId>{0, 0}));
  EXPECT_EQ(c.chain.ffn, (std::vector<ModelId>{0, 1}));

  const auto lower = adaptive_chains(analysis(), 0.4, 2, find);
  ASSERT_EQ(lower.size(), 1u);
  EXPECT_EQ(lower[0].replaced, 2);
  EXPECT_EQ(lower[0].chain.ffn, (std::vector<ModelId>{0, 0}));
  EXPECT_EQ(adaptive_chains(analysis(), 0.1, 2, find).size(), 2u);
}

TEST(AdaptiveChains, RefuseAnAnalysisThatDoesNotFit) {
  auto fails = [](json a, const std::string& says) {
    try {
      adaptive_chains(a, 0, 2, find);
      ADD_FAILURE() << "accepted: " << a.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  json a = analysis();
  a["against"] = "elsewhere";
  fails(a, "not served");
  a = analysis();
  a["models"][0]["blocks"][2]["layer"] = 2;
  fails(a, "outside");
  a = analysis();
  a["models"][0]["blocks"][3]["layer"] = 1;
  a["models"][0]["blocks"][3]["block"] = "attention";
  fails(a, "listed twice");
  a = analysis();
  a["models"][0]["blocks"][3]["block"] = "mlp";
  fails(a, "neither");
  a = analysis();
  a["models"][0]["model"] = "base";
  fails(a, "itself");
  a = analysis();
  a.erase("models");
  fails(a, "models");
  a = analysis();
  a["models"][0]["blocks"][3]["similarity"] = "high";
  fails(a, "numeric");
  EXPECT_THROW(adaptive_chains(json::array(), 0, 2, find), Error);
  EXPECT_THROW(adaptive_chains(analysis(), 1.5, 2, find), Error);
}

class AdaptiveServing : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    RandomInitOptions o;
    o.seed = 41;
    o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
    write_random_model(*find_model_preset("tiny"), *dir_ / "base", o);
    derive_full_finetune(*dir_ / "base", *dir_ / "tuned", {.seed = 5, .layers = {1}});
    derive_full_finetune(*dir_ / "base", *dir_ / "mild", {.seed = 6, .layers = {1}, .scale = 0.05});
  }
  static void TearDownTestSuite() { delete dir_; }

  static EngineOptions options(bool by_default = false) {
    EngineOptions o;
    o.threads = 2;
    o.deterministic = true;
    o.kv_memory_gb = 0.05;
    o.adaptive_by_default = by_default;
    return o;
  }
  static std::unique_ptr<Engine> zoo(bool by_default = false) {
    return std::make_unique<Engine>(std::vector<ModelFolder>{{"base", *dir_ / "base", {}},
                                                             {"tuned", *dir_ / "tuned", {}},
                                                             {"mild", *dir_ / "mild", {}}},
                                    options(by_default));
  }
  // tuned's chain with both of its changed blocks (layer 1) borrowed from the base.
  static ChainSpec all_borrowed() { return {.base = 1, .attention = {1, 0}, .ffn = {1, 0}}; }

  static GenerationRequest request(const std::string& id, uint32_t seed, ModelId model,
                                   std::optional<bool> adaptive = std::nullopt) {
    std::mt19937 rng(seed);
    GenerationRequest r;
    r.id = id;
    for (int i = 0; i < 9 + static_cast<int>(seed % 7); ++i)
      r.prompt.push_back(static_cast<TokenId>(rng() % 120000));
    r.params.max_tokens = 10;
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.model = model;
    r.adaptive_blocks = adaptive;
    return r;
  }

  static testing::TempDir* dir_;
};
testing::TempDir* AdaptiveServing::dir_ = nullptr;

TEST_F(AdaptiveServing, ARequestThatAllowsItRunsTheBorrowedBlocksAndOthersTheirOwn) {
  auto engine = zoo();
  const ModelId chain = engine->add_adaptive_chain(1, all_borrowed(), 0);
  EXPECT_EQ(chain, 3);
  EXPECT_EQ(engine->adaptive_chain(1), chain);
  EXPECT_FALSE(engine->adaptive_chain(0));

  // The same prompts on the base, on tuned's own chain, and on tuned allowing adaptive serving,
  // all in one batch.
  std::vector<GenerationRequest> requests;
  for (uint32_t s = 1; s <= 3; ++s) {
    requests.push_back(request("base" + std::to_string(s), s, 0));
    requests.push_back(request("own" + std::to_string(s), s, 1));
    requests.push_back(request("adaptive" + std::to_string(s), s, 1, true));
    requests.push_back(request("refused" + std::to_string(s), s, 1, false));
  }
  auto out = testing::run_requests(*engine, std::move(requests));
  int differ = 0;
  for (int s = 1; s <= 3; ++s) {
    const std::string k = std::to_string(s);
    // tuned changed only layer 1, and the chain borrows both of its blocks: it is the base.
    EXPECT_EQ(out["adaptive" + k].tokens, out["base" + k].tokens) << s;
    EXPECT_EQ(out["refused" + k].tokens, out["own" + k].tokens) << s;
    differ += out["own" + k].tokens != out["base" + k].tokens ? 1 : 0;
  }
  EXPECT_GT(differ, 0) << "tuned answers as the base: the test cannot tell the chains apart";
  EXPECT_EQ(engine->stats().adaptive_requests, 3);

  // Each answer is the one its chain gives alone.
  auto alone = zoo();
  alone->add_adaptive_chain(1, all_borrowed(), 0);
  auto single = testing::run_requests(*alone, {request("adaptive2", 2, 1, true)});
  EXPECT_EQ(single["adaptive2"].tokens, out["adaptive2"].tokens);
}

TEST_F(AdaptiveServing, TheEngineDefaultAppliesWhereARequestDoesNotSay) {
  auto engine = zoo(/*by_default=*/true);
  engine->add_adaptive_chain(1, all_borrowed(), 0);
  auto out =
      testing::run_requests(*engine, {request("base", 4, 0), request("unsaid", 4, 1),
                                      request("refused", 4, 1, false), request("mild", 4, 2)});
  EXPECT_EQ(out["unsaid"].tokens, out["base"].tokens);
  EXPECT_EQ(engine->stats().adaptive_requests, 1);  // mild has no chain: it runs its own
  auto plain = zoo();
  auto own = testing::run_requests(*plain, {request("refused", 4, 1), request("mild", 4, 2)});
  EXPECT_EQ(out["refused"].tokens, own["refused"].tokens);
  EXPECT_EQ(out["mild"].tokens, own["mild"].tokens);
}

TEST_F(AdaptiveServing, ChainsAreAddedOnceAndBeforeAnyRequest) {
  auto engine = zoo();
  EXPECT_THROW(engine->add_adaptive_chain(3, all_borrowed(), 0), Error);
  EXPECT_THROW(engine->add_adaptive_chain(1, all_borrowed(), 7), Error);
  EXPECT_THROW(engine->add_adaptive_chain(1, {.base = 9, .attention = {1, 1}, .ffn = {1, 1}}, 0),
               Error);
  // A chain cut short is a logit lens, not a model.
  EXPECT_THROW(engine->add_adaptive_chain(1, {.base = 1, .attention = {1}, .ffn = {1}}, 0), Error);
  engine->add_adaptive_chain(1, all_borrowed(), 0);
  EXPECT_THROW(engine->add_adaptive_chain(1, all_borrowed(), 0), Error);
  testing::run_requests(*engine, {request("x", 1, 2)});
  EXPECT_THROW(engine->add_adaptive_chain(2, {.base = 2, .attention = {2, 0}, .ffn = {2, 0}}, 0),
               Error);
}

TEST_F(AdaptiveServing, EnabledFromAnAnalysisFileWithClearErrors) {
  auto engine = zoo();
  const auto path = *dir_ / "analysis.json";
  json a = analysis();
  a["models"][1]["model"] = "mild";
  std::ofstream(path) << a.dump();
  const auto chains = enable_adaptive_serving(*engine, path, 0);
  ASSERT_EQ(chains.size(), 1u);
  EXPECT_EQ(engine->adaptive_chain(1), 3);
  EXPECT_NE(describe_adaptive_chains(*engine, chains).find("'tuned' may run 1 blocks of 'base'"),
            std::string::npos);

  auto fresh = zoo();
  EXPECT_THROW(enable_adaptive_serving(*fresh, *dir_ / "missing.json", 0), Error);
  std::ofstream(*dir_ / "bad.json") << "{not json";
  EXPECT_THROW(enable_adaptive_serving(*fresh, *dir_ / "bad.json", 0), Error);
  EXPECT_THROW(enable_adaptive_serving(*fresh, path, 2.0), Error);
  std::ofstream(*dir_ / "other.json") << analysis().dump();  // names "other", not served here
  EXPECT_THROW(enable_adaptive_serving(*fresh, *dir_ / "other.json", 0), Error);
}

TEST_F(AdaptiveServing, DivergenceIsZeroForAChainAgainstItselfAndGrowsWithTheChange) {
  auto engine = zoo();
  auto& backend = dynamic_cast<CpuBackend&>(engine->backend());
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t s = 1; s <= 3; ++s) prompts.push_back(request("p", s, 0).prompt);
  const ChainDivergence self = chain_divergence(backend, 16, 1, 1, prompts);
  EXPECT_EQ(self.agreement, 1.0);
  EXPECT_EQ(self.kl, 0.0);
  EXPECT_GT(self.positions, 0);
  const ChainDivergence strong = chain_divergence(backend, 16, 0, 1, prompts);
  const ChainDivergence mild = chain_divergence(backend, 16, 0, 2, prompts);
  EXPECT_GT(strong.kl, 0.0);
  EXPECT_GT(mild.kl, 0.0);
  EXPECT_LT(mild.kl, strong.kl);
  EXPECT_GE(mild.agreement, strong.agreement);
  EXPECT_LE(strong.agreement, 1.0);
  // A chain of tuned's embedding and head with the base's layers is the base.
  const ModelId as_base = backend.add_chain(all_borrowed());
  const ChainDivergence borrowed = chain_divergence(backend, 16, 0, as_base, prompts);
  EXPECT_EQ(borrowed.kl, 0.0);
  EXPECT_EQ(borrowed.agreement, 1.0);
}

}  // namespace
}  // namespace blend
