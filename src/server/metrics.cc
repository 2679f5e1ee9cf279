#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace blend {
namespace {

constexpr const char* kClassNames[2] = {"rt", "be"};

// Latency buckets in seconds: from a fast decode step to a long request.
const std::vector<double> kLatencyBounds = {0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                            0.15,  0.2,  0.3,  0.4,  0.5,  0.75, 1.0,
                                            2.5,   5.0,  10.0, 20.0, 40.0, 80.0};

// Token-count buckets, 1-2-5 up to 100K (vLLM's build_1_2_5_buckets).
const std::vector<double> kTokenBounds = {1,   2,    5,    10,   20,    50,    100,   200,
                                          500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

template <typename K>
void bump(std::vector<std::pair<K, int64_t>>& counts, const K& key) {
  for (auto& [k, n] : counts)
    if (k == key) {
      ++n;
      return;
    }
  counts.emplace_back(key, 1);
}

// The exposition written as `blend:` names for each prefix in turn; the vllm: samples carry the
// model_name label (blend's own names keep their labels as they were).
std::string relabel(const std::string& text, const std::string& model_name,
                    const std::vector<std::string>& prefixes) {
  if (prefixes.size() == 1 && prefixes[0] == "blend") return text;  // as written
  std::string escaped;  // Prometheus label values escape \\, " and newlines
  for (char c : model_name)
    escaped += c == '\n'                 ? std::string("\\n")
               : (c == '"' || c == '\\') ? std::string("\\") + c
                                         : std::string(1, c);
  const std::string label = "model_name=\"" + escaped + "\"";
  std::string out;
  for (const std::string& prefix : prefixes) {
    size_t at = 0;
    while (at < text.size()) {
      const size_t end = text.find('\n', at);
      std::string line = text.substr(at, end - at);
      at = end + 1;
      const bool comment = line.rfind("# ", 0) == 0;
      const size_t name = comment ? 7 : 0;  // after "# HELP " / "# TYPE "
      if (line.compare(name, 6, "blend:") == 0) line.replace(name, 5, prefix);
      if (!comment && prefix == "vllm") {
        const size_t brace = line.find('{');
        if (brace != std::string::npos && brace < line.find(' '))
          line.insert(brace + 1, label + ",");
        else
          line.insert(line.find(' '), "{" + label + "}");
      }
      out += line + "\n";
    }
  }
  return out;
}

}  // namespace

void Metrics::Histogram::observe(double v) {
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
  ++counts[i];
  sum += v;
  ++total;
}

Metrics::Metrics() {
  auto init = [](Histogram& h, const std::vector<double>& bounds) {
    h.bounds = bounds;
    h.counts.assign(bounds.size() + 1, 0);
  };
  for (PerClass& c : classes_) {
    for (Histogram* h : {&c.ttft, &c.tpot, &c.e2e, &c.decode, &c.queue, &c.prefill, &c.inference})
      init(*h, kLatencyBounds);
    for (Histogram* h : {&c.prompt_tokens, &c.generation_tokens}) init(*h, kTokenBounds);
  }
  init(step_tokens_, kTokenBounds);
}

void Metrics::set_names(std::string model_name, std::vector<std::string> prefixes) {
  std::lock_guard lock(mu_);
  model_name_ = std::move(model_name);
  prefixes_ = std::move(prefixes);
}

void Metrics::on_queued(RequestClass c) {
  std::lock_guard lock(mu_);
  ++of(c).waiting;
}

int64_t Metrics::in_engine(RequestClass c) const {
  std::lock_guard lock(mu_);
  const PerClass& p = classes_[c == RequestClass::kRealtime ? 0 : 1];
  return p.waiting + p.running;
}

void Metrics::on_first_token(RequestClass c, double ttft_seconds) {
  std::lock_guard lock(mu_);
  PerClass& p = of(c);
  --p.waiting;
  ++p.running;
  p.ttft.observe(ttft_seconds);
}

void Metrics::on_finished(RequestClass c, bool had_first_token, const char* finish_reason,
                          int64_t prompt_tokens, int64_t output_tokens, double e2e_seconds,
                          double tpot_seconds) {
  std::lock_guard lock(mu_);
  PerClass& p = of(c);
  --(had_first_token ? p.running : p.waiting);
  bump(p.finished, std::string(finish_reason));
  p.e2e.observe(e2e_seconds);
  if (output_tokens > 1) p.tpot.observe(tpot_seconds);
  p.prompt_tokens.observe(static_cast<double>(prompt_tokens));
  p.generation_tokens.observe(static_cast<double>(output_tokens));
  // First token to last: the TPOT times the gaps between output tokens.
  if (output_tokens > 0) p.decode.observe(tpot_seconds * static_cast<double>(output_tokens - 1));
}

void Metrics::on_cancelled(RequestClass c, bool had_first_token) {
  std::lock_guard lock(mu_);
  PerClass& p = of(c);
  --(had_first_token ? p.running : p.waiting);
  ++p.cancelled;
}

void Metrics::on_request_times(const RequestTimes& t) {
  if (t.first_scheduled < 0) return;  // finished without running (max_tokens 0)
  std::lock_guard lock(mu_);
  PerClass& p = of(t.request_class);
  p.queue.observe(t.first_scheduled - t.arrival);
  p.inference.observe(t.finished - t.first_scheduled);
  if (t.first_token >= 0) p.prefill.observe(t.first_token - t.first_scheduled);
}

void Metrics::on_error(int http_status) {
  std::lock_guard lock(mu_);
  bump(errors_, http_status);
}

void Metrics::on_step(const EngineStats& stats) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  // Each step since the last report, at the mean of their tokens (one step, as a rule).
  const int64_t steps = stats.steps - engine_.steps;
  const double tokens = static_cast<double>(stats.batch_tokens - engine_.batch_tokens);
  for (int64_t i = 0; i < steps; ++i) step_tokens_.observe(tokens / static_cast<double>(steps));
  engine_ = stats;
  samples_.emplace_back(now, stats.prompt_tokens + stats.output_tokens);
  while (samples_.size() > 2 && now - samples_.front().first > std::chrono::seconds(10))
    samples_.pop_front();
}

void Metrics::on_engine_tokens(const EngineStats& stats) {
  std::lock_guard lock(mu_);
  engine_.prompt_tokens_by_class = stats.prompt_tokens_by_class;
  engine_.output_tokens_by_class = stats.output_tokens_by_class;
}

void Metrics::set_batch_lines_pending(int64_t lines) {
  std::lock_guard lock(mu_);
  batch_lines_pending_ = lines;
}

std::string Metrics::render() const {
  std::lock_guard lock(mu_);
  std::string out;
  auto line = [&out](const std::string& name, const std::string& labels, double v) {
    out += name;
    if (!labels.empty()) out += "{" + labels + "}";
    out += " " + number(v) + "\n";
  };
  auto help = [&out](const char* name, const char* type, const char* text) {
    out += std::string("# HELP ") + name + " " + text + "\n# TYPE " + name + " " + type + "\n";
  };
  auto cls = [](size_t i) { return std::string("class=\"") + kClassNames[i] + "\""; };

  help("blend:num_requests_waiting", "gauge", "Requests queued without a token yet.");
  for (size_t i = 0; i < 2; ++i) line("blend:num_requests_waiting", cls(i), classes_[i].waiting);
  help("blend:num_requests_running", "gauge", "Requests producing tokens.");
  for (size_t i = 0; i < 2; ++i) line("blend:num_requests_running", cls(i), classes_[i].running);
  help("blend:num_batch_lines_pending", "gauge",
       "Batch API lines the batch planner has not handed to the engine yet.");
  line("blend:num_batch_lines_pending", "", static_cast<double>(batch_lines_pending_));
  help("blend:request_success_total", "counter", "Finished requests by finish reason.");
  for (size_t i = 0; i < 2; ++i)
    for (const auto& [reason, n] : classes_[i].finished)
      line("blend:request_success_total", cls(i) + ",finished_reason=\"" + reason + "\"",
           static_cast<double>(n));
  help("blend:request_cancelled_total", "counter", "Requests dropped before they finished.");
  for (size_t i = 0; i < 2; ++i)
    line("blend:request_cancelled_total", cls(i), static_cast<double>(classes_[i].cancelled));
  help("blend:request_errors_total", "counter", "Requests rejected, by HTTP status.");
  for (const auto& [status, n] : errors_)
    line("blend:request_errors_total", "status=\"" + std::to_string(status) + "\"",
         static_cast<double>(n));
  // RequestClass order (kRealtime, kBestEffort) is kClassNames' order.
  help("blend:prompt_tokens_total", "counter",
       "Prompt tokens prefilled (counted at a request's first token, cancelled ones included).");
  for (size_t i = 0; i < 2; ++i)
    line("blend:prompt_tokens_total", cls(i),
         static_cast<double>(engine_.prompt_tokens_by_class[i]));
  help("blend:generation_tokens_total", "counter",
       "Output tokens, counted in the step that generates them (cancelled requests' included).");
  for (size_t i = 0; i < 2; ++i)
    line("blend:generation_tokens_total", cls(i),
         static_cast<double>(engine_.output_tokens_by_class[i]));

  // One histogram's samples, its labels (a class, or none) before each bucket's `le`.
  auto samples = [&](const std::string& name, const std::string& labels, const Histogram& h) {
    const std::string before_le = labels.empty() ? "" : labels + ",";
    int64_t cumulative = 0;
    for (size_t b = 0; b <= h.bounds.size(); ++b) {
      cumulative += h.counts[b];
      const std::string le = b < h.bounds.size() ? number(h.bounds[b]) : "+Inf";
      line(name + "_bucket", before_le + "le=\"" + le + "\"", static_cast<double>(cumulative));
    }
    line(name + "_sum", labels, h.sum);
    line(name + "_count", labels, static_cast<double>(h.total));
  };
  auto histogram = [&](const char* name, const char* text, Histogram PerClass::*member) {
    help(name, "histogram", text);
    for (size_t i = 0; i < 2; ++i) samples(name, cls(i), classes_[i].*member);
  };
  histogram("blend:time_to_first_token_seconds", "Time to first token.", &PerClass::ttft);
  histogram("blend:time_per_output_token_seconds", "Mean time between output tokens.",
            &PerClass::tpot);
  histogram("blend:e2e_request_latency_seconds", "Arrival to last token.", &PerClass::e2e);
  histogram("blend:request_decode_time_seconds", "First token to last.", &PerClass::decode);
  histogram("blend:request_queue_time_seconds", "Queued in the engine until first scheduled.",
            &PerClass::queue);
  histogram("blend:request_prefill_time_seconds", "First scheduled to first token.",
            &PerClass::prefill);
  histogram("blend:request_inference_time_seconds", "First scheduled to finished.",
            &PerClass::inference);
  histogram("blend:request_prompt_tokens", "Prompt tokens of finished requests.",
            &PerClass::prompt_tokens);
  histogram("blend:request_generation_tokens", "Output tokens of finished requests.",
            &PerClass::generation_tokens);
  help("blend:iteration_tokens_total", "histogram", "Tokens computed per engine step.");
  samples("blend:iteration_tokens_total", "", step_tokens_);

  help("blend:kv_cache_usage_perc", "gauge", "Fraction of KV pages in use.");
  line("blend:kv_cache_usage_perc", "",
       engine_.kv_capacity_bytes ? static_cast<double>(engine_.kv_used_bytes) /
                                       static_cast<double>(engine_.kv_capacity_bytes)
                                 : 0.0);
  help("blend:kv_cache_used_bytes", "gauge", "KV cache bytes in use.");
  line("blend:kv_cache_used_bytes", "", static_cast<double>(engine_.kv_used_bytes));
  help("blend:kv_cache_capacity_bytes", "gauge", "KV cache size.");
  line("blend:kv_cache_capacity_bytes", "", static_cast<double>(engine_.kv_capacity_bytes));
  help("blend:kv_cache_cached_idle_bytes", "gauge",
       "KV bytes only the prefix cache holds (reclaimable at once).");
  line("blend:kv_cache_cached_idle_bytes", "", static_cast<double>(engine_.kv_cached_idle_bytes));
  help("blend:prefix_cache_hit_ratio", "gauge",
       "Prompt tokens served from the prefix cache / prompt tokens, since start.");
  line("blend:prefix_cache_hit_ratio", "",
       engine_.prompt_tokens ? static_cast<double>(engine_.cached_prompt_tokens) /
                                   static_cast<double>(engine_.prompt_tokens)
                             : 0.0);
  help("blend:prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the cache.");
  line("blend:prefix_cache_hit_tokens_total", "",
       static_cast<double>(engine_.cached_prompt_tokens));
  // vLLM's pair for its hit-rate panel: prompt tokens looked up, and those found.
  help("blend:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the cache.");
  line("blend:prefix_cache_queries_total", "", static_cast<double>(engine_.prompt_tokens));
  help("blend:prefix_cache_hits_total", "counter", "Prompt tokens found in the cache.");
  line("blend:prefix_cache_hits_total", "", static_cast<double>(engine_.cached_prompt_tokens));
  help("blend:num_preemptions_total", "counter", "Sequences preempted (KV recomputed).");
  line("blend:num_preemptions_total", "", static_cast<double>(engine_.preemptions));
  help("blend:iterations_total", "counter", "Engine steps.");
  line("blend:iterations_total", "", static_cast<double>(engine_.steps));
  help("blend:scheduler_seconds_total", "counter",
       "Wall-clock seconds the scheduler spent building step plans.");
  line("blend:scheduler_seconds_total", "", engine_.schedule_seconds);
  help("blend:step_seconds_total", "counter",
       "Wall-clock seconds of whole engine steps (scheduling included).");
  line("blend:step_seconds_total", "", engine_.step_seconds);
  double rate = 0;
  if (samples_.size() >= 2) {
    const double dt =
        std::chrono::duration<double>(samples_.back().first - samples_.front().first).count();
    if (dt > 0) rate = static_cast<double>(samples_.back().second - samples_.front().second) / dt;
  }
  help("blend:tokens_per_second", "gauge", "Prompt + output tokens per second, last 10 s.");
  line("blend:tokens_per_second", "", rate);
  return relabel(out, model_name_, prefixes_);
}

}  // namespace blend
