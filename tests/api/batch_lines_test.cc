#include "api/batch_file.h"

#include <filesystem>
#include <unordered_set>

#include <gtest/gtest.h>

#include "api/api_error.h"
#include "api/openai.h"
#include "core/error.h"

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

// A Batch API line answers one prompt (a list of several is refused by name, never cut to its
// first) and echoes it where asked, in its result as on the server.
TEST_F(BatchLinesTest, ALineTakesOnePromptAndEchoesItWhereAsked) {
  const BatchLineContext c = context();
  PreparedBatchLine p = prepare_batch_line(line(completion(R"({"prompt":["Hello","my dog"]})")), c);
  ASSERT_TRUE(p.error);
  EXPECT_EQ(p.error->param(), "prompt");
  p = prepare_batch_line(line(completion(R"({"prompt":"Hello","echo":true})")), c);
  ASSERT_FALSE(p.error) << p.error->what();
  GenerationResult r;
  r.prompt_tokens = 1;
  r.tokens = {11};
  r.text = ",";
  const json body = make_response(p.api, r, "cmpl-1", "tiny", 1, *tokenizer_);
  EXPECT_EQ(body["choices"][0]["text"], "Hello,");
}

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

// vLLM's output fields in a Batch API line go through the request parser as on the server:
// into the engine request, or an error line naming the field.
TEST_F(BatchLinesTest, VllmOutputFieldsReachTheEngineRequest) {
  const BatchLineContext c = context();
  const PreparedBatchLine p = prepare_batch_line(
      line(completion(R"({"prompt":"x","max_tokens":8,"min_tokens":3,"stop":["."],)"
                      R"("include_stop_str_in_output":true,"skip_special_tokens":false})")),
      c);
  ASSERT_FALSE(p.error) << p.error->what();
  EXPECT_EQ(p.generation.params.min_tokens, 3);
  EXPECT_TRUE(p.generation.params.include_stop_str_in_output);
  EXPECT_FALSE(p.generation.params.skip_special_tokens);
  const PreparedBatchLine bad =
      prepare_batch_line(line(completion(R"({"prompt":"x","max_tokens":2,"min_tokens":3})")), c);
  ASSERT_TRUE(bad.error);
  EXPECT_EQ(bad.error->status(), 400);
  EXPECT_EQ(bad.error->param(), "min_tokens");
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

// ---- Result files: exactly once, whatever bytes they hold (issue 54) ----

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// An invalid UTF-8 byte in an error message used to throw json type_error 316 out of the
// writer (and end `blend batch`); U+2028 / U+2029 / U+0085 were written raw, where Python's
// splitlines() and some JavaScript readers break a line.
TEST(BatchResultFiles, JsonlDumpNeverThrowsAndEscapesLineBreaks) {
  const json j = {{"bad",
                   "a\xff"
                   "b"},
                  {"breaks",
                   "1\u2028"
                   "2\u2029"
                   "3\u0085"
                   "4"},
                  {"e", "\u00e9"}};
  const std::string text = jsonl_dump(j);
  EXPECT_EQ(text, R"({"bad":"a)"
                  "\xef\xbf\xbd"
                  R"(b","breaks":"1\u20282\u20293\u00854","e":")"
                  "\xc3\xa9"
                  R"("})");
  const json back = json::parse(text);
  EXPECT_EQ(back["breaks"], j["breaks"]);
  EXPECT_EQ(back["e"], j["e"]);
}

// A line whose custom_id cannot be read is answered with custom_id null and its line number; it
// used to be "line-N", which a real custom_id "line-2" collided with (one of them was then
// never run, or its result taken for the other's).
TEST(BatchResultFiles, UnreadableLinesCannotCollideWithARealCustomIdAndCountAsDone) {
  testing::TempDir dir;
  testing::write_file(dir / "in.jsonl",
                      "{\"custom_id\":\"a\",\"url\":\"/v1/completions\",\"body\":{}}\n"
                      "not json \xff\n"
                      "{\"custom_id\":\"line-2\",\"url\":\"/v1/completions\",\"body\":{}}\n");
  const std::vector<BatchInputLine> lines = read_batch_input(dir / "in.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1].custom_id, unreadable_line_key(2));
  EXPECT_NE(lines[1].custom_id, lines[2].custom_id);
  ASSERT_TRUE(lines[1].error);
  EXPECT_EQ(unreadable_line_number(lines[1].custom_id), 2);
  EXPECT_EQ(unreadable_line_number("line-2"), std::nullopt);
  const auto out = dir / "out.jsonl";
  {
    BatchResultWriter w(out);
    w.write_error(lines[1].custom_id, 400, ApiError(400, *lines[1].error).body());
    w.write_success("line-2", {{"x", 1}});
  }
  const std::vector<std::string> text = lines_of(testing::read_file(out));
  ASSERT_EQ(text.size(), 2u);
  const json unreadable = json::parse(text[0]);
  EXPECT_TRUE(unreadable["custom_id"].is_null());
  EXPECT_EQ(unreadable["error"]["line"], 2);
  EXPECT_EQ(unreadable["error"]["code"], "invalid_line");
  EXPECT_EQ(unreadable["response"]["status_code"], 400);
  EXPECT_EQ(json::parse(text[1])["custom_id"], "line-2");
  BatchResultWriter again(out);
  EXPECT_EQ(again.done_ids(), (std::unordered_set<std::string>{unreadable_line_key(2), "line-2"}));
  EXPECT_EQ(again.set_aside(), 0);
}

// A corrupted line in the middle of an output (and a custom_id written twice by an older run)
// was left in place while its request ran again: the file then held a line no reader parses.
// Now such lines move to OUTPUT.set-aside, byte for byte, and the output keeps every good one.
TEST(BatchResultFiles, ACorruptOrRepeatedLineIsSetAsideAndTheGoodOnesKept) {
  testing::TempDir dir;
  const auto out = dir / "out.jsonl";
  {
    BatchResultWriter w(out);
    for (const char* id : {"a", "b", "c"}) w.write_success(id, {{"x", id}});
  }
  std::vector<std::string> text = lines_of(testing::read_file(out));
  ASSERT_EQ(text.size(), 3u);
  const std::string corrupt = text[1].substr(0, text[1].size() / 2) + "\xff garbage";
  testing::write_file(out, text[0] + "\n" + corrupt + "\n" + text[2] + "\n" + text[0] + "\n" +
                               "{\"no\":\"custom_id\"}\n");
  BatchResultWriter w(out);
  EXPECT_EQ(w.done_ids(), (std::unordered_set<std::string>{"a", "c"}));
  EXPECT_EQ(w.set_aside(), 3);
  EXPECT_EQ(testing::read_file(out), text[0] + "\n" + text[2] + "\n");
  EXPECT_EQ(testing::read_file(w.set_aside_path()),
            corrupt + "\n" + text[0] + "\n" + "{\"no\":\"custom_id\"}\n");
  w.write_success("b", {{"x", "b"}});
  const std::vector<std::string> now = lines_of(testing::read_file(out));
  ASSERT_EQ(now.size(), 3u);
  for (const std::string& l : now) EXPECT_TRUE(json::accept(l)) << l;
  EXPECT_FALSE(std::filesystem::exists(out.string() + ".tmp"));
}

// Two `blend batch` on one output (or two servers on one data dir) ran everything twice.
TEST(BatchResultFiles, AnExclusiveLockRefusesASecondOwnerUntilReleased) {
  testing::TempDir dir;
  const auto path = dir / "out.jsonl.lock";
  {
    const ExclusiveLock first(path, "the output file out.jsonl");
    try {
      const ExclusiveLock second(path, "the output file out.jsonl");
      ADD_FAILURE() << "a second lock was granted";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("another blend process is using the output file out.jsonl"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    }
  }
  EXPECT_NO_THROW(ExclusiveLock(path, "the output file out.jsonl"));  // released
}

}  // namespace
}  // namespace blend
