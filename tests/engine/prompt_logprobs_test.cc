// prompt_logprobs (vLLM's extra field) through the engine on the cpu backend: every prompt
// token scored as greedy decoding would score it, the same values whether the prefill is
// chunked, preempted or batched with others (deterministic mode), the prefix cache not read,
// and the request refused where it cannot be served.
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "backend/sim/sim_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/presets.h"
#include "run_requests.h"
#include "test_models.h"
#include "test_util.h"

namespace blend {
namespace {

// Every test runs with plain and with overlapped steps.
class PromptLogprobsTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::write_tiny_model(dir_->path(), 11);
  }
  static void TearDownTestSuite() { delete dir_; }

  static EngineOptions options() {
    EngineOptions o;
    o.threads = 2;
    o.deterministic = true;
    o.kv_memory_gb = 0.05;
    o.overlap = GetParam();
    return o;
  }

  static std::vector<TokenId> prompt(uint32_t seed, int len) {
    std::mt19937 rng(seed);
    std::vector<TokenId> p;
    for (int i = 0; i < len; ++i) p.push_back(static_cast<TokenId>(rng() % 120000));
    return p;
  }

  static GenerationRequest request(const std::string& id, std::vector<TokenId> tokens,
                                   int max_tokens, std::optional<int32_t> prompt_logprobs) {
    GenerationRequest r;
    r.id = id;
    r.prompt = std::move(tokens);
    r.params.max_tokens = max_tokens;
    r.params.temperature = 0.0f;
    r.params.ignore_eos = true;
    r.params.prompt_logprobs = prompt_logprobs;
    return r;
  }

  static std::map<std::string, GenerationResult> run(const EngineOptions& o,
                                                     std::vector<GenerationRequest> requests) {
    Engine engine(dir_->path(), o);
    return testing::run_requests(engine, std::move(requests));
  }

  // The same scores, bit for bit.
  static void expect_same(const std::vector<PromptLogprob>& a, const std::vector<PromptLogprob>& b,
                          const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].token, b[i].token) << what << " position " << i;
      EXPECT_EQ(a[i].logprob, b[i].logprob) << what << " position " << i;
      EXPECT_EQ(a[i].rank, b[i].rank) << what << " position " << i;
      ASSERT_EQ(a[i].top.size(), b[i].top.size()) << what;
      for (size_t k = 0; k < a[i].top.size(); ++k) {
        EXPECT_EQ(a[i].top[k].token, b[i].top[k].token) << what << " position " << i;
        EXPECT_EQ(a[i].top[k].logprob, b[i].top[k].logprob) << what << " position " << i;
      }
    }
  }

  static testing::TempDir* dir_;
};

testing::TempDir* PromptLogprobsTest::dir_ = nullptr;

// Greedy decoding from `base` samples g0 g1 g2 g3 with their logprobs; the prompt base + g0 g1
// g2 must score its last three tokens with those same logprobs, as the most likely tokens
// (rank 1, first of the top list, the greedy run's alternatives), and then sample g3.
TEST_P(PromptLogprobsTest, PromptTokensScoreAsGreedyDecodingSampledThem) {
  const std::vector<TokenId> base = prompt(5, 20);
  GenerationRequest greedy = request("greedy", base, 4, std::nullopt);
  greedy.params.logprobs = 3;
  const GenerationResult g = run(options(), {greedy})["greedy"];
  ASSERT_EQ(g.tokens.size(), 4u);
  ASSERT_EQ(g.logprobs.size(), 4u);

  std::vector<TokenId> longer = base;
  longer.insert(longer.end(), g.tokens.begin(), g.tokens.begin() + 3);
  GenerationRequest scored = request("scored", longer, 1, 3);
  scored.params.logprobs = 3;
  const GenerationResult s = run(options(), {scored})["scored"];
  ASSERT_EQ(s.prompt_logprobs.size(), longer.size());
  EXPECT_EQ(s.prompt_logprobs[0].token, longer[0]);  // nothing before it to score it
  EXPECT_EQ(s.prompt_logprobs[0].rank, 0);
  EXPECT_TRUE(s.prompt_logprobs[0].top.empty());
  for (size_t p = 1; p < longer.size(); ++p) {
    const PromptLogprob& e = s.prompt_logprobs[p];
    EXPECT_EQ(e.token, longer[p]);
    ASSERT_EQ(e.top.size(), 3u);
    EXPECT_GE(e.rank, 1);
    EXPECT_LE(e.logprob, e.top[0].logprob);
    EXPECT_LT(e.top[0].logprob, 0.0f);
    for (size_t k = 1; k < e.top.size(); ++k) EXPECT_LE(e.top[k].logprob, e.top[k - 1].logprob);
    if (e.rank <= 3) {
      EXPECT_EQ(e.top[static_cast<size_t>(e.rank) - 1].token, e.token);
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    const PromptLogprob& e = s.prompt_logprobs[base.size() + i];
    EXPECT_EQ(e.token, g.tokens[i]);
    EXPECT_EQ(e.logprob, g.logprobs[i].logprob) << i;
    EXPECT_EQ(e.rank, 1) << i;
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(e.top[k].token, g.logprobs[i].top[k].token) << i;
      EXPECT_EQ(e.top[k].logprob, g.logprobs[i].top[k].logprob) << i;
    }
  }
  ASSERT_EQ(s.tokens.size(), 1u);
  EXPECT_EQ(s.tokens[0], g.tokens[3]);
  EXPECT_EQ(s.logprobs[0].logprob, g.logprobs[3].logprob);
  // The random prompt tokens are not the model's favourites: ranks past the top list occur.
  int past_top = 0;
  for (size_t p = 1; p < base.size(); ++p) past_top += s.prompt_logprobs[p].rank > 3;
  EXPECT_GT(past_top, 0);
}

// A prompt prefilled in chunks of 7 tokens, across several steps, scores every position with
// the values one whole prefill gives; and so does one preempted and recomputed (tight KV).
TEST_P(PromptLogprobsTest, ChunkedAndPreemptedPrefillsScoreEveryPositionAlike) {
  const std::vector<TokenId> long_prompt = prompt(7, 61);
  const GenerationResult whole = run(options(), {request("p", long_prompt, 3, 2)})["p"];
  ASSERT_EQ(whole.prompt_logprobs.size(), 61u);
  EngineOptions chunked = options();
  chunked.scheduler.max_batch_tokens = 7;
  Engine engine(dir_->path(), chunked);
  const GenerationResult c = testing::run_requests(engine, {request("p", long_prompt, 3, 2)})["p"];
  EXPECT_GE(engine.stats().steps, 9);  // 61 prompt tokens 7 at a time
  expect_same(c.prompt_logprobs, whole.prompt_logprobs, "chunked");
  EXPECT_EQ(c.tokens, whole.tokens);

  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i)
    reqs.push_back(request("r" + std::to_string(i), prompt(40 + i, 40), 30, 1));
  const auto roomy = run(options(), reqs);
  EngineOptions tight = options();
  tight.kv_memory_gb = static_cast<double>(16) * 16 * 2 * 2 * 32 * 2 / 1e9;  // 16 bf16 pages
  tight.scheduler.initial_output_estimate = 1;
  tight.scheduler.exact_known_lengths = false;
  Engine small(dir_->path(), tight);
  const auto got = testing::run_requests(small, reqs);
  EXPECT_GT(small.stats().preemptions, 0);
  for (const auto& [id, r] : roomy) expect_same(got.at(id).prompt_logprobs, r.prompt_logprobs, id);
}

// In deterministic mode a request's prompt logprobs do not depend on what shares its steps:
// alone, or among others of every length (some scoring their prompts too), in either order.
TEST_P(PromptLogprobsTest, DeterministicPromptLogprobsDoNotDependOnTheBatch) {
  const GenerationRequest probe = request("probe", prompt(9, 45), 4, 5);
  const GenerationResult alone = run(options(), {probe})["probe"];
  std::vector<GenerationRequest> crowd = {probe};
  for (int i = 0; i < 24; ++i)
    crowd.push_back(request("o" + std::to_string(i), prompt(200 + i, 3 + (i * 11) % 70), 2 + i % 5,
                            i % 3 ? std::nullopt : std::optional<int32_t>(i % 4)));
  expect_same(run(options(), crowd)["probe"].prompt_logprobs, alone.prompt_logprobs, "crowd");
  std::reverse(crowd.begin(), crowd.end());
  EngineOptions o = options();
  o.scheduler.max_batch_tokens = 29;
  expect_same(run(o, crowd)["probe"].prompt_logprobs, alone.prompt_logprobs, "reversed, chunked");
}

// A scored request takes no cached prefix (those rows were never computed for it): after the
// same prompt was served and cached, it computes and scores every position again.
TEST_P(PromptLogprobsTest, APromptScoredAfterTheSamePromptWasCachedIsScoredWhole) {
  const std::vector<TokenId> p = prompt(13, 50);
  const GenerationResult fresh = run(options(), {request("s", p, 2, 1)})["s"];
  Engine engine(dir_->path(), options());
  const GenerationResult first = testing::run_requests(engine, {request("a", p, 2, {})})["a"];
  const GenerationResult again = testing::run_requests(engine, {request("a2", p, 2, {})})["a2"];
  EXPECT_GT(again.cached_tokens, 0);  // the cache holds the prompt
  const GenerationResult s = testing::run_requests(engine, {request("s", p, 2, 1)})["s"];
  EXPECT_EQ(s.cached_tokens, 0);
  expect_same(s.prompt_logprobs, fresh.prompt_logprobs, "after the cache held the prompt");
  EXPECT_EQ(s.tokens, first.tokens);
}

TEST_P(PromptLogprobsTest, BadValuesAndBackendsWithoutEveryRowAreRefusedByName) {
  Engine engine(dir_->path(), options());
  auto refusal = [&](Engine& e, GenerationRequest r) {
    try {
      e.check_request(r);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal(engine, request("ok", prompt(1, 5), 2, 20)), "");
  EXPECT_NE(refusal(engine, request("big", prompt(1, 5), 2, 21)).find("prompt_logprobs"),
            std::string::npos);
  EXPECT_NE(refusal(engine, request("neg", prompt(1, 5), 2, -1)).find("prompt_logprobs"),
            std::string::npos);
  EXPECT_NE(refusal(engine, request("none", prompt(1, 5), 0, 1)).find("prompt_logprobs"),
            std::string::npos);
  // The simulator (as the cuda backend) keeps only the sampled rows' logits.
  Engine sim(
      std::make_unique<SimBackend>(
          *find_model_preset("tiny"), SimBackendOptions{.num_pages = 64, .kv_bytes_per_page = 4096},
          [](const ForwardBatch&, bool) { return SimStepTime{.total = 1e-3}; }),
      options());
  const std::string message = refusal(sim, request("sim", {1, 2, 3}, 2, 1));
  EXPECT_NE(message.find("'prompt_logprobs' is not supported on the sim backend"),
            std::string::npos)
      << message;
  EXPECT_EQ(refusal(sim, request("plain", {1, 2, 3}, 2, std::nullopt)), "");
}

INSTANTIATE_TEST_SUITE_P(Steps, PromptLogprobsTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "Overlapped" : "Plain";
                         });

}  // namespace
}  // namespace blend
