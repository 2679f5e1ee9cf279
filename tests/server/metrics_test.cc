// Metrics' token counters against the order the engine thread reports in: a request finishes
// inside a step (on_engine_tokens, then on_finished), and on_step reports that step after.

#include "server/metrics.h"

#include <string>

#include <gtest/gtest.h>

namespace blend {
namespace {

// The value of the sample line `name` (labels included) in a render, or -1 if absent.
double sample(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

EngineStats after_tokens(int64_t prompt, int64_t output) {
  EngineStats s;
  s.prompt_tokens_by_class[static_cast<size_t>(RequestClass::kRealtime)] = prompt;
  s.output_tokens_by_class[static_cast<size_t>(RequestClass::kRealtime)] = output;
  return s;
}

// A five-token answer whose first four tokens an earlier step reported: the counters read
// right after the answer said 9 (four from the step, five again from the finished request).
TEST(Metrics, AFinishedRequestsTokensCountOnceBeforeAndAfterItsStepIsReported) {
  Metrics m;
  const std::string generated = "blend:generation_tokens_total{class=\"rt\"}";
  const std::string prompted = "blend:prompt_tokens_total{class=\"rt\"}";
  m.on_queued(RequestClass::kRealtime);
  m.on_first_token(RequestClass::kRealtime, 0.01);
  m.on_step(after_tokens(7, 4));
  EXPECT_EQ(sample(m.render(), generated), 4);
  m.on_engine_tokens(after_tokens(7, 5));  // the last step, as the request finishes in it
  m.on_finished(RequestClass::kRealtime, true, "length", 7, 5, 0.05, 0.01);
  const std::string read_right_after = m.render();
  EXPECT_EQ(sample(read_right_after, generated), 5);
  EXPECT_EQ(sample(read_right_after, prompted), 7);
  m.on_step(after_tokens(7, 5));
  EXPECT_EQ(sample(m.render(), generated), 5);
  EXPECT_EQ(sample(m.render(), prompted), 7);
}

}  // namespace
}  // namespace blend
