// The Backend defaults: launch()/wait() route a step whose rows all sample plainly greedily
// through forward_argmax() (the GPU's argmax without moving vocabulary rows to the host) and
// every other step through forward() and the host sampler.
#include "backend/backend.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace blend {
namespace {

// Logits row r: token (3 + r) holds the maximum. forward_argmax answers 100 + r, so the test
// sees which path produced a token; `argmax_declines` makes it decline (a NaN on a GPU).
class FakeBackend final : public Backend {
 public:
  FakeBackend() { config_.vocab_size = 16; }
  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "fake"; }
  DType compute_dtype() const override { return DType::kF32; }
  int64_t kv_bytes_per_page() const override { return 0; }
  int64_t num_pages() const override { return 0; }
  void allocate_kv(int64_t) override {}
  void forward(const ForwardBatch& batch, std::span<float> logits) override {
    ++forwards;
    for (int32_t r = 0; r < batch.num_logit_rows(); ++r)
      for (int64_t t = 0; t < 16; ++t) logits[r * 16 + t] = t == 3 + r ? 1.0f : 0.0f;
  }
  bool forward_argmax(const ForwardBatch&, std::span<TokenId> tokens) override {
    ++argmaxes;
    if (argmax_declines) return false;
    for (size_t r = 0; r < tokens.size(); ++r) tokens[r] = static_cast<TokenId>(100 + r);
    return true;
  }
  void copy_page(PageId, PageId) override {}
  void read_pages(std::span<const PageId>, std::byte*) const override {}
  void write_pages(std::span<const PageId>, const std::byte*) override {}
  void read_slots(PageId, int32_t, int32_t, std::byte*) const override {}
  void write_slots(PageId, int32_t, int32_t, const std::byte*) override {}

  ModelConfig config_;
  int forwards = 0, argmaxes = 0;
  bool argmax_declines = false;
};

StepInput two_rows(const SamplingParams& first, const SamplingParams& second) {
  StepInput s;
  for (int i = 0; i < 2; ++i) {
    SeqChunk c;
    c.seq = i;
    c.num_tokens = 1;
    c.token_offset = i;
    c.wants_logits = true;
    s.batch.tokens.push_back(1);
    s.batch.positions.push_back(0);
    s.batch.chunks.push_back(c);
  }
  s.rows = {SampleRow{.seq = 0, .params = &first}, SampleRow{.seq = 1, .params = &second}};
  return s;
}

std::vector<TokenId> step(FakeBackend& b, StepInput s) {
  b.launch(std::move(s));
  std::vector<TokenId> tokens;
  for (const SampledToken& t : b.wait()) tokens.push_back(t.token);
  return tokens;
}

TEST(BackendDefaults, PlainGreedyStepsTakeTheBackendsArgmax) {
  FakeBackend b;
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(step(b, two_rows(greedy, greedy)), (std::vector<TokenId>{100, 101}));
  EXPECT_EQ(b.argmaxes, 1);
  EXPECT_EQ(b.forwards, 0);
}

TEST(BackendDefaults, AnyRowThatReadsTheWholeRowSamplesOnTheHost) {
  SamplingParams greedy;
  greedy.temperature = 0;
  for (int variant = 0; variant < 5; ++variant) {
    FakeBackend b;
    SamplingParams other = greedy;
    if (variant == 0) other.logprobs = 0;
    if (variant == 1) other.repetition_penalty = 1.1f;
    if (variant == 2) other.presence_penalty = 0.5f;
    if (variant == 3) other.logit_bias = {{5, 1.0f}};
    if (variant == 4) other.temperature = 0.7f;
    EXPECT_EQ(step(b, two_rows(greedy, other))[0], 3) << "variant " << variant;
    EXPECT_EQ(b.argmaxes, 0) << "variant " << variant;
    EXPECT_EQ(b.forwards, 1) << "variant " << variant;
  }
}

TEST(BackendDefaults, ADeclinedArgmaxFallsBackToTheHostSampler) {
  FakeBackend b;
  b.argmax_declines = true;
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(step(b, two_rows(greedy, greedy)), (std::vector<TokenId>{3, 4}));
  EXPECT_EQ(b.argmaxes, 1);
  EXPECT_EQ(b.forwards, 1);
}

}  // namespace
}  // namespace blend
