#include "harness/load_generator.h"

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend::online {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double since(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

// The /metrics counters the load generator reads.
struct MetricSnapshot {
  double be_finished = 0, be_prompt_tokens = 0, be_output_tokens = 0;
  double scheduler_seconds = 0, step_seconds = 0, steps = 0;
};

MetricSnapshot read_metrics(httplib::Client& c) {
  // A busy server may drop the idle keep-alive connection: two more tries.
  auto r = c.Get("/metrics");
  for (int i = 0; i < 2 && (!r || r->status != 200); ++i) r = c.Get("/metrics");
  if (!r || r->status != 200)
    throw Error("GET /metrics failed" +
                (r ? ": HTTP " + std::to_string(r->status) : ": " + httplib::to_string(r.error())));
  const std::vector<MetricSample> samples = parse_metrics(r->body);
  const std::string be = "class=\"be\"";
  MetricSnapshot m;
  m.be_finished = metric_sum(samples, "blend:request_success_total", be);
  m.be_prompt_tokens = metric_sum(samples, "blend:prompt_tokens_total", be);
  m.be_output_tokens = metric_sum(samples, "blend:generation_tokens_total", be);
  m.scheduler_seconds = metric_sum(samples, "blend:scheduler_seconds_total");
  m.step_seconds = metric_sum(samples, "blend:step_seconds_total");
  m.steps = metric_sum(samples, "blend:iterations_total");
  return m;
}

// A string field of a JSON object body ("" when absent or not JSON).
std::string field(const std::string& body, const char* key) {
  const json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}

int32_t scaled(int32_t n, double scale) {
  return std::max<int32_t>(1, static_cast<int32_t>(std::lround(static_cast<double>(n) * scale)));
}

json random_prompt(std::mt19937_64& rng, int32_t n, int32_t max_token_id) {
  std::uniform_int_distribution<int32_t> id(100, max_token_id - 1);
  json p = json::array();
  for (int32_t i = 0; i < n; ++i) p.push_back(id(rng));
  return p;
}

// One streamed RT request; fills `rec`. Gives up at `deadline`.
void run_rt_request(const LoadOptions& o, const std::string& body, int port,
                    Clock::time_point start, Clock::time_point deadline, RtRecord& rec) {
  rec.arrival = since(start, Clock::now());
  const StreamOutcome out = stream_completion(o.host, port, body, deadline);
  rec.finished = out.finished;
  rec.error = out.error;
  rec.e2e = out.e2e;
  rec.ttft = out.ttft;
  rec.output_tokens = out.output_tokens;
}

}  // namespace

std::vector<MetricSample> parse_metrics(const std::string& text) {
  std::vector<MetricSample> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const size_t brace = line.find('{');
    MetricSample m;
    m.name = line.substr(0, std::min(brace, space));
    if (brace < space) m.labels = line.substr(brace, line.find('}', brace) - brace + 1);
    try {
      m.value = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
      continue;
    }
    out.push_back(std::move(m));
  }
  return out;
}

double metric_sum(const std::vector<MetricSample>& samples, const std::string& name,
                  const std::string& label) {
  double sum = 0;
  for (const MetricSample& m : samples)
    if (m.name == name && (label.empty() || m.labels.find(label) != std::string::npos))
      sum += m.value;
  return sum;
}

std::string served_model(const std::string& host, int port, const std::string& model) {
  httplib::Client c(host, port);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(30, 0);
  auto r = c.Get("/v1/models");
  if (!r)
    throw Error("no server answers at " + host + ":" + std::to_string(port) + " (" +
                httplib::to_string(r.error()) + ")");
  if (r->status != 200)
    throw Error("GET /v1/models: HTTP " + std::to_string(r->status) + " " + r->body);
  if (!model.empty()) return model;
  const json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    throw Error("GET /v1/models lists no model");
  if (j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string())
    return j["data"][0]["id"].get<std::string>();
  throw Error("GET /v1/models lists no model id");
}

StreamOutcome stream_completion(const std::string& host, int port, const std::string& body,
                                Clock::time_point deadline, int32_t hang_up_after_events) {
  StreamOutcome out;
  httplib::Client c(host, port);
  c.set_connection_timeout(5, 0);
  const double left = std::max(1.0, since(Clock::now(), deadline));
  c.set_read_timeout(static_cast<time_t>(left), static_cast<time_t>(std::fmod(left, 1.0) * 1e6));
  const Clock::time_point sent = Clock::now();
  double first = -1, end = -1;
  int64_t tokens = -1;
  int32_t events = 0;
  bool done = false, hang_up = false;
  std::string buffer, error;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const Clock::time_point now = Clock::now();
    buffer.append(data, n);
    for (size_t cut; (cut = buffer.find("\n\n")) != std::string::npos;) {
      const std::string event = buffer.substr(0, cut);
      buffer.erase(0, cut + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      ++events;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json j = json::parse(payload, nullptr, false);
      if (!j.is_object()) {
        error = "unparsable SSE event: " + payload.substr(0, 200);
        continue;
      }
      if (j.contains("error")) {
        error = "server error: " + j["error"].dump();
        continue;
      }
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        const json& choice = j["choices"][0];
        if (first < 0 && choice.contains("text") && choice["text"].is_string() &&
            !choice["text"].get_ref<const std::string&>().empty())
          first = since(sent, now);
        if (choice.contains("finish_reason") && !choice["finish_reason"].is_null())
          end = since(sent, now);
      }
      if (j.contains("usage") && j["usage"].is_object())
        tokens = j["usage"].value("completion_tokens", int64_t{-1});
    }
    if (hang_up_after_events > 0 && events >= hang_up_after_events && !done) {
      hang_up = true;
      return false;  // httplib closes the connection
    }
    return now < deadline;
  };
  auto result = c.send(req);
  if (hang_up && !done) {
    out.hung_up = true;
  } else if (!result) {
    out.error = Clock::now() >= deadline ? "unfinished at the drain deadline"
                                         : "HTTP: " + httplib::to_string(result.error());
  } else if (result->status != 200) {
    out.error = "HTTP " + std::to_string(result->status) + ": " + buffer + result->body;
  } else if (!error.empty()) {
    out.error = error;
  } else if (!done || end < 0 || tokens < 0) {
    out.error = "the stream ended without a finish reason, usage and [DONE]";
  } else {
    out.finished = true;
    out.e2e = end;
    out.ttft = first < 0 ? end : first;  // no text at all: the first token came with the end
    out.output_tokens = tokens;
  }
  return out;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(q * static_cast<double>(v.size()));
  const auto k = static_cast<size_t>(std::max(1.0, rank)) - 1;
  return v[std::min(k, v.size() - 1)];
}

double tpot_of(const RtRecord& r) {
  return r.output_tokens > 1 ? (r.e2e - r.ttft) / static_cast<double>(r.output_tokens - 1) : 0;
}

RtSummary summarize(const std::vector<RtRecord>& records, double ttft_slo, double tpot_slo) {
  RtSummary s;
  s.rt_requests = static_cast<int64_t>(records.size());
  std::vector<double> ttft, tpot, e2e;
  double normalized = 0;
  int64_t ttft_ok = 0, tpot_ok = 0;
  for (const RtRecord& r : records) {
    if (!r.finished) {
      ++s.rt_failed;
      continue;
    }
    ttft.push_back(r.ttft);
    tpot.push_back(tpot_of(r));
    e2e.push_back(r.e2e);
    s.output_tokens += r.output_tokens;
    ttft_ok += r.ttft <= ttft_slo ? 1 : 0;
    tpot_ok += tpot.back() <= tpot_slo ? 1 : 0;
    normalized += r.e2e / static_cast<double>(std::max<int64_t>(1, r.output_tokens));
  }
  if (!records.empty()) {
    s.ttft_attainment = static_cast<double>(ttft_ok) / static_cast<double>(records.size());
    s.tpot_attainment = static_cast<double>(tpot_ok) / static_cast<double>(records.size());
  }
  if (!ttft.empty()) s.rt_normalized_latency_s = normalized / static_cast<double>(ttft.size());
  s.ttft_p50 = percentile(ttft, 0.5);
  s.ttft_p99 = percentile(ttft, 0.99);
  s.tpot_p50 = percentile(tpot, 0.5);
  s.tpot_p99 = percentile(tpot, 0.99);
  s.ttft_p95 = percentile(ttft, 0.95);
  s.e2e_p50 = percentile(e2e, 0.5);
  s.e2e_p95 = percentile(e2e, 0.95);
  return s;
}

json to_json(const std::string& policy, const LoadOptions& o, const LoadReport& r) {
  json j = {{"policy", policy},
            {"rt_rate", o.rt_rate},
            {"duration_s", o.duration_seconds},
            {"length_scale", o.length_scale},
            {"ttft_slo_s", o.ttft_slo},
            {"tpot_slo_s", o.tpot_slo},
            {"rt_requests", r.rt.rt_requests},
            {"rt_failed", r.rt.rt_failed},
            {"rt_normalized_latency_s", r.rt.rt_normalized_latency_s},
            {"ttft_attainment", r.rt.ttft_attainment},
            {"tpot_attainment", r.rt.tpot_attainment},
            {"ttft_p50_s", r.rt.ttft_p50},
            {"ttft_p99_s", r.rt.ttft_p99},
            {"tpot_p50_s", r.rt.tpot_p50},
            {"tpot_p99_s", r.rt.tpot_p99},
            {"be_jobs", r.be_jobs},
            {"be_requests", r.be_requests},
            {"be_tokens", r.be_tokens},
            {"be_requests_per_s", r.be_requests_per_s},
            {"be_throughput_tokens_per_s", r.be_throughput_tokens_per_s},
            {"scheduler_seconds", r.scheduler_seconds},
            {"step_seconds", r.step_seconds},
            {"steps", r.steps},
            {"scheduler_fraction", r.scheduler_fraction},
            {"seconds", r.seconds},
            {"ttft_p95_s", r.rt.ttft_p95},
            {"e2e_p50_s", r.rt.e2e_p50},
            {"e2e_p95_s", r.rt.e2e_p95},
            {"rt_output_tokens_per_s", r.rt_output_tokens_per_s}};
  if (!o.models.empty()) {
    j["zipf"] = o.zipf;
    json models = json::object();
    for (const auto& [name, s] : r.by_model)
      models[name] = {{"rt_requests", s.rt_requests},     {"rt_failed", s.rt_failed},
                      {"output_tokens", s.output_tokens}, {"ttft_p95_s", s.ttft_p95},
                      {"e2e_p50_s", s.e2e_p50},           {"e2e_p95_s", s.e2e_p95}};
    j["models"] = std::move(models);
  }
  return j;
}

void check_loopback(const std::string& host) {
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h == "localhost" || h == "::1") return;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127) return;
  throw Error("refusing to load " + (host.empty() ? std::string("an empty host") : host) +
              ": the load generator only targets loopback servers (127.0.0.0/8, ::1, localhost)");
}

std::pair<std::string, int> parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    throw Error("--url " + url + ": expected http://HOST[:PORT] (no TLS)");
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos)
    throw Error("--url " + url + ": expected no path (the server's root)");
  std::string host = rest;
  int port = 80;
  const size_t colon = rest.rfind(':');
  const size_t bracket = rest.rfind(']');
  if (colon != std::string::npos && (bracket == std::string::npos || colon > bracket)) {
    host = rest.substr(0, colon);
    const std::string p = rest.substr(colon + 1);
    if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(p) < 1 || std::stoi(p) > 65535)
      throw Error("--url " + url + ": bad port '" + p + "'");
    port = std::stoi(p);
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) throw Error("--url " + url + ": no host");
  return {host, port};
}

namespace {

// The RT workload: arrival times of a Poisson process of o.rt_rate over the window (at most
// o.max_rt_requests), and a streamed completion body for each with lengths drawn from
// o.rt_lengths, all fixed by o.seed.
void make_rt_workload(const LoadOptions& o, const std::string& model, std::vector<double>& arrivals,
                      std::vector<std::string>& bodies, std::vector<std::string>& models) {
  std::mt19937_64 rng(o.seed);
  if (o.rt_rate > 0) {
    std::exponential_distribution<double> gap(o.rt_rate);
    for (double t = gap(rng);
         t < o.duration_seconds && static_cast<int64_t>(arrivals.size()) < o.max_rt_requests;
         t += gap(rng))
      arrivals.push_back(t);
  }
  // The tenants' popularity: rank r (from 1) weighs 1 / r^zipf.
  std::mt19937_64 model_rng(o.seed ^ 0x5bd1e995u);
  std::vector<double> weights;
  for (size_t r = 0; r < o.models.size(); ++r)
    weights.push_back(1.0 / std::pow(static_cast<double>(r + 1), o.zipf));
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const auto& [prompt, output] = o.rt_lengths[static_cast<size_t>(rng() % o.rt_lengths.size())];
    models.push_back(o.models.empty() ? model : o.models[pick(model_rng)]);
    bodies.push_back(json{
        {"model", models.back()},
        {"prompt", random_prompt(rng, scaled(prompt, o.length_scale), o.max_token_id)},
        {"max_tokens", scaled(output, o.length_scale)},
        {"temperature", 0},
        {"ignore_eos", true},
        {"stream", true},
        {"stream_options", {{"include_usage", true}}},
        {"ttft_slo", o.ttft_slo},
        {"tpot_slo",
         o.tpot_slo}}.dump());
  }
}

// One BE batch job: o.be_batch_requests completion lines of the Batch API, lengths drawn
// uniformly from the (scaled) BE ranges.
std::string be_job_jsonl(const LoadOptions& o, const std::string& model, int64_t job,
                         std::mt19937_64& be_rng) {
  const int32_t pmin = scaled(o.be_prompt_min, o.length_scale);
  const int32_t pmax = std::max(pmin, scaled(o.be_prompt_max, o.length_scale));
  const int32_t omin = scaled(o.be_output_min, o.length_scale);
  const int32_t omax = std::max(omin, scaled(o.be_output_max, o.length_scale));
  std::string jsonl;
  for (int32_t i = 0; i < o.be_batch_requests; ++i) {
    const int32_t prompt = std::uniform_int_distribution<int32_t>(pmin, pmax)(be_rng);
    const int32_t output = std::uniform_int_distribution<int32_t>(omin, omax)(be_rng);
    jsonl += json{{"custom_id", "be-" + std::to_string(job) + "-" + std::to_string(i)},
                  {"method", "POST"},
                  {"url", "/v1/completions"},
                  {"body",
                   {{"model", model},
                    {"prompt", random_prompt(be_rng, prompt, o.max_token_id)},
                    {"max_tokens", output},
                    {"temperature", 0},
                    {"ignore_eos", true}}}}
                 .dump() +
             "\n";
  }
  return jsonl;
}

void check_load_options(const LoadOptions& o) {
  if (!(o.duration_seconds > 0)) throw Error("the duration must be > 0 seconds");
  if (!(o.rt_rate >= 0)) throw Error("the RT rate must be >= 0 requests/s");
  if (o.rt_rate > 0 && o.rt_lengths.empty()) throw Error("no RT request lengths to draw from");
  if (!(o.length_scale > 0)) throw Error("the length scale must be > 0");
  if (o.be_batch_requests < 0) throw Error("the BE batch size must be >= 0");
  if (o.be_prompt_min < 1 || o.be_prompt_max < o.be_prompt_min || o.be_output_min < 1 ||
      o.be_output_max < o.be_output_min)
    throw Error("bad BE length ranges");
  if (!(o.ttft_slo > 0) || !(o.tpot_slo > 0)) throw Error("the SLOs must be > 0 seconds");
  if (o.max_token_id <= 100) throw Error("max_token_id must be > 100");
  if (o.max_in_flight < 1) throw Error("max_in_flight must be >= 1");
  if (!(o.zipf >= 0)) throw Error("the popularity exponent (zipf) must be >= 0");
  for (const auto& [name, port] : o.model_ports) {
    if (std::find(o.models.begin(), o.models.end(), name) == o.models.end())
      throw Error("a port is given for model '" + name + "', which is not among the models");
    if (port < 1 || port > 65535) throw Error("model '" + name + "': bad port");
  }
}

}  // namespace

LoadReport run_load(const LoadOptions& o) {
  check_load_options(o);
  check_loopback(o.host);

  httplib::Client control(o.host, o.port);
  control.set_connection_timeout(5, 0);
  control.set_read_timeout(30, 0);
  const std::string model = served_model(o.host, o.port, o.model);
  const MetricSnapshot before = read_metrics(control);

  // The RT workload, fixed by the seed before the clock starts.
  std::vector<double> arrivals;
  std::vector<std::string> bodies, models;
  make_rt_workload(o, model, arrivals, bodies, models);

  LoadReport report;
  report.records.resize(arrivals.size());
  const Clock::time_point start = Clock::now();
  const auto window_end = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(o.duration_seconds));
  const auto deadline = window_end + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(o.drain_timeout_seconds));

  // BE: one batch job at a time, resubmitted until the window ends.
  std::mutex be_mu;
  std::string be_running;  // the id of the job not known to be done
  std::string be_error;
  std::thread be_thread;
  if (o.be_batch_requests > 0) {
    be_thread = std::thread([&] {
      httplib::Client c(o.host, o.port);
      c.set_connection_timeout(5, 0);
      c.set_read_timeout(30, 0);
      std::mt19937_64 be_rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
      auto fail = [&](const std::string& what) {
        std::lock_guard lock(be_mu);
        be_error = what;
      };
      for (int64_t job = 0; Clock::now() < window_end; ++job) {
        const std::string jsonl = be_job_jsonl(o, model, job, be_rng);
        httplib::MultipartFormDataItems items = {{"purpose", "batch", "", ""},
                                                 {"file", jsonl, "be.jsonl", "application/jsonl"}};
        auto up = c.Post("/v1/files", items);
        if (!up || up->status != 200)
          return fail("BE upload failed" + (up ? ": " + up->body : std::string()));
        const json create = {{"input_file_id", field(up->body, "id")},
                             {"endpoint", "/v1/completions"},
                             {"completion_window", "24h"}};
        auto cr = c.Post("/v1/batches", create.dump(), "application/json");
        if (!cr || cr->status != 200)
          return fail("BE batch creation failed" + (cr ? ": " + cr->body : std::string()));
        const std::string id = field(cr->body, "id");
        const Clock::time_point created = Clock::now();
        {
          std::lock_guard lock(be_mu);
          be_running = id;
          ++report.be_jobs;
        }
        for (;;) {
          if (Clock::now() >= window_end) return;  // the job keeps running: cancelled later
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          auto g = c.Get(("/v1/batches/" + id).c_str());
          if (!g || g->status != 200) continue;
          const std::string status = field(g->body, "status");
          if (status == "failed" || status == "cancelled" || status == "expired")
            return fail("BE batch " + id + " ended " + status);
          if (status == "completed") break;
        }
        std::lock_guard lock(be_mu);
        be_running.clear();
        report.be_job_seconds.push_back(since(created, Clock::now()));
      }
    });
  }

  // RT: a thread per request, sent at its arrival time.
  std::vector<std::thread> rt_threads;
  std::atomic<int32_t> in_flight{0};
  for (size_t i = 0; i < arrivals.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    RtRecord& rec = report.records[i];
    rec.model = models[i];
    if (in_flight.load() >= o.max_in_flight) {
      rec.arrival = since(start, Clock::now());
      rec.error = "over the client's in-flight cap";
      continue;
    }
    ++in_flight;
    const auto to = o.model_ports.find(models[i]);
    const int port = to == o.model_ports.end() ? o.port : to->second;
    rt_threads.emplace_back([&, i, port] {
      run_rt_request(o, bodies[i], port, start, deadline, report.records[i]);
      --in_flight;
    });
  }
  std::this_thread::sleep_until(window_end);
  // Every thread is joined before an error can leave this function (a joinable std::thread
  // destroyed by the unwinding would end the process).
  MetricSnapshot at_window_end;
  std::string metrics_error;
  try {
    at_window_end = read_metrics(control);
  } catch (const Error& e) {
    metrics_error = e.what();
  }
  if (be_thread.joinable()) be_thread.join();
  for (std::thread& t : rt_threads) t.join();
  if (!metrics_error.empty()) throw Error(metrics_error + " (at the end of the window)");
  const MetricSnapshot after = read_metrics(control);
  report.seconds = since(start, Clock::now());
  {
    std::lock_guard lock(be_mu);
    if (!be_running.empty())
      control.Post(("/v1/batches/" + be_running + "/cancel").c_str(), "{}", "application/json");
    if (!be_error.empty()) throw Error(be_error);
  }

  report.rt = summarize(report.records, o.ttft_slo, o.tpot_slo);
  report.rt_output_tokens_per_s =
      report.seconds > 0 ? static_cast<double>(report.rt.output_tokens) / report.seconds : 0;
  if (!o.models.empty()) {
    std::map<std::string, std::vector<RtRecord>> of_model;
    for (const RtRecord& r : report.records) of_model[r.model].push_back(r);
    for (const auto& [name, records] : of_model)
      report.by_model[name] = summarize(records, o.ttft_slo, o.tpot_slo);
  }
  report.be_requests = static_cast<int64_t>(at_window_end.be_finished - before.be_finished);
  report.be_tokens =
      static_cast<int64_t>((at_window_end.be_prompt_tokens - before.be_prompt_tokens) +
                           (at_window_end.be_output_tokens - before.be_output_tokens));
  report.be_requests_per_s = static_cast<double>(report.be_requests) / o.duration_seconds;
  report.be_throughput_tokens_per_s = static_cast<double>(report.be_tokens) / o.duration_seconds;
  report.scheduler_seconds = after.scheduler_seconds - before.scheduler_seconds;
  report.step_seconds = after.step_seconds - before.step_seconds;
  report.steps = static_cast<int64_t>(after.steps - before.steps);
  report.scheduler_fraction =
      report.step_seconds > 0 ? report.scheduler_seconds / report.step_seconds : 0;
  return report;
}

}  // namespace blend::online
