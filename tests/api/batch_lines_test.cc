#include "api/batch_file.h"

#include <gtest/gtest.h>

#include "llama3_text_fixture.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

class BatchLinesTest : public Llama3TextTest {
 protected:
  static BatchLineContext context() {
    BatchLineContext c;
    c.max_sequence_tokens = 64;
    c.models = {{.name = "tiny",
                 .chat_template = template_,
                 .tokenizer = tokenizer_,
                 .max_prompt_bytes = max_prompt_bytes(*tokenizer_, c.max_sequence_tokens)}};
    c.any_model_name = true;
    return c;
  }
  // Reads `text` as a one-line batch file, so the line goes through the same reader.
  static BatchInputLine line(const std::string& text) {
    testing::TempDir dir;
    testing::write_file(dir / "in.jsonl", text + "\n");
    auto lines = read_batch_input(dir / "in.jsonl");
    EXPECT_EQ(lines.size(), 1u);
    return lines.at(0);
  }
  static std::string completion(const std::string& body,
                                const std::string& url = "/v1/completions") {
    return R"({"custom_id":"r1","method":"POST","url":")" + url + R"(","body":)" + body + "}";
  }
};

TEST_F(BatchLinesTest, AGoodLineBecomesARequest) {
  BatchLineContext c = context();
  c.request_class = RequestClass::kRealtime;
  PreparedBatchLine p = prepare_batch_line(
      line(completion(R"({"model":"m","prompt":"Hello, my dog","max_tokens":3,"seed":7})")), c);
  ASSERT_FALSE(p.error) << p.error->what();
  EXPECT_EQ(p.custom_id, "r1");
  EXPECT_EQ(p.generation.id, "r1");
  EXPECT_EQ(p.generation.prompt, (std::vector<TokenId>{9906, 11, 856, 5679}));
  EXPECT_EQ(p.generation.params.max_tokens, 3);
  EXPECT_EQ(p.generation.params.seed, 7u);
  EXPECT_EQ(p.generation.request_class, RequestClass::kRealtime);
  EXPECT_EQ(p.api.endpoint, Endpoint::kCompletions);
  EXPECT_TRUE(p.api.prompt.empty());  // moved into the generation request
}

TEST_F(BatchLinesTest, EachCheckGivesAnErrorResultNamingTheField) {
  const auto error_of = [](const PreparedBatchLine& p) -> std::pair<int, std::string> {
    if (!p.error) return {0, "<no error>"};
    return {p.error->status(), p.error->param()};
  };
  BatchLineContext c = context();
  // A line that is not JSON, nests 100,000 deep, or holds 1e999: an error line, no throw.
  EXPECT_EQ(error_of(prepare_batch_line(line("{oops"), c)).first, 400);
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(R"({"prompt":)" + std::string(100000, '[') +
                                                        std::string(100000, ']') + "}")),
                                        c)),
            (std::pair<int, std::string>{400, ""}));
  EXPECT_EQ(
      error_of(prepare_batch_line(line(completion(R"({"prompt":"x","temperature":1e999})")), c)),
      (std::pair<int, std::string>{400, "body.temperature"}));
  EXPECT_EQ(error_of(prepare_batch_line(
                line(R"({"custom_id":"r1","method":"GET","url":"/v1/completions","body":{}})"), c)),
            (std::pair<int, std::string>{400, "method"}));
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(R"({"input":"x"})", "/v1/embeddings")), c)),
            (std::pair<int, std::string>{400, "url"}));
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(R"({"prompt":"x","stream":true})")), c)),
            (std::pair<int, std::string>{400, "stream"}));
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(R"({"prompt":"x","temperature":3})")), c)),
            (std::pair<int, std::string>{400, "temperature"}));
  // The context: 64 tokens here.
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(R"({"prompt":"x","max_tokens":64})")), c)),
            (std::pair<int, std::string>{400, "max_tokens"}));
  std::string long_prompt;
  for (int i = 0; i < 80; ++i) long_prompt += " dog";
  EXPECT_EQ(
      error_of(prepare_batch_line(line(completion(R"({"prompt":")" + long_prompt + R"("})")), c)),
      (std::pair<int, std::string>{400, "prompt"}));
  // Without max_tokens the engine clamps it: fine.
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(R"({"prompt":"x"})")), c)).first, 0);
  // n > 1: one line, n samples (the runner submits them); response_format needs the context's
  // grammar compiler.
  PreparedBatchLine two = prepare_batch_line(line(completion(R"({"prompt":"x","n":2})")), c);
  EXPECT_FALSE(two.error.has_value());
  EXPECT_EQ(two.api.n, 2);
  EXPECT_EQ(error_of(prepare_batch_line(
                line(completion(R"({"prompt":"x","response_format":{"type":"json_object"}})")), c)),
            (std::pair<int, std::string>{400, "response_format"}));

  // The batch's endpoint (OpenAI refuses lines whose url differs) and the served model.
  c.endpoint = Endpoint::kChatCompletions;
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(R"({"prompt":"x"})")), c)),
            (std::pair<int, std::string>{400, "url"}));
  c.endpoint.reset();
  c.any_model_name = false;
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(R"({"model":"big","prompt":"x"})")), c)),
            (std::pair<int, std::string>{404, "model"}));
  EXPECT_EQ(
      error_of(prepare_batch_line(line(completion(R"({"model":"tiny","prompt":"x"})")), c)).first,
      0);

  // Several served models: a line runs on the one it names, or the first when it names none.
  c.models.push_back({.name = "tuned",
                      .chat_template = nullptr,
                      .tokenizer = tokenizer_,
                      .max_prompt_bytes = c.models[0].max_prompt_bytes});
  PreparedBatchLine on_tuned =
      prepare_batch_line(line(completion(R"({"model":"tuned","prompt":"x"})")), c);
  EXPECT_FALSE(on_tuned.error.has_value());
  EXPECT_EQ(on_tuned.generation.model, 1);
  EXPECT_EQ(on_tuned.api.model_id, 1);
  EXPECT_EQ(prepare_batch_line(line(completion(R"({"prompt":"x"})")), c).generation.model, 0);
  // Each model's own chat template: "tuned" has none, so its chat lines fail.
  const std::string chat = R"({"model":"tuned","messages":[{"role":"user","content":"hi"}]})";
  EXPECT_EQ(error_of(prepare_batch_line(line(completion(chat, "/v1/chat/completions")), c)).first,
            400);
  EXPECT_EQ(error_of(prepare_batch_line(
                         line(completion(
                             R"({"model":"tiny","messages":[{"role":"user","content":"hi"}]})",
                             "/v1/chat/completions")),
                         c))
                .first,
            0);
}

}  // namespace
}  // namespace blend
