// Several models in one engine (issue 24's seam for BlockLLM): each request runs on the model it
// names and gets that model's tokens whatever else shares the batch; blocks identical across
// models are loaded once; cached KV is never shared across models; models of another
// architecture are refused.
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine.h"
#include "model/derive.h"
#include "model/lora.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "run_requests.h"
#include "test_util.h"

namespace blend {
namespace {

class MultiModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    RandomInitOptions o;
    o.seed = 21;
    o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
    write_random_model(*find_model_preset("tiny"), base(), o);
    derive_full_finetune(base(), tuned(), {.seed = 5, .layers = {1}});  // layer 0 stays shared
    derive_lora(base(), lora(),
                {.seed = 8,
                 .rank = 8,
                 .alpha = 16,
                 .targets = parse_lora_targets("q_proj,v_proj,down_proj")});
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::filesystem::path base() { return *dir_ / "base"; }
  static std::filesystem::path tuned() { return *dir_ / "tuned"; }
  static std::filesystem::path lora() { return *dir_ / "lora"; }

  static EngineOptions options() {
    EngineOptions o;
    o.threads = 2;
    o.deterministic = true;
    o.kv_memory_gb = 0.05;
    return o;
  }

  static GenerationRequest request(const std::string& id, uint32_t seed, int len, ModelId model) {
    std::mt19937 rng(seed);
    GenerationRequest r;
    r.id = id;
    for (int i = 0; i < len; ++i) r.prompt.push_back(static_cast<TokenId>(rng() % 120000));
    r.params.max_tokens = 12;
    r.params.temperature = 0.8f;
    r.params.seed = seed;
    r.params.ignore_eos = true;
    r.model = model;
    return r;
  }

  static std::map<std::string, GenerationResult> run(Engine& engine,
                                                     std::vector<GenerationRequest> requests) {
    return testing::run_requests(engine, std::move(requests));
  }

  static testing::TempDir* dir_;
};
testing::TempDir* MultiModel::dir_ = nullptr;

TEST_F(MultiModel, EachRequestGetsItsOwnModelsTokensInAMixedBatch) {
  Engine both({{"base", base()}, {"tuned", tuned()}}, options());
  Engine base_only({{"base", base()}}, options());
  Engine tuned_only({{"tuned", tuned()}}, options());
  ASSERT_EQ(both.num_models(), 2);
  EXPECT_EQ(both.model_name(1), "tuned");

  // The same prompts on both models, interleaved, with prompts of several lengths so prefill
  // chunks and decodes of the two models share steps.
  std::vector<GenerationRequest> mixed, on_base, on_tuned;
  for (uint32_t i = 0; i < 6; ++i) {
    const int len = 5 + static_cast<int>(i) * 7;
    mixed.push_back(request("b" + std::to_string(i), 100 + i, len, 0));
    mixed.push_back(request("t" + std::to_string(i), 100 + i, len, 1));
    on_base.push_back(request("b" + std::to_string(i), 100 + i, len, 0));
    on_tuned.push_back(request("t" + std::to_string(i), 100 + i, len, 0));
  }
  const auto together = run(both, mixed);
  const auto alone_base = run(base_only, on_base);
  const auto alone_tuned = run(tuned_only, on_tuned);
  int differ = 0;
  for (uint32_t i = 0; i < 6; ++i) {
    const std::string b = "b" + std::to_string(i), t = "t" + std::to_string(i);
    EXPECT_EQ(together.at(b).tokens, alone_base.at(b).tokens) << b;
    EXPECT_EQ(together.at(t).tokens, alone_tuned.at(t).tokens) << t;
    EXPECT_EQ(together.at(t).text, alone_tuned.at(t).text) << t;
    differ += together.at(b).tokens != together.at(t).tokens ? 1 : 0;
  }
  // The fine-tune changes what is generated, so the check above could catch a mix-up.
  EXPECT_GE(differ, 4);
}

// Per-block batching with a LoRA tenant: the base, a full fine-tune and an adapter on the base
// in one batch (base projections computed once over all rows, the adapter's delta on its rows)
// give each request the tokens it gets on an engine of its model alone.
TEST_F(MultiModel, ALoraTenantGetsItsOwnTokensBesideItsBase) {
  Engine zoo({{"base", base(), {}}, {"lora", base(), lora()}, {"tuned", tuned(), {}}}, options());
  Engine base_only({{"base", base()}}, options());
  Engine lora_only({{"lora", base(), lora()}}, options());
  Engine tuned_only({{"tuned", tuned()}}, options());
  std::vector<GenerationRequest> mixed;
  std::vector<GenerationRequest> alone[3];
  for (uint32_t i = 0; i < 4; ++i) {
    const int len = 6 + static_cast<int>(i) * 9;
    for (ModelId m = 0; m < 3; ++m) {
      const std::string id = std::to_string(m) + "-" + std::to_string(i);
      mixed.push_back(request(id, 200 + i, len, m));
      alone[m].push_back(request(id, 200 + i, len, 0));
    }
  }
  const auto together = run(zoo, mixed);
  const std::map<std::string, GenerationResult> apart[3] = {
      run(base_only, alone[0]), run(lora_only, alone[1]), run(tuned_only, alone[2])};
  int differ = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    for (int m = 0; m < 3; ++m) {
      const std::string id = std::to_string(m) + "-" + std::to_string(i);
      EXPECT_EQ(together.at(id).tokens, apart[m].at(id).tokens) << id;
    }
    differ +=
        together.at("0-" + std::to_string(i)).tokens != together.at("1-" + std::to_string(i)).tokens
            ? 1
            : 0;
  }
  EXPECT_GE(differ, 3);  // the adapter changes what is generated
  // The adapter adds its factors only: 2 attention and 2 FFN blocks of its own, no base weights.
  const WeightStats with_lora = zoo.weight_stats(),
                    without =
                        Engine({{"base", base()}, {"tuned", tuned()}}, options()).weight_stats();
  EXPECT_EQ(with_lora.unique_blocks, without.unique_blocks + 4);
  EXPECT_LT(with_lora.bytes - without.bytes, base_only.weight_stats().bytes / 20);
}

// BlockLLM's three deployments in one engine (--tenancy): the same tokens, only the sharing
// differs. blocks: the fine-tune's 4 unchanged blocks and the adapter's base are shared; ps: only
// the adapter's base (S-LoRA); per-model: nothing, the adapter's base is a copy of its own.
TEST_F(MultiModel, TenancyChangesWhatIsSharedNotTheTokens) {
  const std::vector<ModelFolder> zoo = {
      {"base", base(), {}}, {"lora", base(), lora()}, {"tuned", tuned(), {}}};
  std::vector<GenerationRequest> mixed;
  for (uint32_t i = 0; i < 3; ++i)
    for (ModelId m = 0; m < 3; ++m)
      mixed.push_back(request(std::to_string(m) + "-" + std::to_string(i), 300 + i,
                              5 + 7 * static_cast<int>(i), m));
  std::map<Tenancy, WeightStats> stats;
  std::map<Tenancy, std::map<std::string, GenerationResult>> out;
  for (Tenancy t : {Tenancy::kBlocks, Tenancy::kParameterSharing, Tenancy::kPerModel}) {
    EngineOptions o = options();
    o.tenancy = t;
    Engine engine(zoo, o);
    stats[t] = engine.weight_stats();
    out[t] = run(engine, mixed);
  }
  for (const auto& [id, r] : out[Tenancy::kBlocks]) {
    EXPECT_EQ(out[Tenancy::kParameterSharing].at(id).tokens, r.tokens) << id;
    EXPECT_EQ(out[Tenancy::kPerModel].at(id).tokens, r.tokens) << id;
  }
  const Engine base_only({{"base", base()}}, options());
  const int64_t one = base_only.weight_stats().bytes;
  const WeightStats &blocks = stats[Tenancy::kBlocks], &ps = stats[Tenancy::kParameterSharing],
                    &per_model = stats[Tenancy::kPerModel];
  // 6 blocks a model: blocks shares the tuned model's 4 unchanged ones and the adapter's base
  // (the adapter adds 4 blocks of factors); ps shares only the adapter's base; per-model nothing.
  EXPECT_EQ(blocks.unique_blocks, 6 + 4 + 2);
  EXPECT_EQ(ps.unique_blocks, 6 + 4 + 6);
  EXPECT_EQ(per_model.unique_blocks, 6 + 6 + 6);
  EXPECT_LT(blocks.bytes, ps.bytes);
  EXPECT_LT(ps.bytes, per_model.bytes);
  EXPECT_GT(per_model.bytes, 3 * one);  // three copies of the base's weights, and the factors
  EXPECT_LT(ps.bytes, 2 * one + one / 20);
}

TEST_F(MultiModel, BlocksTheModelsShareAreLoadedOnce) {
  Engine one({{"base", base()}}, options());
  Engine both({{"base", base()}, {"tuned", tuned()}}, options());
  Engine same_twice({{"a", base()}, {"b", base()}}, options());
  // A tiny model is 6 blocks: embedding, attention and FFN of 2 layers, head. The fine-tune
  // changed layer 1 (its attention and FFN), so 4 of its 6 blocks are the base's.
  const WeightStats s1 = one.weight_stats(), s2 = both.weight_stats(),
                    s3 = same_twice.weight_stats();
  EXPECT_EQ(s1.blocks, 6);
  EXPECT_EQ(s1.unique_blocks, 6);
  EXPECT_EQ(s1.bytes, s1.unshared_bytes);
  EXPECT_EQ(s2.blocks, 12);
  EXPECT_EQ(s2.unique_blocks, 8);
  EXPECT_EQ(s2.unshared_bytes, 2 * s1.bytes);
  EXPECT_GT(s2.bytes, s1.bytes);
  EXPECT_LT(s2.bytes, s2.unshared_bytes);
  EXPECT_EQ(s3.unique_blocks, 6);
  EXPECT_EQ(s3.bytes, s1.bytes);
}

TEST_F(MultiModel, CachedPrefixesAreNeverSharedAcrossModels) {
  EngineOptions o = options();
  Engine same_twice({{"a", base()}, {"b", base()}}, o);
  // Identical weights: sharing KV would even give the same tokens, so only the cache counters
  // show whether model b reused model a's pages.
  auto first = run(same_twice, {request("a1", 7, 64, 0)});
  auto other = run(same_twice, {request("b1", 7, 64, 1)});
  auto again = run(same_twice, {request("a2", 7, 64, 0)});
  EXPECT_EQ(first.at("a1").cached_tokens, 0);
  EXPECT_EQ(other.at("b1").cached_tokens, 0);
  EXPECT_GE(again.at("a2").cached_tokens, 48);
  EXPECT_EQ(other.at("b1").tokens, first.at("a1").tokens);
}

TEST_F(MultiModel, BadModelsAndModelIdsAreRefused) {
  testing::TempDir other;
  RandomInitOptions o;
  o.seed = 3;
  o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  ModelConfig three_layers = *find_model_preset("tiny");
  three_layers.num_layers = 3;
  write_random_model(three_layers, other.path(), o);
  try {
    Engine e({{"base", base()}, {"deep", other.path()}}, options());
    FAIL() << "a model of another architecture was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_hidden_layers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Engine({{"m", base()}, {"m", tuned()}}, options()), Error);

  Engine both({{"base", base()}, {"tuned", tuned()}}, options());
  EXPECT_TRUE(both.models_share_tokenizer());
  EXPECT_EQ(both.tokenizer_owner(1), 0);
  // Another tokenizer.json: the engine serves it with its own tokenizer; a model with the
  // first's shares the first's.
  std::filesystem::copy(tuned(), other / "retok");
  { std::ofstream(other / "retok" / "tokenizer.json", std::ios::app) << "\n"; }
  const Engine three({{"base", base()}, {"retok", other / "retok"}, {"tuned", tuned()}}, options());
  EXPECT_FALSE(three.models_share_tokenizer());
  EXPECT_EQ(three.tokenizer_owner(1), 1);
  EXPECT_EQ(three.tokenizer_owner(2), 0);
  GenerationRequest r = request("x", 1, 8, 2);
  EXPECT_THROW(both.check_request(r), Error);
  r.model = -1;
  EXPECT_THROW(both.check_request(r), Error);
  EngineOptions sim_like = options();
  sim_like.backend = "sim";
  EXPECT_THROW(Engine({{"base", base()}, {"tuned", tuned()}}, sim_like), Error);
}

}  // namespace
}  // namespace blend
