// The load generator of `blend bench serve`: its metric definitions on hand-made records, the
// loopback-only rule, and a short run against an in-process server over a tiny model with the
// hybrid and fcfs policies.
#include "harness/load_generator.h"

#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "server/server.h"
#include "test_util.h"

namespace blend::online {
namespace {

RtRecord record(double ttft, double e2e, int64_t tokens) {
  RtRecord r;
  r.ttft = ttft;
  r.e2e = e2e;
  r.output_tokens = tokens;
  r.finished = true;
  return r;
}

TEST(LoadMetrics, PercentileIsNearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(percentile(v, 0.5), 50);
  EXPECT_EQ(percentile(v, 0.99), 99);
  EXPECT_EQ(percentile(v, 1.0), 100);
  EXPECT_EQ(percentile(v, 0.0), 1);
  EXPECT_EQ(percentile({}, 0.5), 0);
  EXPECT_EQ(percentile({7}, 0.99), 7);
}

TEST(LoadMetrics, SummaryOfHandMadeRecords) {
  RtRecord failed;
  failed.error = "unfinished";
  const std::vector<RtRecord> records = {
      record(0.1, 1.1, 11),  // TPOT 0.1, normalized 0.1: meets both
      record(0.5, 2.5, 5),   // TTFT 0.5 > 0.4, TPOT 0.5 > 0.2, normalized 0.5
      record(0.3, 0.3, 1),   // one token: TPOT 0, normalized 0.3
      failed,                // counts as a miss of both targets
  };
  EXPECT_DOUBLE_EQ(tpot_of(records[0]), 0.1);
  EXPECT_DOUBLE_EQ(tpot_of(records[1]), 0.5);
  EXPECT_DOUBLE_EQ(tpot_of(records[2]), 0);
  const RtSummary s = summarize(records, 0.4, 0.2);
  EXPECT_EQ(s.rt_requests, 4);
  EXPECT_EQ(s.rt_failed, 1);
  EXPECT_DOUBLE_EQ(s.ttft_attainment, 0.5);
  EXPECT_DOUBLE_EQ(s.tpot_attainment, 0.5);
  EXPECT_NEAR(s.rt_normalized_latency_s, (0.1 + 0.5 + 0.3) / 3, 1e-12);
  EXPECT_DOUBLE_EQ(s.ttft_p50, 0.3);
  EXPECT_DOUBLE_EQ(s.ttft_p99, 0.5);
  EXPECT_DOUBLE_EQ(s.tpot_p50, 0.1);
  EXPECT_DOUBLE_EQ(s.tpot_p99, 0.5);
  EXPECT_DOUBLE_EQ(s.ttft_p95, 0.5);
  EXPECT_DOUBLE_EQ(s.e2e_p50, 1.1);  // finished e2e 0.3, 1.1, 2.5: nearest rank
  EXPECT_DOUBLE_EQ(s.e2e_p95, 2.5);
  EXPECT_EQ(s.output_tokens, 11 + 5 + 1);  // the failed request's tokens are not counted

  const RtSummary none = summarize({}, 0.4, 0.2);
  EXPECT_EQ(none.rt_requests, 0);
  EXPECT_EQ(none.ttft_attainment, 0);
  EXPECT_EQ(none.rt_normalized_latency_s, 0);
}

TEST(LoadTarget, OnlyLoopbackHosts) {
  for (const char* ok : {"127.0.0.1", "127.3.2.1", "localhost", "::1", "[::1]"})
    EXPECT_NO_THROW(check_loopback(ok)) << ok;
  for (const char* bad : {"10.0.0.1", "0.0.0.0", "192.168.1.2", "example.com", "::", ""})
    EXPECT_THROW(check_loopback(bad), Error) << bad;

  EXPECT_EQ(parse_url("http://127.0.0.1:8123"), std::make_pair(std::string("127.0.0.1"), 8123));
  EXPECT_EQ(parse_url("http://localhost/"), std::make_pair(std::string("localhost"), 80));
  EXPECT_EQ(parse_url("http://[::1]:9000"), std::make_pair(std::string("::1"), 9000));
  for (const char* bad : {"https://127.0.0.1:1", "127.0.0.1:80", "http://127.0.0.1:0",
                          "http://127.0.0.1:99999", "http://127.0.0.1:80/v1", "http://:80"})
    EXPECT_THROW(parse_url(bad), Error) << bad;

  // run_load refuses before it connects anywhere.
  LoadOptions o;
  o.host = "192.0.2.1";
  o.rt_lengths = {{8, 4}};
  try {
    run_load(o);
    FAIL() << "a non-loopback host was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loopback"), std::string::npos) << e.what();
  }
}

TEST(LoadTarget, BadOptions) {
  LoadOptions o;
  o.rt_lengths = {{8, 4}};
  o.rt_rate = -1;
  EXPECT_THROW(run_load(o), Error);
  o.rt_rate = 1;
  o.duration_seconds = 0;
  EXPECT_THROW(run_load(o), Error);
  o.duration_seconds = 1;
  o.rt_lengths.clear();
  EXPECT_THROW(run_load(o), Error);
  // Nobody listens on this port: a clear error, not a hang.
  o.rt_lengths = {{8, 4}};
  o.port = 1;
  EXPECT_THROW(run_load(o), Error);
  // A port for a model the run does not ask for, and a negative popularity exponent.
  o.models = {"a", "b"};
  o.model_ports = {{"c", 8001}};
  EXPECT_THROW(run_load(o), Error);
  o.model_ports.clear();
  o.zipf = -1;
  EXPECT_THROW(run_load(o), Error);
}

TEST(LoadGenerator, RunsAgainstAnInProcessServerWithHybridAndFcfs) {
  testing::TempDir dir;
  RandomInitOptions init;
  init.seed = 5;
  init.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  write_random_model(*find_model_preset("tiny"), dir / "tiny", init);

  for (const SchedulerPolicy policy : {SchedulerPolicy::kHybrid, SchedulerPolicy::kFcfs}) {
    const bool hybrid = policy == SchedulerPolicy::kHybrid;
    SCOPED_TRACE(hybrid ? "hybrid" : "fcfs");
    ServerOptions so;
    so.model = dir / "tiny";
    so.port = 0;
    so.data_dir = dir / (hybrid ? "data-hybrid" : "data-fcfs");
    so.engine.threads = 2;
    so.engine.kv_memory_gb = 0.05;
    so.engine.scheduler.policy = policy;
    so.engine.scheduler.bidirectional_kv = hybrid;
    Server server(so);
    server.start();

    LoadOptions o;
    o.port = server.port();
    o.duration_seconds = 2;
    o.rt_rate = 5;
    o.rt_lengths = {{40, 8}, {80, 16}, {20, 6}};
    o.be_batch_requests = 4;
    o.be_output_min = 8;  // short BE outputs: the first job finishes early even on a busy machine
    o.be_output_max = 16;
    o.length_scale = 0.5;  // BE prompts 256-512 tokens, outputs 4-8
    o.ttft_slo = 0.05;     // tight enough that some requests may miss it
    o.tpot_slo = 0.05;
    o.drain_timeout_seconds = 20;
    o.seed = 3;
    const LoadReport r = run_load(o);
    server.stop();

    ASSERT_GT(r.rt.rt_requests, 0);
    EXPECT_EQ(r.rt.rt_failed, 0);
    int64_t ttft_ok = 0, tpot_ok = 0;
    std::set<int64_t> lengths;
    for (const RtRecord& rec : r.records) {
      ASSERT_TRUE(rec.finished) << rec.error;
      EXPECT_GT(rec.ttft, 0);
      EXPECT_LE(rec.ttft, rec.e2e);
      EXPECT_GE(rec.arrival, 0);
      EXPECT_LT(rec.arrival, o.duration_seconds + 0.5);
      lengths.insert(rec.output_tokens);  // ignore_eos: exactly the requested (scaled) lengths
      ttft_ok += rec.ttft <= o.ttft_slo ? 1 : 0;
      tpot_ok += tpot_of(rec) <= o.tpot_slo ? 1 : 0;
    }
    for (int64_t n : lengths) EXPECT_TRUE(n == 4 || n == 8 || n == 3) << n;  // halved
    const double n = static_cast<double>(r.records.size());
    EXPECT_DOUBLE_EQ(r.rt.ttft_attainment, static_cast<double>(ttft_ok) / n);
    EXPECT_DOUBLE_EQ(r.rt.tpot_attainment, static_cast<double>(tpot_ok) / n);
    for (double a : {r.rt.ttft_attainment, r.rt.tpot_attainment}) {
      EXPECT_GE(a, 0);
      EXPECT_LE(a, 1);
    }
    EXPECT_LE(r.rt.ttft_p50, r.rt.ttft_p99);
    EXPECT_GT(r.rt.rt_normalized_latency_s, 0);

    EXPECT_GE(r.be_jobs, 1);
    EXPECT_GT(r.be_requests, 0);
    EXPECT_GE(r.be_tokens, r.be_requests * (256 + 4));  // each has >= 256 + 4 tokens
    EXPECT_GT(r.be_throughput_tokens_per_s, 0);

    // The scheduler's time comes from the server's /metrics counters.
    EXPECT_GT(r.steps, 0);
    EXPECT_GT(r.step_seconds, 0);
    EXPECT_GT(r.scheduler_seconds, 0);
    EXPECT_GT(r.scheduler_fraction, 0);
    EXPECT_LT(r.scheduler_fraction, 1);

    const nlohmann::json j = to_json(hybrid ? "hybrid" : "fcfs", o, r);
    for (const char* key :
         {"policy", "rt_normalized_latency_s", "ttft_attainment", "tpot_attainment",
          "be_throughput_tokens_per_s", "be_requests_per_s", "ttft_p50_s", "ttft_p99_s",
          "tpot_p50_s", "tpot_p99_s", "scheduler_fraction", "rt_requests", "rt_failed"})
      EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j["policy"], hybrid ? "hybrid" : "fcfs");
    EXPECT_EQ(j["rt_requests"], r.rt.rt_requests);
  }
}

// Several models (BlockLLM's tenants) on two servers: each request asks for one of the models
// and goes to the server its port names; a request sent to the wrong server would fail (404).
TEST(LoadGenerator, SpreadsRequestsOverModelsAndTheirServers) {
  testing::TempDir dir;
  RandomInitOptions init;
  init.seed = 5;
  init.tokenizer_dir = BLEND_TEST_TOKENIZER_DIR;
  for (const char* name : {"a", "b"})
    write_random_model(*find_model_preset("tiny"), dir / name, init);
  auto make = [&](const char* name) {
    ServerOptions so;
    so.model = dir / name;
    so.port = 0;
    so.data_dir = dir / (std::string("data-") + name);
    so.engine.threads = 1;
    so.engine.kv_memory_gb = 0.05;
    return std::make_unique<Server>(so);
  };
  auto a = make("a"), b = make("b");
  a->start();
  b->start();

  LoadOptions o;
  o.port = a->port();
  o.models = {"a", "b"};
  o.zipf = 1;
  o.model_ports = {{"b", b->port()}};
  o.duration_seconds = 2;
  o.rt_rate = 10;
  o.rt_lengths = {{16, 4}, {24, 6}};
  o.be_batch_requests = 0;
  o.drain_timeout_seconds = 20;
  o.seed = 7;
  const LoadReport r = run_load(o);
  a->stop();
  b->stop();

  ASSERT_GT(r.rt.rt_requests, 0);
  EXPECT_EQ(r.rt.rt_failed, 0);
  for (const RtRecord& rec : r.records) EXPECT_TRUE(rec.finished) << rec.model << ": " << rec.error;
  ASSERT_EQ(r.by_model.size(), 2u);
  int64_t requests = 0, tokens = 0;
  for (const auto& [name, s] : r.by_model) {
    EXPECT_TRUE(name == "a" || name == "b") << name;
    EXPECT_GT(s.rt_requests, 0) << name;
    EXPECT_LE(s.e2e_p50, s.e2e_p95) << name;
    requests += s.rt_requests;
    tokens += s.output_tokens;
  }
  EXPECT_EQ(requests, r.rt.rt_requests);
  EXPECT_EQ(tokens, r.rt.output_tokens);
  EXPECT_GT(r.rt.e2e_p50, 0);
  EXPECT_NEAR(r.rt_output_tokens_per_s, static_cast<double>(tokens) / r.seconds, 1e-9);
  const nlohmann::json j = to_json("zoo", o, r);
  EXPECT_EQ(j["models"].size(), 2u);
  EXPECT_EQ(j["zipf"], 1.0);
}

}  // namespace
}  // namespace blend::online
