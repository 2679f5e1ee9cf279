// The Backend defaults: launch()/wait() route a step whose rows are all plain draws through
// forward_draw() (a GPU draws them without moving vocabulary rows to the host; the default takes
// forward_argmax() when every row is greedy) and every other step through forward() and the host
// sampler.
#include "backend/backend.h"

#include <limits>
#include <vector>

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
  // With `draws_on_device`, a backend that draws on its device: answers 200 + r.
  bool forward_draw(const ForwardBatch& b, std::span<const DeviceDraw> d,
                    std::span<SampledToken> out) override {
    if (!draws_on_device) return Backend::forward_draw(b, d, out);
    ++draw_calls;
    seen_draws.assign(d.begin(), d.end());
    if (draw_declines) return false;
    for (size_t r = 0; r < out.size(); ++r) out[r].token = static_cast<TokenId>(200 + r);
    return true;
  }
  void copy_page(PageId, PageId) override {}
  void read_pages(std::span<const PageId>, std::byte*) const override {}
  void write_pages(std::span<const PageId>, const std::byte*) override {}
  void read_slots(PageId, int32_t, int32_t, std::byte*) const override {}
  void write_slots(PageId, int32_t, int32_t, const std::byte*) override {}

  ModelConfig config_;
  int forwards = 0, argmaxes = 0, draw_calls = 0;
  bool argmax_declines = false, draws_on_device = false, draw_declines = false;
  std::vector<DeviceDraw> seen_draws;
};

StepInput two_rows(const SamplingParams& first, const SamplingParams& second,
                   const TokenHistory& second_history = {}) {
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
  s.rows = {SampleRow{.seq = 0, .params = &first},
            SampleRow{.seq = 1, .params = &second, .rng_seed = 42, .history = second_history}};
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

TEST(BackendDefaults, PlainTemperatureRowsAreDrawnWhereTheLogitsAre) {
  FakeBackend b;
  b.draws_on_device = true;
  SamplingParams greedy, warm;
  greedy.temperature = 0;
  warm.temperature = 0.7f;
  const std::vector<TokenId> output = {9, 9, 9};  // the second row draws its output index 3
  EXPECT_EQ(step(b, two_rows(greedy, warm, {.output = output})), (std::vector<TokenId>{200, 201}));
  EXPECT_EQ(b.draw_calls, 1);
  EXPECT_EQ(b.forwards, 0);
  ASSERT_EQ(b.seen_draws.size(), 2u);
  EXPECT_EQ(b.seen_draws[0].inv_temperature, 0.0f);  // greedy: the argmax
  EXPECT_EQ(b.seen_draws[1].inv_temperature, 1.0f / 0.7f);
  EXPECT_EQ(b.seen_draws[1].uniform, sampling_uniform(42, 3));
  // A backend that does not draw on its device samples temperature rows on the host.
  FakeBackend host;
  EXPECT_EQ(step(host, two_rows(greedy, warm))[0], 3);
  EXPECT_EQ(host.forwards, 1);
}

TEST(BackendDefaults, CutsAndLogprobsAreDrawnWhereTheLogitsArePenaltiesOnTheHost) {
  SamplingParams warm;
  warm.temperature = 0.9f;
  for (int variant = 0; variant < 8; ++variant) {
    FakeBackend b;
    b.draws_on_device = true;
    SamplingParams other = warm;
    if (variant == 0) other.top_p = 0.95f;
    if (variant == 1) other.top_k = 40;
    if (variant == 2) other.min_p = 0.05f;
    if (variant == 3) other.logprobs = kMaxDeviceLogprobs;
    if (variant == 4) other.frequency_penalty = 0.2f;
    if (variant == 5) other.temperature = std::numeric_limits<float>::infinity();
    if (variant == 6) other.logprobs = kMaxDeviceLogprobs + 1;
    if (variant == 7) other.logit_bias = {{5, 1.0f}};
    step(b, two_rows(warm, other));
    const bool on_device = variant <= 3;
    EXPECT_EQ(b.draw_calls, on_device ? 1 : 0) << "variant " << variant;
    EXPECT_EQ(b.forwards, on_device ? 0 : 1) << "variant " << variant;
    if (!on_device) continue;
    const DeviceDraw& d = b.seen_draws[1];  // the parameters reach the backend as they are
    EXPECT_EQ(d.inv_temperature, 1.0f / 0.9f);
    EXPECT_EQ(d.top_p, other.top_p);
    EXPECT_EQ(d.top_k, other.top_k);
    EXPECT_EQ(d.min_p, other.min_p);
    EXPECT_EQ(d.logprobs, variant == 3 ? kMaxDeviceLogprobs : -1);
    EXPECT_EQ(b.seen_draws[0].logprobs, -1);
  }
  // top_k = 1 is the argmax, whatever the temperature; its logprobs are still asked for.
  FakeBackend b;
  b.draws_on_device = true;
  SamplingParams top1 = warm;
  top1.top_k = 1;
  top1.logprobs = 3;
  step(b, two_rows(warm, top1));
  EXPECT_EQ(b.draw_calls, 1);
  EXPECT_EQ(b.seen_draws[1].inv_temperature, 0.0f);
  EXPECT_EQ(b.seen_draws[1].logprobs, 3);
  // The default backend takes only argmaxes without logprobs to its forward_argmax.
  FakeBackend host;
  SamplingParams greedy_logprobs;
  greedy_logprobs.temperature = 0;
  greedy_logprobs.logprobs = 0;
  EXPECT_EQ(step(host, two_rows(greedy_logprobs, greedy_logprobs)), (std::vector<TokenId>{3, 4}));
  EXPECT_EQ(host.argmaxes, 0);
  EXPECT_EQ(host.forwards, 1);
}

TEST(BackendDefaults, ADeclinedDrawFallsBackToTheHostSampler) {
  FakeBackend b;
  b.draws_on_device = true;
  b.draw_declines = true;
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(step(b, two_rows(greedy, greedy)), (std::vector<TokenId>{3, 4}));
  EXPECT_EQ(b.draw_calls, 1);
  EXPECT_EQ(b.forwards, 1);
}

}  // namespace
}  // namespace blend
