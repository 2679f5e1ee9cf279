#include "backend/cuda/nano_search.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend::cuda {
namespace {

// Index i with v[i] <= x < v[i + 1] (clamped to [0, size - 2]), and x's fraction past v[i].
template <typename T>
std::pair<size_t, double> bracket(const std::vector<T>& v, double x) {
  if (v.size() == 1) return {0, 0.0};
  size_t i = std::upper_bound(v.begin(), v.end(), x,
                              [](double a, T b) { return a < static_cast<double>(b); }) -
             v.begin();
  i = std::clamp<size_t>(i, 1, v.size() - 1) - 1;
  const double lo = static_cast<double>(v[i]), hi = static_cast<double>(v[i + 1]);
  return {i, (x - lo) / (hi - lo)};
}

}  // namespace

void PhaseProfile::check(const char* what) const {
  auto fail = [&](const std::string& why) {
    throw Error(std::string("nano-batch profile: ") + what + ": " + why);
  };
  if (work.empty() || sms.empty()) fail("no measured points");
  if (seconds.size() != work.size() * sms.size())
    fail(std::to_string(seconds.size()) + " times for " + std::to_string(work.size()) +
         " work sizes x " + std::to_string(sms.size()) + " SM counts");
  for (size_t i = 0; i < work.size(); ++i)
    if (!(work[i] > 0) || !std::isfinite(work[i]) || (i > 0 && !(work[i] > work[i - 1])))
      fail("work sizes must be finite, > 0 and ascending");
  for (size_t i = 0; i < sms.size(); ++i)
    if (sms[i] < 1 || (i > 0 && sms[i] <= sms[i - 1])) fail("SM counts must be >= 1 and ascending");
  for (double s : seconds)
    if (!(s >= 0) || !std::isfinite(s)) fail("times must be finite and >= 0");
}

double PhaseProfile::seconds_at(double w, int32_t sm_count) const {
  // Plain variables, not a structured binding: clang before 16 cannot capture one.
  const std::pair<size_t, double> at_sms =
      bracket(sms, std::clamp<double>(sm_count, sms.front(), sms.back()));
  const size_t s = at_sms.first;
  const double fs = at_sms.second;
  auto at_work_row = [&](size_t row) {
    const double* r = seconds.data() + row * sms.size();
    return sms.size() == 1 ? r[0] : r[s] + fs * (r[s + 1] - r[s]);
  };
  if (w <= work.front()) return at_work_row(0);
  if (work.size() == 1) return at_work_row(0) * w / work.front();  // one point: proportional
  const auto [i, fw] = bracket(work, w);  // past the last point fw > 1: the line extends
  const double lo = at_work_row(i), hi = at_work_row(i + 1);
  return std::max(0.0, lo + fw * (hi - lo));
}

void NanoProfile::check() const {
  if (total_sms < 2) throw Error("nano-batch profile: total_sms must be at least 2");
  if (layers < 1) throw Error("nano-batch profile: layers must be at least 1");
  if (!(prefill_kv_tile >= 1)) throw Error("nano-batch profile: prefill_kv_tile must be >= 1");
  if (sm_step < 1 || 2 * sm_step > total_sms)
    throw Error("nano-batch profile: sm_step must be from 1 to half of total_sms");
  gemm.check("gemm");
  attention.check("attention");
}

CriticalPath nano_critical_path(double gx, double ax, double gy, double ay, int32_t layers) {
  // Longest path in topological order; each node keeps the path that ends at it.
  CriticalPath xg, xa, yg, ya;  // the last node of each kind so far
  auto after = [](const CriticalPath& a, const CriticalPath& b) {
    return a.seconds >= b.seconds ? a : b;
  };
  auto gemm = [](CriticalPath p, double s) {
    p.seconds += s;
    p.gemm_seconds += s;
    return p;
  };
  auto attention = [](CriticalPath p, double s) {
    p.seconds += s;
    p.attention_seconds += s;
    return p;
  };
  for (int32_t l = 0; l <= layers; ++l) {
    // ya is still Y.A(l-1) until its own line.
    xg = gemm(after(xa, yg), gx);                       // X.G(l) after X.A(l-1) and Y.G(l-1)
    if (l < layers) xa = attention(after(xg, ya), ax);  // X.A(l) after X.G(l) and Y.A(l-1)
    yg = gemm(after(ya, xg), gy);                       // Y.G(l) after Y.A(l-1) and X.G(l)
    if (l < layers) ya = attention(after(yg, xa), ay);  // Y.A(l) after Y.G(l) and X.A(l)
  }
  return after(xg, yg);
}

NanoPlan search_sm_split(const NanoProfile& p, double x_tokens, double x_reads, double y_tokens,
                         double y_reads, int32_t step) {
  if (step < 1 || 2 * step > p.total_sms)
    throw Error("nano-batch search: the SM step must be from 1 to half the SMs");
  auto evaluate = [&](int32_t g) {
    const int32_t a = p.total_sms - g;
    return nano_critical_path(p.gemm.seconds_at(x_tokens, g), p.attention.seconds_at(x_reads, a),
                              p.gemm.seconds_at(y_tokens, g), p.attention.seconds_at(y_reads, a),
                              p.layers);
  };
  // Multiples of step, each leaving the attention at least one SM.
  const int32_t lowest = step, highest = (p.total_sms - 1) / step * step;
  int32_t g = std::max(lowest, p.total_sms / 2 / step * step);
  CriticalPath path = evaluate(g);
  NanoPlan plan;
  for (;;) {
    // More SMs for the kind with more time on the critical path (§5.5); when that does not
    // shorten it (a memory-bound attention already at the memory's bandwidth gains nothing
    // from more SMs), the other way: the kind the path holds less of may still be on it.
    const int32_t toward = path.gemm_seconds >= path.attention_seconds ? step : -step;
    bool moved = false;
    for (int32_t delta : {toward, -toward}) {
      const int32_t next = std::clamp(g + delta, lowest, highest);
      if (next == g) continue;
      const CriticalPath tried = evaluate(next);
      if (tried.seconds < path.seconds) {
        g = next;
        path = tried;
        ++plan.moves;
        moved = true;
        break;
      }
    }
    if (!moved) break;
  }
  plan.gemm_sms = g;
  plan.attention_sms = p.total_sms - g;
  plan.seconds = path.seconds;
  return plan;
}

NanoPlan autosearch(std::span<const ChunkWork> chunks, const NanoProfile& p, int32_t step,
                    double min_ratio, int32_t max_even_cuts) {
  p.check();
  const size_t n = chunks.size();
  std::vector<double> tokens(n + 1, 0), reads(n + 1, 0);  // prefix sums
  for (size_t i = 0; i < n; ++i) {
    tokens[i + 1] = tokens[i] + chunks[i].tokens;
    reads[i + 1] = reads[i] + nano_attention_reads(chunks[i], p.prefill_kv_tile);
  }
  NanoPlan whole;
  // Whole: every phase on every SM, one after another (the whole step's critical path is its
  // sum: embedding/QKV, then per layer attention and the next GEMM phase).
  whole.sequential_s = (p.layers + 1) * p.gemm.seconds_at(tokens[n], p.total_sms) +
                       p.layers * p.attention.seconds_at(reads[n], p.total_sms);
  whole.seconds = whole.sequential_s;
  NanoPlan best;
  const size_t stride = std::max<size_t>(1, (n + max_even_cuts - 1) / std::max(max_even_cuts, 1));
  for (size_t c = 1; c < n; ++c) {
    const bool kind_changes = (chunks[c - 1].tokens <= 1) != (chunks[c].tokens <= 1);
    if (c % stride != 0 && !kind_changes) continue;
    NanoPlan plan =
        search_sm_split(p, tokens[c], reads[c], tokens[n] - tokens[c], reads[n] - reads[c], step);
    plan.cut = static_cast<int32_t>(c);
    if (best.cut == 0 || plan.seconds < best.seconds) best = plan;
  }
  if (best.cut == 0 || !(best.seconds <= min_ratio * whole.sequential_s)) return whole;
  best.sequential_s = whole.sequential_s;
  return best;
}

NanoStepPlan plan_nano_step(std::span<const ChunkWork> chunks, const NanoProfile* profile,
                            const NanoCost& cost, int32_t fixed_green_sms, bool always) {
  if (chunks.size() < 2) return {};
  constexpr double kMinRatio = 0.95;  // a cut must save 5% of the whole step
  if (profile) {
    const double min_ratio = always ? std::numeric_limits<double>::infinity() : kMinRatio;
    const NanoPlan plan = autosearch(chunks, *profile, profile->sm_step, min_ratio);
    return {.cut = plan.cut, .green_gemm_sms = plan.cut > 0 ? plan.gemm_sms : 0};
  }
  const NanoSplit split = choose_nano_split(chunks, cost, kMinRatio, always);
  return {.cut = split.cut, .green_gemm_sms = split.cut > 0 ? fixed_green_sms : 0};
}

nlohmann::json nano_profile_to_json(const NanoProfile& p) {
  auto phase = [](const PhaseProfile& ph) {
    return nlohmann::json{{"work", ph.work}, {"sms", ph.sms}, {"seconds", ph.seconds}};
  };
  return {
      {"total_sms", p.total_sms}, {"layers", p.layers},    {"prefill_kv_tile", p.prefill_kv_tile},
      {"sm_step", p.sm_step},     {"gemm", phase(p.gemm)}, {"attention", phase(p.attention)}};
}

NanoProfile nano_profile_from_json(const nlohmann::json& j) {
  NanoProfile p;
  try {
    p.total_sms = j.at("total_sms").get<int32_t>();
    p.layers = j.at("layers").get<int32_t>();
    p.prefill_kv_tile = j.value("prefill_kv_tile", 64.0);
    p.sm_step = j.value("sm_step", 1);
    for (auto [name, phase] : {std::pair{"gemm", &p.gemm}, std::pair{"attention", &p.attention}}) {
      const nlohmann::json& ph = j.at(name);
      phase->work = ph.at("work").get<std::vector<double>>();
      phase->sms = ph.at("sms").get<std::vector<int32_t>>();
      phase->seconds = ph.at("seconds").get<std::vector<double>>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("nano-batch profile: ") + e.what());
  }
  p.check();
  return p;
}

NanoProfile load_nano_profile(const std::string& path, int32_t total_sms, int32_t layers) {
  std::ifstream in(path);
  if (!in) throw Error("nano-batch profile " + path + ": cannot read it");
  NanoProfile p;
  try {
    p = nano_profile_from_json(nlohmann::json::parse(in));
  } catch (const nlohmann::json::exception& e) {
    throw Error("nano-batch profile " + path + ": " + e.what());
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  if (p.total_sms != total_sms || p.layers != layers)
    throw Error("nano-batch profile " + path + " was measured on " + std::to_string(p.total_sms) +
                " SMs and " + std::to_string(p.layers) + " layers; this GPU has " +
                std::to_string(total_sms) + " SMs and the model " + std::to_string(layers) +
                " layers (run `blend profile --backend cuda --nano` here)");
  return p;
}

int64_t NanoGrid::pages_needed(int32_t page_size) const {
  const int64_t per_decode = (int64_t{decode_context} + 1 + page_size - 1) / page_size;
  int64_t most = decode_sequences.empty() ? 0 : decode_sequences.back() * per_decode;
  for (int32_t t : gemm_tokens) most = std::max<int64_t>(most, (t + page_size - 1) / page_size);
  return most;
}

NanoGrid nano_profile_grid(int32_t total_sms, int32_t sm_step, int64_t kv_tokens,
                           int32_t page_size) {
  if (sm_step < 1 || 2 * sm_step > total_sms || page_size < 1)
    throw Error("nano-batch profile grid: " + std::to_string(total_sms) +
                " SMs cannot be split at steps of " + std::to_string(sm_step));
  NanoGrid grid;
  for (int32_t g = sm_step; g < total_sms; g += sm_step) grid.gemm_sms.push_back(g);
  while (!grid.decode_sequences.empty() && grid.pages_needed(page_size) * page_size > kv_tokens)
    grid.decode_sequences.pop_back();
  if (grid.decode_sequences.size() < 2) {
    NanoGrid least;
    least.decode_sequences.resize(2);  // the two smallest sizes
    throw Error("nano-batch profile grid: the KV cache holds " + std::to_string(kv_tokens) +
                " tokens; timing attention needs " +
                std::to_string(least.pages_needed(page_size) * page_size));
  }
  return grid;
}

}  // namespace blend::cuda
