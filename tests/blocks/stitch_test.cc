// blocks/stitch: stitching blocks between models of different widths (BlockLLM §4.4) on
// constructed cases. A widened copy of a model (model derive --widen) computes the same function
// in a wider stream, so the exact stitch exists (Q) and least squares must find it; perturbing
// the wide model's later layers leaves the stitch exact before them and not after; training
// lowers the loss it follows. Also the cpu backend's forward_layers, which the stitch runs on.
#include "blocks/stitch.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "core/forward_batch.h"
#include "model/derive.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "test_models.h"
#include "test_util.h"

namespace blend {
namespace {

constexpr int64_t kLayers = 3;

struct Loaded {
  ModelConfig config;
  TensorStore store;
  std::unique_ptr<CpuBackend> backend;
};

class Stitch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    ModelConfig c = testing::test_model_config("base");  // tiny, 4,096-token vocabulary
    c.num_layers = kLayers;
    RandomInitOptions o;
    o.seed = 41;
    o.dtype = DType::kF32;
    o.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
    write_random_model(c, *dir_ / "narrow", o);
    o.seed = 42;
    write_random_model(c, *dir_ / "other", o);
    derive_widened(*dir_ / "narrow", *dir_ / "wide", 96, 7);
    derive_full_finetune(*dir_ / "wide", *dir_ / "changed", {.seed = 2, .layers = {1}});
    derive_widened(*dir_ / "other", *dir_ / "other-wide", 96, 8);
    std::mt19937 rng(5);
    // The training half holds more positions (about 130) than the narrow width has inputs
    // (66), so least squares is determined.
    for (int p = 0; p < 6; ++p) {
      prompts_.emplace_back();
      for (int i = 0; i < 36 + 4 * p; ++i)
        prompts_.back().push_back(static_cast<TokenId>(rng() % 4096));
    }
  }
  static void TearDownTestSuite() {
    models_.clear();
    delete dir_;
  }
  static Loaded& model(const std::string& name) {
    auto& slot = models_[name];
    if (!slot) {
      slot = std::make_unique<Loaded>();
      slot->config = ModelConfig::from_dir(*dir_ / name);
      slot->store = TensorStore::open_dir(*dir_ / name);
      BackendOptions o;
      o.threads = 2;
      o.num_pages = 64;
      slot->backend = make_cpu_backend(slot->config, slot->store, o, CpuGemmLib::kOneDnn);
    }
    return *slot;
  }
  static StitchModels pair(const std::string& head, const std::string& tail) {
    return {.head = model(head).backend.get(),
            .tail = model(tail).backend.get(),
            .tail_weights = &model(tail).store,
            .page_size = 16};
  }
  static std::vector<std::vector<TokenId>> train() {
    return {prompts_[0], prompts_[2], prompts_[4]};
  }
  static std::vector<std::vector<TokenId>> held_out() {
    return {prompts_[1], prompts_[3], prompts_[5]};
  }
  static ForwardBatch batch_of(const std::vector<TokenId>& tokens) {
    ForwardBatch b;
    SeqChunk c;
    c.seq = 1;
    c.num_tokens = static_cast<int32_t>(tokens.size());
    c.block_table = {0, 1, 2, 3};
    c.wants_logits = true;
    b.chunks.push_back(c);
    b.tokens = tokens;
    for (int32_t i = 0; i < c.num_tokens; ++i) b.positions.push_back(i);
    return b;
  }

  static testing::TempDir* dir_;
  static std::map<std::string, std::unique_ptr<Loaded>> models_;
  static std::vector<std::vector<TokenId>> prompts_;
};
testing::TempDir* Stitch::dir_ = nullptr;
std::map<std::string, std::unique_ptr<Loaded>> Stitch::models_;
std::vector<std::vector<TokenId>> Stitch::prompts_;

TEST_F(Stitch, ForwardLayersInSegmentsIsTheWholeForwardPass) {
  CpuBackend& b = *model("narrow").backend;
  const ForwardBatch batch = batch_of(prompts_[3]);
  const auto m = static_cast<size_t>(batch.num_tokens());
  const int64_t h = b.config().hidden_size, vocab = b.config().vocab_size;
  std::vector<float> whole(m * h), first(m * h), second(m * h), logits(m * vocab),
      last(static_cast<size_t>(vocab));
  b.forward_layers(batch, 0, kLayers, {}, whole, logits);
  b.forward_layers(batch, 0, 1, {}, first, {});
  b.forward_layers(batch, 1, kLayers, first, second, {});
  EXPECT_EQ(second, whole);
  // forward()'s logits for the chunk's last token are the last row of every row's.
  b.forward(batch, last);
  for (int64_t v = 0; v < vocab; ++v)
    ASSERT_NEAR(last[v], logits[(m - 1) * vocab + v], 1e-4f * (1 + std::abs(last[v]))) << v;
  // An empty range copies the stream through.
  std::vector<float> same(m * h);
  b.forward_layers(batch, 1, 1, first, same, {});
  EXPECT_EQ(same, first);
  EXPECT_THROW(b.forward_layers(batch, 1, kLayers, {}, second, {}), Error);  // no input
  EXPECT_THROW(b.forward_layers(batch, 0, kLayers + 1, {}, second, {}), Error);
  EXPECT_THROW(b.forward_layers(batch, 0, 1, {}, std::span<float>(second).first(h), {}), Error);
}

TEST_F(Stitch, AWidenedModelComputesWhatItsBaseComputes) {
  const ForwardBatch batch = batch_of(prompts_[2]);
  const auto m = static_cast<size_t>(batch.num_tokens());
  const int64_t vocab = model("narrow").config.vocab_size;
  EXPECT_EQ(model("wide").config.hidden_size, 96);
  EXPECT_EQ(model("wide").config.head_dim, model("narrow").config.head_dim);
  std::vector<float> narrow(m * vocab), wide(m * vocab);
  model("narrow").backend->forward_layers(batch, 0, kLayers, {}, {}, narrow);
  model("wide").backend->forward_layers(batch, 0, kLayers, {}, {}, wide);
  double worst = 0;
  for (size_t i = 0; i < narrow.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(narrow[i] - wide[i])));
  EXPECT_LT(worst, 1e-3);
  EXPECT_THROW(derive_widened(*dir_ / "narrow", *dir_ / "too-narrow", 64, 1), Error);
}

TEST_F(Stitch, LeastSquaresFindsTheExactStitch) {
  const StitchModels models = pair("narrow", "wide");
  const auto points = proportional_stitch_points(kLayers, kLayers, 2);
  ASSERT_EQ(points.size(), 2u);  // head layers 0 and 1, each to the next tail layer
  EXPECT_EQ(points[0].head_layer, 0);
  EXPECT_EQ(points[0].tail_layer, 1);
  const StitchBlock block = train_stitch(models, train(), {.points = points, .steps_per_stage = 0});
  for (const StitchPoint& p : points) {
    const StitchQuality q = evaluate_stitch(models, block, p, held_out());
    EXPECT_GT(q.cosine, 0.9999) << p.head_layer;
    EXPECT_EQ(q.agreement, 1.0) << p.head_layer;
    EXPECT_LT(q.kl, 1e-5) << p.head_layer;
  }
  // Evaluated together (the tail's own run shared), each case is what it is alone.
  const std::vector<StitchCase> cases = {{&block, points[0]}, {&block, points[1]}};
  const std::vector<StitchQuality> together = evaluate_stitches(models, cases, held_out());
  ASSERT_EQ(together.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const StitchQuality alone = evaluate_stitch(models, block, points[i], held_out());
    EXPECT_NEAR(together[i].kl, alone.kl, 1e-9) << i;
    EXPECT_EQ(together[i].agreement, alone.agreement) << i;
  }
  // Training from the exact stitch cannot lower the loss: its first stage is undone, and every
  // stage that is undone reports the loss it started from.
  std::vector<StitchStage> stages;
  const StitchBlock trained =
      train_stitch(models, train(), {.points = points, .steps_per_stage = 3}, &stages);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_FALSE(stages[0].kept);
  EXPECT_EQ(block.weight.size(), trained.weight.size());
  for (const StitchStage& s : stages) {
    if (!s.kept) {
      EXPECT_EQ(s.kl_after, s.kl_before);
    }
  }
  if (!stages[1].kept) {
    EXPECT_EQ(trained.weight, block.weight);  // both stages undone: the least-squares block
  }
  EXPECT_GT(evaluate_stitch(models, trained, points[1], held_out()).cosine, 0.9999);
}

TEST_F(Stitch, TheStitchIsExactOnlyWhereTheSkippedLayersAreEquivalent) {
  // "changed" is the wide model with layer 1 changed. A stitch into its layer 1 skips only its
  // layer 0 (the narrow model's, widened): exact. One into its layer 2 skips the change.
  const StitchModels models = pair("narrow", "changed");
  const StitchPoint early{0, 1}, late{1, 2};
  const StitchQuality exact = evaluate_stitch(
      models, train_stitch(models, train(), {.points = {early}, .steps_per_stage = 0}), early,
      held_out());
  EXPECT_GT(exact.cosine, 0.9999);
  EXPECT_EQ(exact.agreement, 1.0);
  const StitchQuality skipped = evaluate_stitch(
      models, train_stitch(models, train(), {.points = {late}, .steps_per_stage = 0}), late,
      held_out());
  EXPECT_LT(skipped.cosine, 0.999);
  EXPECT_GT(skipped.kl, 100 * exact.kl + 1e-4);
  // Unrelated models: no linear map makes one's stream the other's.
  const StitchModels unrelated = pair("narrow", "other-wide");
  const StitchQuality apart = evaluate_stitch(
      unrelated, train_stitch(unrelated, train(), {.points = {early}, .steps_per_stage = 0}), early,
      held_out());
  EXPECT_LT(apart.cosine, 0.99);
  EXPECT_GT(apart.kl, 100 * exact.kl + 1e-4);
}

TEST_F(Stitch, TrainingLowersTheLensLossStageByStage) {
  const StitchModels models = pair("narrow", "other-wide");
  std::vector<StitchStage> stages;
  const StitchBlock block = train_stitch(
      models, train(), {.points = {{1, 2}, {0, 1}}, .steps_per_stage = 4, .learning_rate = 1e-3},
      &stages);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].point.head_layer, 0);  // shallow first, whatever order was given
  for (const StitchStage& s : stages) EXPECT_LT(s.kl_after, s.kl_before) << s.point.head_layer;
  EXPECT_EQ(block.in, 64);
  EXPECT_EQ(block.out, 96);

  const auto path = *dir_ / "stitch.safetensors";
  block.save(path);
  const StitchBlock loaded = StitchBlock::load(path);
  EXPECT_EQ(loaded.in, block.in);
  EXPECT_EQ(loaded.weight, block.weight);
  EXPECT_THROW(StitchBlock::load(*dir_ / "narrow" / "model.safetensors"), Error);
}

TEST_F(Stitch, BadInputIsRefused) {
  const StitchModels models = pair("narrow", "wide");
  EXPECT_THROW(train_stitch(models, train(), {.points = {{kLayers, 1}}}), Error);
  EXPECT_THROW(train_stitch(models, train(), {.points = {}}), Error);
  EXPECT_THROW(train_stitch(models, {{}}, {.points = {{0, 1}}}), Error);
  EXPECT_THROW(train_stitch(models, train(), {.points = {{0, 1}}, .learning_rate = -1}), Error);
  // A block of the wrong widths for the models.
  const StitchBlock block =
      train_stitch(models, train(), {.points = {{0, 1}}, .steps_per_stage = 0});
  EXPECT_THROW(evaluate_stitch(pair("wide", "narrow"), block, {0, 1}, held_out()), Error);
  EXPECT_THROW(proportional_stitch_points(1, 4, 2), Error);
  EXPECT_THROW(proportional_stitch_points(4, 4, 0), Error);
}

}  // namespace
}  // namespace blend
