#include "harness/profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/least_squares.h"
#include "sampling/sampler.h"

namespace blend {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A prefill step of `tokens` tokens in prompts of kScanPrompt tokens (the last one shorter),
// each on pages of its own: the dense layers' work grows by the token while the lm_head's rows
// (one a prompt) stay few. With prompts of one page the lm_head's rows, padded to the GEMM's
// row bucket, made a staircase of their own (the tiny preset's 128K-row lm_head: 513 tokens
// took as long as 768).
constexpr int64_t kScanPrompt = 128;
ForwardBatch scan_prompts(int64_t tokens, int64_t page_size) {
  ForwardBatch b;
  PageId next_page = 0;
  for (int64_t start = 0; start < tokens; start += kScanPrompt) {
    const auto n = static_cast<int32_t>(std::min(kScanPrompt, tokens - start));
    ForwardBatch one = synthetic_batch(1, n, 0, page_size);
    SeqChunk c = std::move(one.chunks[0]);
    c.seq = static_cast<SeqId>(b.chunks.size());
    c.token_offset = b.num_tokens();
    for (PageId& page : c.block_table) page = next_page++;
    b.tokens.insert(b.tokens.end(), one.tokens.begin(), one.tokens.end());
    b.positions.insert(b.positions.end(), one.positions.begin(), one.positions.end());
    b.chunks.push_back(std::move(c));
  }
  return b;
}

}  // namespace

StepRecorder::StepRecorder(Engine& engine) {
  engine.add_step_observer([this](const ForwardBatch& batch, double started, bool device_draws) {
    StepShape shape = step_shape(batch);
    shape.device_draws = device_draws;
    started_.emplace_back(shape, started);
  });
}

std::vector<MeasuredStep> StepRecorder::steps(double end_seconds) const {
  std::vector<MeasuredStep> out;
  for (size_t i = 0; i < started_.size(); ++i) {
    const double next = i + 1 < started_.size() ? started_[i + 1].second : end_seconds;
    out.push_back({started_[i].first, next - started_[i].second});
  }
  return out;
}

void write_step_timings(const std::string& path, const std::vector<MeasuredStep>& steps) {
  std::ofstream out(path);
  for (const MeasuredStep& m : steps)
    out << nlohmann::json{{"prefill_tokens", m.shape.prefill_tokens},
                          {"decode_tokens", m.shape.decode_tokens},
                          {"decode_context_tokens", m.shape.decode_context_tokens},
                          {"prefill_attention_pairs", m.shape.prefill_attention_pairs},
                          {"logit_rows", m.shape.logit_rows},
                          {"plain_draws", m.shape.device_draws},
                          {"seconds", m.seconds}}
               .dump()
        << "\n";
  if (!out) throw Error("cannot write step timings " + path);
}

std::vector<MeasuredStep> read_step_timings(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read step timings " + path);
  std::vector<MeasuredStep> steps;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      MeasuredStep m;
      m.shape.prefill_tokens = j.at("prefill_tokens").get<int64_t>();
      m.shape.decode_tokens = j.at("decode_tokens").get<int64_t>();
      m.shape.decode_context_tokens = j.at("decode_context_tokens").get<int64_t>();
      m.shape.prefill_attention_pairs = j.at("prefill_attention_pairs").get<int64_t>();
      m.shape.logit_rows = j.at("logit_rows").get<int64_t>();
      m.shape.device_draws =  // "plain_greedy" in older files, absent in the oldest
          j.contains("plain_draws") ? j.at("plain_draws").get<bool>()
                                    : j.value("plain_greedy", false);
      m.seconds = j.at("seconds").get<double>();
      if (m.shape.prefill_tokens < 0 || m.shape.decode_tokens < 0 ||
          m.shape.decode_context_tokens < 0 || m.shape.prefill_attention_pairs < 0 ||
          m.shape.prefill_tokens + m.shape.decode_tokens == 0 || !(m.seconds > 0))
        throw Error("a step needs tokens and a positive time");
      steps.push_back(m);
    } catch (const std::exception& e) {
      throw Error("step timings " + path + " line " + std::to_string(n) + ": " + e.what());
    }
  }
  return steps;
}

namespace {

// The fit's inputs per step: unit-rate seconds of each part of the cost model (at 1 FLOP/s and
// 1 byte/s) and the measured seconds less the host's per-row sampling.
struct StepTerms {
  double gemm = 0, attention = 0, weights = 0, kv = 0, decodes = 0, seconds = 0;
};

// The Bayesian information criterion of a least-squares fit of n points whose squared residuals
// sum to `squares`: n ln(RSS / n) + parameters x ln n. A fit exact to rounding (residuals below
// 1e-9 of the mean point, `mean`) scores as exact.
double information_criterion(double squares, double n, double mean, double parameters) {
  const double floor = n * std::pow(1e-9 * mean, 2);
  return n * std::log(std::max(squares, floor) / n) + parameters * std::log(n);
}

// The fitted hardware with its errors over the steps, and the Bayesian information criterion of
// its squared residuals (information_criterion), which picks between the forms.
struct FormFit {
  HardwareFit fit;
  double bic = 0;
};

FormFit finish_fit(const ModelShape& shape, const std::vector<MeasuredStep>& steps, Hardware h,
                   int parameters) {
  HardwareFit fit;
  h.network_bandwidth = 1e18;  // one device
  h.memory_bytes = 0;
  fit.hardware = h;
  Hardware costed = h;
  costed.memory_bytes = 1;
  const CostModel fitted(shape, costed);
  double estimated_total = 0, measured_total = 0, squares = 0;
  for (const MeasuredStep& m : steps) {
    const double estimate = fitted.estimate_step(m.shape).sequential();
    const double err = std::fabs(estimate - m.seconds) / m.seconds;
    fit.mean_abs_error += err / static_cast<double>(steps.size());
    fit.max_abs_error = std::max(fit.max_abs_error, err);
    estimated_total += estimate;
    measured_total += m.seconds;
    squares += (estimate - m.seconds) * (estimate - m.seconds);
  }
  fit.total_error = estimated_total / measured_total - 1;
  const double n = static_cast<double>(steps.size());
  return {fit, information_criterion(squares, n, measured_total / n, parameters)};
}

double rate(double seconds_per_unit) {
  return seconds_per_unit > 0 ? 1 / seconds_per_unit : 1e18;
}

// t = GEMM FLOPs / C + attention FLOPs / C_attn + (weights + KV) / B + overhead. Prefill
// attention has a rate of its own: with one rate for both, small prefills were estimated
// 15-16% too long on the CPU and the fit's mean error was 11-17%; with two it is 4-7%
// (docs/BENCHMARKS.md).
Hardware fit_sum(const std::vector<StepTerms>& terms) {
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (const StepTerms& t : terms) {
    x.push_back({t.gemm, t.attention, t.weights + t.kv, 1.0});
    y.push_back(t.seconds);
  }
  const auto beta = nonnegative_least_squares(x, y);
  Hardware h;
  h.name = "fit";
  h.compute_flops = rate(beta[0]);
  h.attention_efficiency = rate(beta[1]) / h.compute_flops;
  h.memory_bandwidth = rate(beta[2]);
  h.step_overhead_seconds = beta[3];
  return h;
}

// A GPU's form (Hardware::gemm_roofline): t = max(GEMM FLOPs / C, weights / B) + attention
// FLOPs / C_attn + KV / B_kv + decodes x c_dec + overhead. Nonlinear in the max, so it is
// fitted by alternating: with each step labelled compute- or weight-bound the form is linear
// (least squares as above); the fit relabels the steps and repeats until the labels hold.
// On an H100, fitted on the engine steps of 1,024 x (512 + 128) requests, it predicted the
// throughput of 512 x (1,024 + 512) within +2.0% where the sum form erred by +6.4%
// (docs/BENCHMARKS.md).
// Nothing where the labels leave the system singular (every step weight-bound, say).
std::optional<Hardware> fit_roofline_from(const std::vector<StepTerms>& terms,
                                          std::vector<bool> compute_bound) {
  std::vector<double> beta;
  for (int iteration = 0; iteration < 50; ++iteration) {
    std::vector<std::vector<double>> x;
    std::vector<double> y;
    for (size_t i = 0; i < terms.size(); ++i) {
      const StepTerms& t = terms[i];
      x.push_back({compute_bound[i] ? t.gemm : 0.0, t.attention, compute_bound[i] ? 0.0 : t.weights,
                   t.kv, t.decodes, 1.0});
      y.push_back(t.seconds);
    }
    try {
      beta = nonnegative_least_squares(x, y);
    } catch (const Error&) {
      return std::nullopt;
    }
    bool changed = false;
    for (size_t i = 0; i < terms.size(); ++i) {
      const bool now = beta[0] * terms[i].gemm > beta[2] * terms[i].weights;
      changed |= now != compute_bound[i];
      compute_bound[i] = now;
    }
    if (!changed) break;
  }
  Hardware h;
  h.name = "fit";
  h.gemm_roofline = true;
  h.compute_flops = rate(beta[0]);
  h.attention_efficiency = rate(beta[1]) / h.compute_flops;
  h.memory_bandwidth = rate(beta[2]);
  h.kv_bandwidth = rate(beta[3]);
  h.per_decode_seconds = beta[4];
  h.step_overhead_seconds = beta[5];
  return h;
}

}  // namespace

HardwareFit fit_hardware(const ModelShape& shape, const std::vector<MeasuredStep>& steps,
                         double per_logit_row_seconds, bool device_argmax, int64_t dense_row_tile) {
  if (steps.size() < 4) throw Error("profile: at least 4 steps are needed to fit the cost model");
  Hardware unit;
  unit.name = "unit";
  unit.compute_flops = unit.memory_bandwidth = unit.network_bandwidth = unit.memory_bytes = 1;
  unit.dense_row_tile = dense_row_tile;
  const CostModel unit_model(shape, unit);  // compute/memory seconds at 1 FLOP/s, 1 B/s
  const double weights =
      static_cast<double>(shape.weight_bytes) / static_cast<double>(shape.tensor_parallel);
  std::vector<StepTerms> terms;
  for (const MeasuredStep& m : steps) {
    StepShape without = m.shape;
    without.prefill_attention_pairs = 0;
    const StepCost all = unit_model.estimate_step(m.shape);
    const double gemm = unit_model.estimate_step(without).compute_seconds;
    const double rows = m.shape.logit_rows < 0
                            ? static_cast<double>(m.shape.prefill_tokens + m.shape.decode_tokens)
                            : static_cast<double>(m.shape.logit_rows);
    const bool rows_on_device = m.shape.device_draws && device_argmax;
    terms.push_back({.gemm = gemm,
                     .attention = all.compute_seconds - gemm,
                     .weights = weights,
                     .kv = all.memory_seconds - weights,
                     .decodes = static_cast<double>(m.shape.decode_tokens),
                     .seconds = m.seconds - (rows_on_device ? 0.0 : rows * per_logit_row_seconds)});
  }
  // Both forms; the roofline's (six coefficients to the sum's four) only where the information
  // criterion says its better fit is worth them: a tie, as when no step is weight-bound and
  // both forms fit exactly, keeps the sum.
  Hardware sum = fit_sum(terms);
  sum.per_logit_row_seconds = per_logit_row_seconds;
  sum.device_argmax = device_argmax;
  sum.dense_row_tile = dense_row_tile;
  FormFit best = finish_fit(shape, steps, sum, 4);
  // The roofline's labels start from the sum's rates, and apart from every step compute-bound
  // (the alternation finds a local optimum): the better of the two competes.
  std::vector<bool> from_sum(terms.size());
  for (size_t i = 0; i < terms.size(); ++i)
    from_sum[i] = terms[i].gemm / sum.compute_flops > terms[i].weights / sum.memory_bandwidth;
  for (const std::vector<bool>& labels : {from_sum, std::vector<bool>(terms.size(), true)}) {
    std::optional<Hardware> roofline = fit_roofline_from(terms, labels);
    if (!roofline) continue;
    roofline->per_logit_row_seconds = per_logit_row_seconds;
    roofline->device_argmax = device_argmax;
    roofline->dense_row_tile = dense_row_tile;
    const FormFit candidate = finish_fit(shape, steps, *roofline, 6);
    if (candidate.bic < best.bic) best = candidate;
  }
  return best.fit;
}

int64_t fit_row_tile(const std::vector<std::pair<int64_t, double>>& sizes,
                     std::span<const int64_t> candidates) {
  if (sizes.size() < 4) return 1;
  // Least squares of t = a + b x the rows charged (Hardware::rows_charged) per tile, and its
  // information criterion with the tile a parameter, plus - 2 ln(prior) with half the prior on no
  // tile and half spread over the candidates (2 ln K more for a tile). Without that prior the
  // pick among 7 tiles found one in a line under 3% noise in 18 draws of 200 over the sizes a
  // profile scans, 4 with it (profile_test).
  const double tile_prior =
      2 * std::log(static_cast<double>(std::max<size_t>(1, candidates.size())));
  const double n = static_cast<double>(sizes.size());
  auto score = [&](int64_t tile) {
    Hardware tiled;
    tiled.dense_row_tile = tile;
    std::vector<std::vector<double>> x;
    std::vector<double> y;
    double mean = 0;
    for (const auto& [tokens, seconds] : sizes) {
      x.push_back({1.0, tiled.rows_charged(static_cast<double>(tokens))});
      y.push_back(seconds);
      mean += seconds / n;
    }
    const std::vector<double> beta = least_squares(x, y);
    double squares = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double r = beta[0] + beta[1] * x[i][1] - y[i];
      squares += r * r;
    }
    return tile > 1 ? information_criterion(squares, n, mean, 3) + tile_prior
                    : information_criterion(squares, n, mean, 2);
  };
  int64_t best = 1;
  double best_score = score(1);
  for (const int64_t tile : candidates) {
    if (tile <= 1) continue;
    if (const double s = score(tile); s < best_score) {
      best = tile;
      best_score = s;
    }
  }
  return best;
}

BackendProfile profile_backend(Backend& backend, const ModelShape& shape,
                               const ProfileOptions& options) {
  const ModelConfig& config = backend.config();
  const int64_t page_size = options.page_size;
  const auto clock = options.clock ? options.clock : seconds_now;
  // The median seconds of `options.reps` runs of `work`, after one run that warms up.
  auto median_seconds = [&](const auto& work) {
    work();
    std::vector<double> t;
    for (int r = 0; r < options.reps; ++r) {
      const double t0 = clock();
      work();
      t.push_back(clock() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  // A backend that takes plain-greedy argmaxes on its device (forward_argmax) is timed that
  // way, as the engine runs greedy steps on it; what a step that samples on the host pays more
  // (its logits' download) is added to the per-row host cost below.
  std::vector<float> logits;
  std::vector<TokenId> argmax_tokens;
  std::optional<bool> device_argmax;
  auto forward_once = [&](const ForwardBatch& batch, bool argmax) {
    const size_t rows = static_cast<size_t>(batch.num_logit_rows());
    if (argmax) {
      argmax_tokens.resize(rows);
      return backend.forward_argmax(batch, argmax_tokens);
    }
    logits.resize(rows * static_cast<size_t>(config.vocab_size));
    backend.forward(batch, logits);
    return true;
  };
  auto time_batch = [&](const ForwardBatch& batch) {
    if (!device_argmax) device_argmax = forward_once(batch, true);
    return median_seconds([&] { forward_once(batch, *device_argmax); });
  };
  // Every point's pages start from page 0 (synthetic_batch).
  BackendProfile out;
  // Prompts of n tokens, one alone and several together: both kinds are needed to tell the
  // GEMMs (tokens) from prefill attention (tokens x prompt length) apart.
  auto prefill_point = [&](int64_t prompts, int64_t n) {
    const int64_t pages_per_prompt = (n + page_size - 1) / page_size;
    if (prompts * pages_per_prompt > backend.num_pages()) return;
    const ForwardBatch b = synthetic_batch(prompts, static_cast<int32_t>(n), 0, page_size);
    out.points.push_back({"prefill", prompts, prompts * n, 0, step_shape(b), time_batch(b), 0});
  };
  for (int64_t n : options.prefill_tokens) prefill_point(1, n);
  for (const auto& [prompts, n] : options.prefill_batches) prefill_point(prompts, n);
  ForwardBatch widest_decode;  // the decode point with the most rows, for the download cost
  for (int64_t seqs : options.decode_sequences)
    for (int64_t ctx : options.decode_contexts) {
      const int64_t pages_per_seq = (ctx + 1 + page_size - 1) / page_size;
      if (seqs * (ctx + 1) > options.max_kv_tokens || seqs * pages_per_seq > backend.num_pages())
        continue;
      ForwardBatch b = synthetic_batch(seqs, 1, static_cast<int32_t>(ctx), page_size);
      out.points.push_back(
          {"decode", seqs, seqs, seqs * (ctx + 1), step_shape(b), time_batch(b), 0});
      if (b.num_logit_rows() > widest_decode.num_logit_rows()) widest_decode = std::move(b);
    }
  if (out.points.size() < 4) throw Error("profile: too few steps fit in the KV memory");
  // The scan of step sizes (ProfileOptions::dense_scan_anchors): anchor + c and anchor + c + 1,
  // its row tile fitted on the scan alone (steps of one kind, so that nothing else the cost
  // model gets wrong is taken for a tile). The rates are fitted on the other points with that
  // tile, as they were before the scan; the scan's points are estimated beside them, out of
  // sample.
  std::set<int64_t> scan;
  for (const int64_t anchor : options.dense_scan_anchors)
    for (const int64_t c : options.row_tile_candidates)
      for (const int64_t size : {anchor, anchor + 1, anchor + c, anchor + c + 1}) scan.insert(size);
  std::vector<std::pair<int64_t, double>> scanned;
  for (const int64_t tokens : scan) {
    const ForwardBatch b = scan_prompts(tokens, page_size);
    if (b.chunks.back().block_table.back() >= backend.num_pages()) continue;
    out.points.push_back({"dense", static_cast<int64_t>(b.chunks.size()), tokens, 0, step_shape(b),
                          time_batch(b), 0});
    scanned.emplace_back(tokens, out.points.back().measured_seconds);
  }
  const int64_t row_tile = fit_row_tile(scanned, options.row_tile_candidates);

  std::vector<MeasuredStep> measured;
  for (const ProfilePoint& p : out.points)
    if (p.kind != "dense") measured.push_back({p.shape, p.measured_seconds});
  // Forward passes only: the sampler's time is measured below, apart.
  const HardwareFit fit = fit_hardware(shape, measured, 0.0, false, row_tile);
  out.hardware = fit.hardware;
  out.hardware.device_argmax = device_argmax.value_or(false);
  out.hardware.name = "profile:" + backend.name();
  out.mean_abs_error = fit.mean_abs_error;
  out.max_abs_error = fit.max_abs_error;
  const CostModel fitted(shape, [&] {
    Hardware h = out.hardware;
    h.memory_bytes = 1;
    return h;
  }());
  for (ProfilePoint& p : out.points)
    p.estimated_seconds = fitted.estimate_step(p.shape).sequential();

  // Host work per sampled row (the sampler over the whole vocabulary): paid by the engine
  // outside the forward pass, on every step.
  {
    std::vector<float> row(static_cast<size_t>(config.vocab_size));
    for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>((i * 2654435761u) % 1000);
    SamplingParams greedy;
    greedy.temperature = 0;
    constexpr int kRows = 64;
    const double t0 = clock();
#pragma omp parallel for schedule(dynamic, 1)  // as the engine samples its rows
    for (int r = 0; r < kRows; ++r) (void)sample_token(row, greedy, 1, r);
    out.hardware.per_logit_row_seconds = (clock() - t0) / kRows;
    // A device-argmax backend's host-sampled steps also move their logits: forward() against
    // forward_argmax() on the widest decode step, per row.
    if (out.hardware.device_argmax && widest_decode.num_logit_rows() > 0) {
      const double with_logits = median_seconds([&] { forward_once(widest_decode, false); });
      const double on_device = median_seconds([&] { forward_once(widest_decode, true); });
      out.hardware.per_logit_row_seconds += std::max(0.0, with_logits - on_device) /
                                            static_cast<double>(widest_decode.num_logit_rows());
    }
  }

  // BROS's swap line (§4.1): restoring checkpointed pages, timed as whole pages of slots written
  // back from a host image (a restore writes at most that much per page).
  {
    std::vector<std::byte> image(static_cast<size_t>(backend.kv_bytes_per_page()));
    std::vector<std::vector<double>> xs;
    std::vector<double> ys;
    for (int64_t pages : {int64_t{1}, int64_t{4}, int64_t{16}, int64_t{64}}) {
      if (pages > backend.num_pages()) break;
      xs.push_back({1.0, static_cast<double>(pages)});
      ys.push_back(median_seconds([&] {
        for (int64_t p = 0; p < pages; ++p)
          backend.write_slots(static_cast<PageId>(p), 0, static_cast<int32_t>(page_size),
                              image.data());
      }));
    }
    if (xs.size() >= 2) {
      const auto f = nonnegative_least_squares(xs, ys);
      out.iteration.swap_base = f[0];
      out.iteration.swap_per_page = f[1];
    }
  }

  // BROS iteration model, per phase.
  std::vector<std::vector<double>> xp, xd;
  std::vector<double> yp, yd;
  for (const ProfilePoint& p : out.points) {
    if (p.kind == "prefill") {
      xp.push_back({1.0, static_cast<double>(p.tokens), static_cast<double>(p.tokens * p.tokens)});
      yp.push_back(p.measured_seconds);
    } else if (p.kind == "decode") {
      xd.push_back({1.0, static_cast<double>(p.tokens), static_cast<double>(p.context)});
      yd.push_back(p.measured_seconds);
    }
  }
  if (xp.size() >= 3) {
    // Linear in tokens as BROS fits it; the quadratic column only soaks up attention.
    const auto f = least_squares(xp, yp);
    out.iteration.prefill_base = std::max(0.0, f[0]);
    out.iteration.prefill_per_token = std::max(0.0, f[1] + f[2] * 512);
  }
  if (xd.size() >= 3) {
    const auto f = least_squares(xd, yd);
    out.iteration.decode_base = std::max(0.0, f[0]);
    out.iteration.decode_per_token = std::max(0.0, f[1]);
    out.iteration.decode_per_context_token = std::max(0.0, f[2]);
  }
  return out;
}

}  // namespace blend
