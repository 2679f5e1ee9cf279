// POST /v1/responses through `blend serve` (in process, the tiny random model): the answer is the
// chat route's for the same conversation, the stream sends OpenAI's events in order, tools and
// text.format json_schema work through the chat path, refusals and the body limits are the
// chat route's, and the official openai npm client (responses.create and responses.stream)
// reads it all.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "model/presets.h"
#include "model/random_init.h"
#include "server/server.h"
#include "test_models.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

class ResponsesServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::write_tiny_model(*dir_ / "tiny", 5);
  }
  static void TearDownTestSuite() { delete dir_; }

  // As ServerTest's (server_test.cc); `tools`: Qwen2.5's chat template, which renders tools.
  static std::unique_ptr<Server> start(bool tools = false, const std::string& api_key = "") {
    ServerOptions o;
    o.model = *dir_ / "tiny";
    o.port = 0;
    o.data_dir = *dir_ / "data";
    o.max_body_bytes = 1 << 20;
    o.engine.threads = 2;
    o.engine.kv_memory_gb = 0.05;
    o.engine.deterministic = true;
    o.api_key = api_key;
    if (tools)
      o.chat_template =
          std::string(BLEND_SOURCE_DIR) + "/tests/text/data/chat_templates/qwen2.5-instruct.jinja";
    auto server = std::make_unique<Server>(o);
    server->start();
    return server;
  }

  static json post(const Server& server, const std::string& path, const std::string& body,
                   int* status, std::string* raw = nullptr) {
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), body, "application/json");
    *status = r ? r->status : -1;
    if (!r) return nullptr;
    if (raw) *raw = r->body;
    return json::parse(r->body, nullptr, false);
  }

  // The events of an SSE body: each "event: T" line followed by its "data:" line, whose type is T.
  static std::vector<json> events(const std::string& body) {
    std::vector<json> out;
    std::istringstream in(body);
    std::string line, type;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (line.rfind("event: ", 0) == 0) {
        EXPECT_TRUE(type.empty()) << "two event lines: " << line;
        type = line.substr(7);
        continue;
      }
      EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
      json data = json::parse(line.substr(6));
      EXPECT_EQ(data["type"], type) << line;
      type.clear();
      out.push_back(std::move(data));
    }
    return out;
  }

  // The value of a /metrics sample line that starts with `prefix` (-1 when absent).
  static double metric(const Server& server, const std::string& prefix) {
    httplib::Client c("127.0.0.1", server.port());
    auto r = c.Get("/metrics");
    if (!r) return -1;
    std::istringstream in(r->body);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(prefix + " ", 0) == 0) return std::stod(line.substr(prefix.size() + 1));
    return -1;
  }

  static bool poll(const std::function<bool()>& done, double seconds = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  }

  // Sends `body` to /v1/responses on a raw connection, reads until `wait_for` arrives (nothing
  // when empty: waits 300 ms instead) and hangs up.
  static void send_and_hang_up(int port, const std::string& body, const std::string& wait_for) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string request =
        "POST /v1/responses HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
    std::string got;
    char buf[4096];
    while (!wait_for.empty() && got.find(wait_for) == std::string::npos) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0) << "the answer ended before " << wait_for;
      got.append(buf, static_cast<size_t>(n));
    }
    if (wait_for.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::close(fd);
  }

  static testing::TempDir* dir_;
};

testing::TempDir* ResponsesServer::dir_ = nullptr;

const std::string kAsk =
    R"("instructions": "Be brief", "input": "Say something", "temperature": 0,
       "ignore_eos": true)";

TEST_F(ResponsesServer, AnswersAsTheChatRouteDoesForTheSameConversation) {
  auto server = start();
  int status = 0;
  const json chat = post(*server, "/v1/chat/completions", R"({"messages": [
      {"role": "system", "content": "Be brief"}, {"role": "user", "content": "Say something"}],
      "max_tokens": 8, "temperature": 0, "ignore_eos": true})",
                         &status);
  ASSERT_EQ(status, 200) << chat;
  const json r =
      post(*server, "/v1/responses", "{" + kAsk + R"(, "max_output_tokens": 8})", &status);
  ASSERT_EQ(status, 200) << r;
  EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_GT(r["created_at"].get<int64_t>(), 0);
  // Cut by max_output_tokens (ignore_eos): incomplete, with the reason.
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(r["output"].size(), 1u) << r;
  EXPECT_EQ(r["output"][0]["type"], "message");
  EXPECT_EQ(r["output"][0]["content"][0]["type"], "output_text");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], chat["choices"][0]["message"]["content"]);
  EXPECT_EQ(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(r["usage"]["output_tokens"], 8);
  EXPECT_EQ(r["usage"]["total_tokens"], chat["usage"]["total_tokens"]);
}

TEST_F(ResponsesServer, AStreamSendsOpenAisEventsInOrder) {
  auto server = start();
  int status = 0;
  const json whole =
      post(*server, "/v1/responses", "{" + kAsk + R"(, "max_output_tokens": 12})", &status);
  ASSERT_EQ(status, 200) << whole;
  std::string raw;
  post(*server, "/v1/responses", "{" + kAsk + R"(, "max_output_tokens": 12, "stream": true})",
       &status, &raw);
  ASSERT_EQ(status, 200) << raw;
  const std::vector<json> e = events(raw);
  ASSERT_GE(e.size(), 9u) << raw;
  std::vector<std::string> types;
  std::string text;
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i]["sequence_number"], i);
    const std::string type = e[i]["type"];
    if (type == "response.output_text.delta") {
      text += e[i]["delta"].get<std::string>();
      if (types.back() == type) continue;  // one entry for the run of deltas
    }
    types.push_back(type);
  }
  EXPECT_EQ(types, (std::vector<std::string>{
                       "response.created", "response.in_progress", "response.output_item.added",
                       "response.content_part.added", "response.output_text.delta",
                       "response.output_text.done", "response.content_part.done",
                       "response.output_item.done", "response.completed"}))
      << raw;
  const std::string expected = whole["output"][0]["content"][0]["text"];
  EXPECT_EQ(text, expected);
  const json& done = e.back()["response"];
  EXPECT_EQ(done["status"], "incomplete");
  EXPECT_EQ(done["output"][0]["content"][0]["text"], expected);
  EXPECT_EQ(done["usage"]["output_tokens"], 12);
  EXPECT_EQ(done["id"], e[0]["response"]["id"]);
}

const std::string kTools = R"("tools": [{"type": "function", "name": "lookup",
    "parameters": {"type": "object", "properties": {"found": {"type": "boolean"},
                   "kind": {"enum": ["a", "b"]}}, "required": ["found", "kind"],
                   "additionalProperties": false}}])";

TEST_F(ResponsesServer, ToolCallsTheirResultsAndJsonSchemaGoThroughTheChatPath) {
  auto server = start(/*tools=*/true);
  int status = 0;
  const std::string ask = R"("input": "Look it up", "max_output_tokens": 400, "seed": 1)";
  const json first =
      post(*server, "/v1/responses", "{" + ask + ", " + kTools + R"(, "tool_choice": "required",
                          "parallel_tool_calls": false})",
           &status);
  ASSERT_EQ(status, 200) << first;
  ASSERT_EQ(first["output"].size(), 1u) << first;
  const json& call = first["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "lookup");
  EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_", 0), 0u);
  const json args = json::parse(call["arguments"].get<std::string>());
  EXPECT_TRUE(args["found"].is_boolean()) << args;
  EXPECT_TRUE(args["kind"] == "a" || args["kind"] == "b") << args;

  // Streamed: the same call as one function_call item.
  std::string raw;
  post(*server, "/v1/responses",
       "{" + ask + ", " + kTools + R"(, "tool_choice": "required", "parallel_tool_calls": false,
       "stream": true})",
       &status, &raw);
  ASSERT_EQ(status, 200) << raw;
  const json streamed = events(raw).back()["response"];
  ASSERT_EQ(streamed["output"].size(), 1u) << raw;
  EXPECT_EQ(streamed["output"][0]["arguments"], call["arguments"]);

  // The round trip: the call and its output go back as input items.
  const json next =
      post(*server, "/v1/responses",
           R"({"max_output_tokens": 4, "input": [
                             {"role": "user", "content": "Look it up"}, )" +
               call.dump() + R"(, {"type": "function_call_output", "call_id": )" +
               call["call_id"].dump() + R"(, "output": "{\"n\": 3}"}], )" + kTools + "}",
           &status);
  ASSERT_EQ(status, 200) << next;
  EXPECT_GT(next["usage"]["input_tokens"].get<int64_t>(),
            first["usage"]["input_tokens"].get<int64_t>() +
                first["usage"]["output_tokens"].get<int64_t>());

  // text.format json_schema: the text is JSON of the schema.
  const json structured = post(*server, "/v1/responses", "{" + ask + R"(, "text": {"format": {
      "type": "json_schema", "name": "thing", "strict": true, "schema": {"type": "object",
      "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["x", "y"]}},
      "required": ["ok", "kind"], "additionalProperties": false}}}})",
                               &status);
  ASSERT_EQ(status, 200) << structured;
  EXPECT_EQ(structured["status"], "completed") << structured;
  const json value = json::parse(structured["output"][0]["content"][0]["text"].get<std::string>());
  EXPECT_TRUE(value["ok"].is_boolean()) << value;
  EXPECT_TRUE(value["kind"] == "x" || value["kind"] == "y") << value;
}

TEST_F(ResponsesServer, RefusalsNotFoundAndTheBodyLimitsAreTheChatRoutes) {
  auto server = start();
  const auto refused = [&](const std::string& body, int want, const std::string& param) {
    int status = 0;
    const json r = post(*server, "/v1/responses", body, &status);
    EXPECT_EQ(status, want) << body << ": " << r;
    EXPECT_EQ(r["error"]["param"], param) << body << ": " << r;
    EXPECT_TRUE(r["error"]["message"].is_string()) << r;
  };
  refused(R"({"input": "Hi", "previous_response_id": "resp_1"})", 400, "previous_response_id");
  refused(R"({"input": "Hi", "tools": [{"type": "web_search_preview"}]})", 400, "tools[0].type");
  refused(R"({"input": "Hi", "store": true})", 400, "store");
  refused(R"({"input": "Hi", "model": "nope"})", 404, "model");
  refused(R"({"input": "Hi", "max_output_tokens": 100000000})", 400, "max_output_tokens");
  // A prompt past the context: refused before tokenizing, as chat's (param "input").
  refused(R"({"input": ")" + std::string(900000, 'a') + R"("})", 400, "input");
  refused("{\"input\": ", 400, "input");  // not JSON: where it breaks
  // Over --max-body-bytes: 413 from the same body reader as every POST route.
  int status = 0;
  post(*server, "/v1/responses", R"({"input": ")" + std::string((1 << 20) + 10, 'a') + R"("})",
       &status);
  EXPECT_EQ(status, 413);
  // Nothing is stored: retrieval and cancel say so.
  httplib::Client c("127.0.0.1", server->port());
  auto got = c.Get("/v1/responses/resp_abc");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 404);
  EXPECT_NE(got->body.find("does not store responses"), std::string::npos) << got->body;
  auto cancelled = c.Post("/v1/responses/resp_abc/cancel", "", "application/json");
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(cancelled->status, 404);
  // And the server carries on.
  const json ok =
      post(*server, "/v1/responses", R"({"input": "Hi", "max_output_tokens": 2})", &status);
  EXPECT_EQ(status, 200) << ok;
}

// A client that leaves, mid-stream or before the whole answer, stops its generation and frees
// its KV, as on the chat route.
TEST_F(ResponsesServer, AClientThatHangsUpStopsItsGeneration) {
  auto server = start();
  const std::string is_running = "blend:num_requests_running{class=\"rt\"}";
  const std::string long_answer =
      R"({"input": "a long story", "max_output_tokens": 8000, "ignore_eos": true)";
  send_and_hang_up(server->port(), long_answer + R"(, "stream": true})",
                   "response.output_text.delta");
  EXPECT_TRUE(poll([&] {
    return metric(*server, "blend:request_cancelled_total{class=\"rt\"}") == 1 &&
           metric(*server, is_running) == 0;
  }));
  send_and_hang_up(server->port(), long_answer + "}", "");
  EXPECT_TRUE(poll([&] {
    return metric(*server, "blend:request_cancelled_total{class=\"rt\"}") == 2 &&
           metric(*server, is_running) == 0;
  }));
  EXPECT_TRUE(poll([&] { return metric(*server, "blend:kv_cache_used_bytes") == 0; }));
  EXPECT_EQ(metric(*server, "blend:request_success_total{class=\"rt\",finished_reason=\"length\"}"),
            -1);
}

// The official OpenAI Node client (setup.sh installs it): responses.create, responses.stream,
// stream: true, a function call round trip, json_schema and a refusal.
TEST_F(ResponsesServer, TheOfficialNodeClientReadsIt) {
  const std::string modules = BLEND_TEST_NODE_MODULES;
  if (!std::filesystem::exists(std::filesystem::path(modules) / "openai" / "package.json"))
    GTEST_SKIP() << "the openai npm package is not installed (run scripts/setup.sh)";
  if (testing::run_command("node --version").exit_code != 0) GTEST_SKIP() << "node is missing";
  auto server = start(/*tools=*/true, "k");
  const auto r = testing::run_command("NODE_PATH='" + modules + "' node '" + BLEND_SOURCE_DIR +
                                      "/tests/server/openai_responses.cjs' http://127.0.0.1:" +
                                      std::to_string(server->port()) + "/v1 k 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("openai responses: ok"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace blend
