#include "blocks/stitch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "backend/cpu/gemm.h"
#include "blocks/equivalence.h"
#include "core/error.h"
#include "core/forward_batch.h"
#include "model/safetensors.h"

namespace blend {
namespace {

// Every prompt as one prefill chunk of model 0 from position 0, pages numbered in order.
ForwardBatch prompt_batch(const std::vector<std::vector<TokenId>>& prompts, int64_t page_size) {
  ForwardBatch batch;
  PageId next = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SeqChunk c;
    c.seq = static_cast<SeqId>(i + 1);
    c.num_tokens = static_cast<int32_t>(prompts[i].size());
    c.token_offset = batch.num_tokens();
    for (int64_t p = 0; p * page_size < c.num_tokens; ++p) c.block_table.push_back(next++);
    for (int32_t t = 0; t < c.num_tokens; ++t) {
      batch.tokens.push_back(prompts[i][static_cast<size_t>(t)]);
      batch.positions.push_back(t);
    }
    batch.chunks.push_back(std::move(c));
  }
  return batch;
}

// The residual stream of `backend`'s model over `batch` after each of `ends` layers (an end of 0
// is the embedding), by running the layers in segments.
std::map<int64_t, std::vector<float>> streams(CpuBackend& backend, const ForwardBatch& batch,
                                              const std::set<int64_t>& ends) {
  const auto size = static_cast<size_t>(batch.num_tokens() * backend.config().hidden_size);
  std::map<int64_t, std::vector<float>> out;
  std::vector<float> x;
  int64_t at = 0;
  for (int64_t end : ends) {
    std::vector<float> y(size);
    backend.forward_layers(batch, at, end, x, y, {});
    x = y;
    at = end;
    out[end] = std::move(y);
  }
  return out;
}

// The tail model's logit lens in f32: its final RMSNorm and lm_head applied to a stream, and the
// gradient of a loss on the logits back to the stream.
class Lens {
 public:
  Lens(const ModelConfig& config, const TensorStore& weights)
      : gemm_({.compute = DType::kF32, .lib = cpu::GemmLib::kOneDnn, .row_tile = 0}),
        width_(config.hidden_size),
        vocab_(config.vocab_size),
        eps_(static_cast<float>(config.rms_norm_eps)) {
    const TensorView& norm = weights.get("model.norm.weight", {width_});
    for (int64_t i = 0; i < width_; ++i) norm_.push_back(norm.at(i));
    const TensorView& head =
        weights.get(config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                    {vocab_, width_});
    forward_ = std::make_unique<cpu::Linear>(gemm_, std::vector<const TensorView*>{&head});
    // lm_head^T [width x vocab], so that a row of logit gradients times it is a call too.
    transposed_.resize(static_cast<size_t>(vocab_ * width_));
#pragma omp parallel for schedule(static)
    for (int64_t v = 0; v < vocab_; ++v)
      for (int64_t i = 0; i < width_; ++i)
        transposed_[static_cast<size_t>(i * vocab_ + v)] = head.at(v * width_ + i);
    TensorView t{.name = "lm_head^T",
                 .dtype = DType::kF32,
                 .shape = {width_, vocab_},
                 .data = reinterpret_cast<const std::byte*>(transposed_.data()),
                 .nbytes = transposed_.size() * 4};
    backward_ = std::make_unique<cpu::Linear>(gemm_, std::vector<const TensorView*>{&t});
  }

  int64_t vocab() const {
    return vocab_;
  }
  int64_t padded(int64_t rows) const {
    return gemm_.padded_rows(rows);
  }

  // logits [padded(rows) x vocab] of the stream s [rows x width]; normed [padded x width] keeps
  // the norm's output and inv_rms [rows] its scale, for backward() (why this is not
  // cpu::rmsnorm, which keeps no scale).
  void forward(const float* s, int64_t rows, std::vector<float>& normed,
               std::vector<float>& inv_rms, std::vector<float>& logits) {
    normed.assign(static_cast<size_t>(padded(rows) * width_), 0.0f);
    inv_rms.resize(static_cast<size_t>(rows));
    logits.resize(static_cast<size_t>(padded(rows) * vocab_));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = s + r * width_;
      double sq = 0;
      for (int64_t i = 0; i < width_; ++i) sq += static_cast<double>(x[i]) * x[i];
      const auto inv = static_cast<float>(1 / std::sqrt(sq / static_cast<double>(width_) + eps_));
      inv_rms[static_cast<size_t>(r)] = inv;
      for (int64_t i = 0; i < width_; ++i)
        normed[static_cast<size_t>(r * width_ + i)] = x[i] * inv * norm_[static_cast<size_t>(i)];
    }
    forward_->forward(normed.data(), rows, logits.data());
  }

  // The gradient with respect to the stream s, from the logits' gradient (overwritten:
  // [padded x vocab]) and forward()'s normed and inv_rms; grad_s [rows x width].
  void backward(std::vector<float>& grad_logits, const std::vector<float>& normed,
                const std::vector<float>& inv_rms, int64_t rows, std::vector<float>& grad_s) {
    std::vector<float> grad_normed(static_cast<size_t>(padded(rows) * width_));
    std::fill(grad_logits.begin() + rows * vocab_, grad_logits.end(), 0.0f);
    backward_->forward(grad_logits.data(), rows, grad_normed.data());
    grad_s.resize(static_cast<size_t>(rows * width_));
    // n = g * s * inv, inv = (mean(s^2) + eps)^-1/2: ds = inv * (g * dn - s_hat * mean(g * dn *
    // s_hat)), s_hat = s * inv.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = inv_rms[static_cast<size_t>(r)];
      double dot = 0;
      for (int64_t i = 0; i < width_; ++i) {
        const size_t k = static_cast<size_t>(r * width_ + i);
        // s_hat_i = normed_i / g_i; g * dn * s_hat = dn * normed.
        dot += static_cast<double>(grad_normed[k]) * normed[k];
      }
      const auto mean = static_cast<float>(dot / static_cast<double>(width_));
      for (int64_t i = 0; i < width_; ++i) {
        const size_t k = static_cast<size_t>(r * width_ + i);
        const float g = norm_[static_cast<size_t>(i)];
        const float s_hat = normed[k] / g;
        grad_s[k] = inv * (g * grad_normed[k] - s_hat * mean);
      }
    }
  }

 private:
  cpu::GemmContext gemm_;
  int64_t width_, vocab_;
  float eps_;
  std::vector<float> norm_, transposed_;
  std::unique_ptr<cpu::Linear> forward_, backward_;
};

// Log-softmax of each of `rows` rows of `logits` in place.
void log_softmax_rows(float* logits, int64_t rows, int64_t vocab) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = logits + r * vocab;
    const float mx = *std::max_element(row, row + vocab);
    double z = 0;
    for (int64_t v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(row[v] - mx));
    const auto shift = static_cast<float>(mx + std::log(z));
    for (int64_t v = 0; v < vocab; ++v) row[v] -= shift;
  }
}

// Solves (A + ridge I) w = b for symmetric positive definite A [n x n], b [n x k] (both
// row-major, double) by Cholesky; returns w [n x k].
std::vector<double> solve_normal_equations(std::vector<double> a, const std::vector<double>& b,
                                           int64_t n, int64_t k) {
  for (int64_t j = 0; j < n; ++j) {
    double d = a[static_cast<size_t>(j * n + j)];
    for (int64_t p = 0; p < j; ++p)
      d -= a[static_cast<size_t>(j * n + p)] * a[static_cast<size_t>(j * n + p)];
    if (!(d > 0)) throw Error("stitch: the least-squares system is singular (raise --ridge)");
    const double l = std::sqrt(d);
    a[static_cast<size_t>(j * n + j)] = l;
#pragma omp parallel for schedule(static)
    for (int64_t i = j + 1; i < n; ++i) {
      double s = a[static_cast<size_t>(i * n + j)];
      for (int64_t p = 0; p < j; ++p)
        s -= a[static_cast<size_t>(i * n + p)] * a[static_cast<size_t>(j * n + p)];
      a[static_cast<size_t>(i * n + j)] = s / l;
    }
  }
  std::vector<double> w = b;  // forward then backward substitution, column by column of b
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < k; ++c) {
    for (int64_t i = 0; i < n; ++i) {
      double s = w[static_cast<size_t>(i * k + c)];
      for (int64_t p = 0; p < i; ++p)
        s -= a[static_cast<size_t>(i * n + p)] * w[static_cast<size_t>(p * k + c)];
      w[static_cast<size_t>(i * k + c)] = s / a[static_cast<size_t>(i * n + i)];
    }
    for (int64_t i = n - 1; i >= 0; --i) {
      double s = w[static_cast<size_t>(i * k + c)];
      for (int64_t p = i + 1; p < n; ++p)
        s -= a[static_cast<size_t>(p * n + i)] * w[static_cast<size_t>(p * k + c)];
      w[static_cast<size_t>(i * k + c)] = s / a[static_cast<size_t>(i * n + i)];
    }
  }
  return w;
}

// One point's calibration data: the head's stream (rows x in) and the tail's (rows x out).
struct PointData {
  StitchPoint point;
  std::vector<float> x, y;
};

// Rows `picked` of a [rows x width] matrix, in that order.
std::vector<float> gather_rows(const std::vector<float>& m, int64_t width,
                               const std::vector<int64_t>& picked) {
  std::vector<float> out(picked.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < picked.size(); ++i)
    std::memcpy(out.data() + i * static_cast<size_t>(width), m.data() + picked[i] * width,
                static_cast<size_t>(width) * 4);
  return out;
}

void check_points(const StitchModels& models, const std::vector<StitchPoint>& points) {
  if (points.empty()) throw Error("stitch: no stitching point");
  const int64_t lh = models.head->config().num_layers, lt = models.tail->config().num_layers;
  for (const StitchPoint& p : points)
    if (p.head_layer < 0 || p.head_layer >= lh || p.tail_layer < 0 || p.tail_layer >= lt)
      throw Error("stitch: point (head layer " + std::to_string(p.head_layer) + ", tail layer " +
                  std::to_string(p.tail_layer) + ") is outside the models (head layers 0.." +
                  std::to_string(lh - 1) + ", tail layers 0.." + std::to_string(lt - 1) + ")");
}

void check_models(const StitchModels& models, const std::vector<std::vector<TokenId>>& prompts) {
  if (!models.head || !models.tail || !models.tail_weights)
    throw Error("stitch: a model is missing");
  if (models.head->config().vocab_size != models.tail->config().vocab_size)
    throw Error("stitch: the head model's vocabulary (" +
                std::to_string(models.head->config().vocab_size) + ") differs from the tail's (" +
                std::to_string(models.tail->config().vocab_size) + ")");
  if (prompts.empty()) throw Error("stitch: no calibration prompt");
  for (const auto& p : prompts)
    if (p.empty()) throw Error("stitch: an empty calibration prompt");
  const int64_t pages = stitch_pages(prompts, models.page_size);
  for (const CpuBackend* b : {models.head, models.tail})
    if (b->num_pages() < pages)
      throw Error("stitch: the prompts need " + std::to_string(pages) +
                  " KV pages at once, a backend has " + std::to_string(b->num_pages()));
}

}  // namespace

int64_t stitch_pages(const std::vector<std::vector<TokenId>>& prompts, int64_t page_size) {
  int64_t pages = 0;
  for (const auto& p : prompts)
    pages += (static_cast<int64_t>(p.size()) + page_size - 1) / page_size;
  return pages;
}

std::vector<StitchPoint> proportional_stitch_points(int64_t head_layers, int64_t tail_layers,
                                                    int64_t count) {
  if (count < 1) throw Error("stitch: at least one stitching point");
  if (head_layers < 2 || tail_layers < 2)
    throw Error("stitch: both models need at least 2 layers to stitch between");
  std::vector<StitchPoint> points;
  for (int64_t k = 1; k <= count; ++k) {
    const int64_t head = std::clamp<int64_t>(k * head_layers / (count + 1) - 1, 0, head_layers - 2);
    const auto tail = std::clamp<int64_t>(
        std::llround(static_cast<double>(head + 1) * static_cast<double>(tail_layers) /
                     static_cast<double>(head_layers)),
        1, tail_layers - 1);
    if (points.empty() || points.back().head_layer != head) points.push_back({head, tail});
  }
  return points;
}

void StitchBlock::apply(std::span<const float> x, double position, std::span<float> y) const {
  const auto rows = static_cast<int64_t>(x.size()) / in;
  if (static_cast<int64_t>(x.size()) != rows * in || static_cast<int64_t>(y.size()) != rows * out)
    throw Error("stitch: apply on " + std::to_string(x.size()) + " inputs and " +
                std::to_string(y.size()) + " outputs, widths " + std::to_string(in) + " -> " +
                std::to_string(out));
  const int64_t cols = in + 2;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const float* w = weight.data() + o * cols;
      double s = w[in] * position + w[in + 1];
      for (int64_t a = 0; a < in; ++a)
        s += static_cast<double>(w[a]) * x[static_cast<size_t>(r * in + a)];
      y[static_cast<size_t>(r * out + o)] = static_cast<float>(s);
    }
}

void StitchBlock::save(const std::filesystem::path& path) const {
  TensorToWrite t{.name = "stitch.weight", .dtype = DType::kF32, .shape = {out, in + 2}};
  t.fill = [this](size_t offset, std::span<std::byte> bytes) {
    std::memcpy(bytes.data(), reinterpret_cast<const std::byte*>(weight.data()) + offset,
                bytes.size());
  };
  write_safetensors(path, {t}, {{"format", "pt"}, {"blend", "stitching block (BlockLLM 4.4)"}});
}

StitchBlock StitchBlock::load(const std::filesystem::path& path) {
  const auto file = SafetensorsFile::open(path);
  const auto it = file->tensors().find("stitch.weight");
  if (it == file->tensors().end())
    throw Error(path.string() + ": no tensor stitch.weight (not a stitching block)");
  const TensorView& t = it->second;
  if (t.dtype != DType::kF32 || t.shape.size() != 2 || t.shape[1] < 3)
    throw Error(path.string() + ": stitch.weight must be f32 [out, in + 2]");
  StitchBlock s{.in = t.shape[1] - 2, .out = t.shape[0], .weight = {}};
  s.weight.resize(static_cast<size_t>(t.numel()));
  std::memcpy(s.weight.data(), t.data, t.nbytes);
  return s;
}

StitchBlock train_stitch(const StitchModels& models,
                         const std::vector<std::vector<TokenId>>& prompts,
                         const StitchOptions& options, std::vector<StitchStage>* stages) {
  check_models(models, prompts);
  check_points(models, options.points);
  if (options.steps_per_stage < 0) throw Error("stitch: --steps must not be negative");
  if (options.rows_per_step < 1) throw Error("stitch: --rows-per-step must be at least 1");
  if (!(options.learning_rate > 0 && std::isfinite(options.learning_rate)))
    throw Error("stitch: the learning rate must be positive and finite");
  if (!(options.ridge >= 0 && std::isfinite(options.ridge)))
    throw Error("stitch: the ridge term must be non-negative and finite");
  std::vector<StitchPoint> points = options.points;
  std::sort(points.begin(), points.end(),
            [](const StitchPoint& a, const StitchPoint& b) { return a.position() < b.position(); });

  const ForwardBatch batch = prompt_batch(prompts, models.page_size);
  const int64_t rows = batch.num_tokens();
  const int64_t in = models.head->config().hidden_size, out = models.tail->config().hidden_size;
  std::set<int64_t> head_ends, tail_ends;
  for (const StitchPoint& p : points) {
    head_ends.insert(p.head_layer + 1);
    tail_ends.insert(p.tail_layer);
  }
  auto head_streams = streams(*models.head, batch, head_ends);
  auto tail_streams = streams(*models.tail, batch, tail_ends);

  // Least squares over every point's rows: z = [x, position, 1], W^T = (Z^T Z + ridge)^-1 Z^T Y.
  const int64_t cols = in + 2;
  std::vector<double> zz(static_cast<size_t>(cols * cols)), zy(static_cast<size_t>(cols * out));
  for (const StitchPoint& p : points) {
    const std::vector<float>& x = head_streams.at(p.head_layer + 1);
    const std::vector<float>& y = tail_streams.at(p.tail_layer);
    auto z = [&](int64_t r, int64_t c) -> double {
      return c < in ? x[static_cast<size_t>(r * in + c)] : c == in ? p.position() : 1.0;
    };
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) {
        const double zc = z(r, c);
        for (int64_t d = 0; d <= c; ++d) zz[static_cast<size_t>(c * cols + d)] += zc * z(r, d);
        for (int64_t o = 0; o < out; ++o)
          zy[static_cast<size_t>(c * out + o)] += zc * y[static_cast<size_t>(r * out + o)];
      }
    }
  }
  double mean_square = 0;
  for (int64_t c = 0; c < in; ++c) mean_square += zz[static_cast<size_t>(c * cols + c)];
  mean_square /= static_cast<double>(in * rows * static_cast<int64_t>(points.size()));
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t d = 0; d < c; ++d)
      zz[static_cast<size_t>(d * cols + c)] = zz[static_cast<size_t>(c * cols + d)];
    zz[static_cast<size_t>(c * cols + c)] +=
        std::max(options.ridge * mean_square * static_cast<double>(rows), 1e-12);
  }
  const std::vector<double> wt = solve_normal_equations(zz, zy, cols, out);
  StitchBlock stitch{
      .in = in, .out = out, .weight = std::vector<float>(static_cast<size_t>(out * cols))};
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t o = 0; o < out; ++o)
      stitch.weight[static_cast<size_t>(o * cols + c)] =
          static_cast<float>(wt[static_cast<size_t>(c * out + o)]);
  if (options.steps_per_stage == 0) return stitch;

  // Adam on the tail's lens KL, shallow point first, each stage adding the next deeper point.
  // Each step takes rows_per_step random rows of every point trained so far; the stages' losses
  // are measured on fixed rows (the first up to kReportRows).
  Lens lens(models.tail->config(), *models.tail_weights);
  const int64_t vocab = lens.vocab();
  std::vector<PointData> data;
  for (const StitchPoint& p : points)
    data.push_back({.point = p,
                    .x = std::move(head_streams.at(p.head_layer + 1)),
                    .y = tail_streams.at(p.tail_layer)});
  std::vector<float> m(stitch.weight.size()), v(stitch.weight.size()), grad(stitch.weight.size());
  std::vector<float> s, normed, inv, logits, target, grad_s;
  // Mean KL over rows `picked` of the points [0, active), and (when `backprop`) its gradient in
  // `grad`.
  auto loss = [&](size_t active, const std::vector<int64_t>& picked, bool backprop) {
    const auto n = static_cast<int64_t>(picked.size());
    double kl = 0;
    if (backprop) std::fill(grad.begin(), grad.end(), 0.0f);
    const double scale = 1.0 / static_cast<double>(n * static_cast<int64_t>(active));
    s.resize(static_cast<size_t>(n * out));
    for (size_t i = 0; i < active; ++i) {
      const PointData& d = data[i];
      const std::vector<float> x = gather_rows(d.x, in, picked), y = gather_rows(d.y, out, picked);
      lens.forward(y.data(), n, normed, inv, target);
      log_softmax_rows(target.data(), n, vocab);
      stitch.apply(x, d.point.position(), s);
      lens.forward(s.data(), n, normed, inv, logits);
      log_softmax_rows(logits.data(), n, vocab);
      double point_kl = 0;
#pragma omp parallel for schedule(static) reduction(+ : point_kl)
      for (int64_t r = 0; r < n; ++r) {
        float* log_q = logits.data() + r * vocab;
        const float* log_p = target.data() + r * vocab;
        for (int64_t k = 0; k < vocab; ++k) {
          const double p = std::exp(static_cast<double>(log_p[k]));
          point_kl += p * (log_p[k] - log_q[k]);
          log_q[k] = static_cast<float>((std::exp(static_cast<double>(log_q[k])) - p) *
                                        scale);  // now dKL/dlogit
        }
      }
      kl += point_kl * scale;
      if (!backprop) continue;
      lens.backward(logits, normed, inv, n, grad_s);
#pragma omp parallel for schedule(static)
      for (int64_t o = 0; o < out; ++o) {
        float* g = grad.data() + o * cols;
        for (int64_t r = 0; r < n; ++r) {
          const float gs = grad_s[static_cast<size_t>(r * out + o)];
          const float* xr = x.data() + r * in;
          for (int64_t a = 0; a < in; ++a) g[a] += gs * xr[a];
          g[in] += gs * static_cast<float>(d.point.position());
          g[in + 1] += gs;
        }
      }
    }
    return kl;
  };
  constexpr int64_t kReportRows = 512;
  std::vector<int64_t> report_rows(static_cast<size_t>(std::min(rows, kReportRows)));
  for (size_t i = 0; i < report_rows.size(); ++i) report_rows[i] = static_cast<int64_t>(i);
  std::vector<int64_t> all(static_cast<size_t>(rows)), picked;
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  std::mt19937_64 rng(options.seed);
  constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEpsilon = 1e-8;  // Adam's defaults
  // Adam moves every weight by about its step size whatever the gradient's size, so the step is
  // set relative to the least-squares weights' RMS (a width-free scale).
  double sum_squares = 0;
  for (float w : stitch.weight) sum_squares += static_cast<double>(w) * w;
  const double step_size =
      options.learning_rate * std::sqrt(sum_squares / static_cast<double>(stitch.weight.size()));
  int64_t t = 0;
  for (size_t stage = 0; stage < data.size(); ++stage) {
    StitchStage report{.point = data[stage].point,
                       .kl_before = loss(stage + 1, report_rows, false)};
    const std::vector<float> start = stitch.weight;
    for (int64_t step = 0; step < options.steps_per_stage; ++step) {
      if (options.rows_per_step >= rows) {
        picked = all;
      } else {  // a partial Fisher-Yates shuffle: rows_per_step distinct rows
        for (int64_t i = 0; i < options.rows_per_step; ++i)
          std::swap(all[static_cast<size_t>(i)],
                    all[static_cast<size_t>(
                        i + static_cast<int64_t>(rng() % static_cast<uint64_t>(rows - i)))]);
        picked.assign(all.begin(), all.begin() + options.rows_per_step);
      }
      loss(stage + 1, picked, true);
      ++t;
      const double c1 = 1 - std::pow(kBeta1, static_cast<double>(t)),
                   c2 = 1 - std::pow(kBeta2, static_cast<double>(t));
      for (size_t i = 0; i < grad.size(); ++i) {
        m[i] = static_cast<float>(kBeta1 * m[i] + (1 - kBeta1) * grad[i]);
        v[i] = static_cast<float>(kBeta2 * v[i] + (1 - kBeta2) * grad[i] * grad[i]);
        stitch.weight[i] -=
            static_cast<float>(step_size * (m[i] / c1) / (std::sqrt(v[i] / c2) + kEpsilon));
      }
    }
    report.kl_after = loss(stage + 1, report_rows, false);
    // A stage that did not lower the loss it follows is undone: near an exact stitch Adam's
    // normalised steps are noise.
    report.kept = report.kl_after < report.kl_before;
    if (!report.kept) {
      stitch.weight = start;
      report.kl_after = report.kl_before;
    }
    if (stages) stages->push_back(report);
  }
  return stitch;
}

std::vector<StitchQuality> evaluate_stitches(const StitchModels& models,
                                             std::span<const StitchCase> cases,
                                             const std::vector<std::vector<TokenId>>& prompts) {
  check_models(models, prompts);
  std::set<int64_t> head_ends;
  for (const StitchCase& c : cases) {
    check_points(models, {c.point});
    if (c.block->in != models.head->config().hidden_size ||
        c.block->out != models.tail->config().hidden_size)
      throw Error("stitch: the block maps width " + std::to_string(c.block->in) + " to " +
                  std::to_string(c.block->out) + ", the models are " +
                  std::to_string(models.head->config().hidden_size) + " and " +
                  std::to_string(models.tail->config().hidden_size) + " wide");
    head_ends.insert(c.point.head_layer + 1);
  }
  const ForwardBatch batch = prompt_batch(prompts, models.page_size);
  const int64_t rows = batch.num_tokens(), vocab = models.tail->config().vocab_size;
  const int64_t layers = models.tail->config().num_layers;
  // The tail's own distributions and the head's streams, once for every case.
  std::vector<float> own(static_cast<size_t>(rows * vocab)), stitched(own.size()),
      scratch(own.size()), s(static_cast<size_t>(rows * models.tail->config().hidden_size));
  models.tail->forward_layers(batch, 0, layers, {}, {}, own);
  const auto head_streams = streams(*models.head, batch, head_ends);

  std::vector<StitchQuality> out;
  std::vector<double> cosines(static_cast<size_t>(rows));
  std::vector<TopTokenAndKl> gaps(static_cast<size_t>(rows));
  for (const StitchCase& c : cases) {
    c.block->apply(head_streams.at(c.point.head_layer + 1), c.point.position(), s);
    models.tail->forward_layers(batch, c.point.tail_layer, layers, s, {}, stitched);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float *a = own.data() + r * vocab, *b = stitched.data() + r * vocab;
      cosines[static_cast<size_t>(r)] = probability_cosine(a, b, vocab, scratch.data() + r * vocab);
      gaps[static_cast<size_t>(r)] = top_token_and_kl(a, b, vocab);
    }
    StitchQuality q{.point = c.point, .positions = rows};
    for (int64_t r = 0; r < rows; ++r) {
      q.cosine += cosines[static_cast<size_t>(r)];
      q.agreement += gaps[static_cast<size_t>(r)].same_top ? 1 : 0;
      q.kl += gaps[static_cast<size_t>(r)].kl;
    }
    q.cosine /= static_cast<double>(rows);
    q.agreement /= static_cast<double>(rows);
    q.kl /= static_cast<double>(rows);
    out.push_back(q);
  }
  return out;
}

StitchQuality evaluate_stitch(const StitchModels& models, const StitchBlock& stitch,
                              const StitchPoint& point,
                              const std::vector<std::vector<TokenId>>& prompts) {
  const StitchCase one{.block = &stitch, .point = point};
  return evaluate_stitches(models, {&one, 1}, prompts).front();
}

}  // namespace blend
