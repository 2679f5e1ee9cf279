// blocks/equivalence: BlockLLM's block similarity on constructed cases (a block against itself
// and against a byte-identical copy gives 1, a perturbed block less, a weak adapter nearly 1), and
// the chains it runs on (add_chain) against the models they are made of.
#include "blocks/equivalence.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "model/derive.h"
#include "model/lora.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "test_util.h"

namespace blend {
namespace {

class Equivalence : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    RandomInitOptions o;
    o.seed = 31;
    o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
    write_random_model(*find_model_preset("tiny"), *dir_ / "base", o);
    std::filesystem::copy(*dir_ / "base", *dir_ / "copy");
    derive_full_finetune(*dir_ / "base", *dir_ / "tuned", {.seed = 2, .layers = {1}});
    derive_lora(*dir_ / "base", *dir_ / "weak", {.seed = 3, .rank = 4, .alpha = 0.02});
    derive_lora(*dir_ / "base", *dir_ / "strong", {.seed = 3, .rank = 4, .alpha = 8});
    EngineOptions options;
    options.threads = 2;
    options.deterministic = true;
    options.kv_memory_gb = 0.05;
    const auto base = *dir_ / "base";
    engine_ = new Engine({{"base", base, {}},
                          {"copy", *dir_ / "copy", {}},
                          {"tuned", *dir_ / "tuned", {}},
                          {"weak", base, *dir_ / "weak"},
                          {"strong", base, *dir_ / "strong"}},
                         options);
    std::mt19937 rng(4);
    for (int p = 0; p < 4; ++p) {
      prompts_.emplace_back();
      for (int i = 0; i < 10 + 3 * p; ++i)
        prompts_.back().push_back(static_cast<TokenId>(rng() % 120000));
    }
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete dir_;
  }
  static CpuBackend& backend() { return dynamic_cast<CpuBackend&>(engine_->backend()); }
  static double similarity(ModelId b, int64_t layer, LayerBlock block) {
    return block_similarity(backend(), 16, 0, b, layer, block, prompts_);
  }

  static testing::TempDir* dir_;
  static Engine* engine_;
  static std::vector<std::vector<TokenId>> prompts_;
};
testing::TempDir* Equivalence::dir_ = nullptr;
Engine* Equivalence::engine_ = nullptr;
std::vector<std::vector<TokenId>> Equivalence::prompts_;

TEST_F(Equivalence, ABlockAgainstItselfIsOne) {
  for (int64_t layer : {0, 1})
    for (LayerBlock block : {LayerBlock::kAttention, LayerBlock::kFfn})
      EXPECT_NEAR(similarity(0, layer, block), 1.0, 1e-12) << layer;
}

TEST_F(Equivalence, ByteIdenticalBlocksAreReportedIdenticalWithoutRunning) {
  const auto blocks = compare_blocks(backend(), 16, 0, 1, prompts_);
  ASSERT_EQ(blocks.size(), 4u);
  for (const BlockSimilarity& s : blocks) {
    EXPECT_TRUE(s.identical);
    EXPECT_EQ(s.similarity, 1.0);
  }
}

TEST_F(Equivalence, PerturbedBlocksScoreBelowOneAndWeakAdaptersNearIt) {
  const auto tuned = compare_blocks(backend(), 16, 0, 2, prompts_);
  ASSERT_EQ(tuned.size(), 4u);
  EXPECT_TRUE(tuned[0].identical);  // layer 0 attention
  EXPECT_TRUE(tuned[1].identical);  // layer 0 FFN
  for (size_t i : {2u, 3u}) {
    EXPECT_FALSE(tuned[i].identical);
    EXPECT_LT(tuned[i].similarity, 0.999) << i;
    EXPECT_GT(tuned[i].similarity, 0.0) << i;
  }
  // The adapters change the attention blocks only (q_proj, v_proj); a 400x smaller scale stays
  // much closer to the base.
  const double weak = similarity(3, 0, LayerBlock::kAttention);
  const double strong = similarity(4, 0, LayerBlock::kAttention);
  EXPECT_GT(weak, 0.999);
  EXPECT_LT(strong, weak);
  EXPECT_TRUE(backend().shares_block(0, 3, 0, LayerBlock::kFfn));
  EXPECT_FALSE(backend().shares_block(0, 3, 0, LayerBlock::kAttention));
}

TEST_F(Equivalence, AChainOfAModelsOwnBlocksIsThatModel) {
  // A full-depth chain of "tuned"'s blocks on the base's embedding and head computes the same
  // logits as "tuned" (which shares them), bit for bit in deterministic mode; one with the base's
  // layer 1 computes the base's.
  const ModelId tuned = backend().add_chain({.base = 0, .attention = {2, 2}, .ffn = {2, 2}});
  const ModelId base = backend().add_chain({.base = 2, .attention = {0, 0}, .ffn = {0, 0}});
  ForwardBatch batch;
  const ModelId models[] = {2, tuned, 0, base};
  for (int s = 0; s < 4; ++s) {
    SeqChunk c;
    c.seq = s + 1;
    c.num_tokens = static_cast<int32_t>(prompts_[0].size());
    c.token_offset = batch.num_tokens();
    c.block_table = {static_cast<PageId>(s)};
    c.wants_logits = true;
    c.model = models[s];
    for (size_t i = 0; i < prompts_[0].size(); ++i) {
      batch.tokens.push_back(prompts_[0][i]);
      batch.positions.push_back(static_cast<int32_t>(i));
    }
    batch.chunks.push_back(c);
  }
  const int64_t vocab = backend().config().vocab_size;
  std::vector<float> logits(4 * vocab);
  backend().forward(batch, logits);
  auto row = [&](int r) {
    return std::vector<float>(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
  };
  EXPECT_EQ(row(0), row(1));
  EXPECT_EQ(row(2), row(3));
  EXPECT_NE(row(0), row(2));
}

TEST_F(Equivalence, BadChainsAndPromptsAreRefused) {
  EXPECT_THROW(backend().add_chain({.base = 100000, .attention = {0}, .ffn = {0}}), Error);
  EXPECT_THROW(backend().add_chain({.base = 0, .attention = {0}, .ffn = {0, 0}}), Error);
  EXPECT_THROW(backend().add_chain({.base = 0, .attention = {0, 0, 0}, .ffn = {0, 0, 0}}), Error);
  EXPECT_THROW(block_similarity(backend(), 16, 0, 1, 0, LayerBlock::kFfn, {}), Error);
  EXPECT_THROW(block_similarity(backend(), 16, 0, 1, 0, LayerBlock::kFfn, {{}}), Error);
  const std::vector<std::vector<TokenId>> huge(1, std::vector<TokenId>(1'000'000, 5));
  EXPECT_THROW(block_similarity(backend(), 16, 0, 1, 0, LayerBlock::kFfn, huge), Error);
}

}  // namespace
}  // namespace blend
