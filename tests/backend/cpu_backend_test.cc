#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <random>

#include <gtest/gtest.h>

#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "core/error.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "test_models.h"
#include "test_util.h"

namespace blend {
namespace {

// ---------------------------------------------------------------------------------------------
// Test models: the "tiny" preset (hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16,
// untied lm_head) and variants of it, generated once per test program.

using testing::TestModel;

const TestModel& model(const std::string& variant, DType dtype = DType::kF32) {
  return testing::test_model(variant, dtype);
}

std::unique_ptr<CpuBackend> make_backend(const TestModel& m, bool deterministic, int page_size = 16,
                                         int64_t num_pages = 256,
                                         CpuGemmLib lib = CpuGemmLib::kOneDnn) {
  BackendOptions o;
  o.deterministic = deterministic;
  o.page_size = page_size;
  o.num_pages = num_pages;
  return make_cpu_backend(m.config, m.store, o, lib);
}

// ---------------------------------------------------------------------------------------------
// The float64 reference: the same layer math written out plainly, one sequence at a time.

class Reference {
 public:
  // `long_factors`: which longrope factors the backend was made to take (model/rope.h).
  explicit Reference(const TestModel& m, bool long_factors = true)
      : c_(m.config), store_(m.store), long_factors_(long_factors) {}

  // Logits of the last token of `tokens` (at positions 0..n-1).
  std::vector<double> logits(const std::vector<TokenId>& tokens) {
    const int64_t n = static_cast<int64_t>(tokens.size()), h = c_.hidden_size, d = c_.head_dim;
    const int64_t nh = c_.num_heads, nkv = c_.num_kv_heads, group = nh / nkv;
    const auto& embed = w("model.embed_tokens.weight");
    std::vector<std::vector<double>> x(n, std::vector<double>(h));
    const GemmaSettings& gm = c_.gemma;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t i = 0; i < h; ++i)
        x[p][i] = embed[tokens[p] * h + i] * (gm.enabled ? std::sqrt(static_cast<double>(h)) : 1.0);
    for (int64_t l = 0; l < c_.num_layers; ++l) {
      // Gemma 3's sliding layers rotate with their own base; Gemma's windows are per layer.
      const bool local = gm.rope_local_theta && gm.sliding_layers[l];
      const int64_t window =
          gm.enabled ? (gm.sliding(l) ? gm.sliding_window : 0) : c_.sliding_window.value_or(0);
      const double scale =
          1.0 / std::sqrt(gm.enabled ? gm.query_pre_attn_scalar : static_cast<double>(d));
      auto name = [&](const char* s) { return layer_tensor_name(l, s); };
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int64_t p = 0; p < n; ++p) {
        const auto xn = rmsnorm(x[p], w(name("input_layernorm.weight")));
        if (c_.fused_checkpoint_projections) {  // Phi-3: rows q, then k, then v
          const auto qkv = matvec(w(name("self_attn.qkv_proj.weight")), xn);
          q[p].assign(qkv.begin(), qkv.begin() + nh * d);
          k[p].assign(qkv.begin() + nh * d, qkv.begin() + (nh + nkv) * d);
          v[p].assign(qkv.begin() + (nh + nkv) * d, qkv.end());
        } else {
          q[p] = matvec(w(name("self_attn.q_proj.weight")), xn);
          k[p] = matvec(w(name("self_attn.k_proj.weight")), xn);
          v[p] = matvec(w(name("self_attn.v_proj.weight")), xn);
        }
        if (c_.attention_bias) {
          add(q[p], w(name("self_attn.q_proj.bias")));
          add(k[p], w(name("self_attn.k_proj.bias")));
          add(v[p], w(name("self_attn.v_proj.bias")));
        }
        if (c_.qk_norm) {  // Qwen3: each head normalized on its own, before RoPE
          norm_heads(q[p], w(name("self_attn.q_norm.weight")));
          norm_heads(k[p], w(name("self_attn.k_norm.weight")));
        }
        for (int64_t hh = 0; hh < nh; ++hh) rope(&q[p][hh * d], p, local);
        for (int64_t hh = 0; hh < nkv; ++hh) rope(&k[p][hh * d], p, local);
      }
      for (int64_t p = 0; p < n; ++p) {
        std::vector<double> out(nh * d, 0.0);
        const int64_t lo = window ? std::max<int64_t>(0, p - window + 1) : 0;
        for (int64_t hh = 0; hh < nh; ++hh) {
          const int64_t g = hh / group;
          std::vector<double> s;
          double mx = -INFINITY;
          for (int64_t j = lo; j <= p; ++j) {
            double dot = 0;
            for (int64_t i = 0; i < d; ++i) dot += q[p][hh * d + i] * k[j][g * d + i];
            s.push_back(dot * scale);
            if (gm.attn_logit_softcapping > 0)
              s.back() =
                  gm.attn_logit_softcapping * std::tanh(s.back() / gm.attn_logit_softcapping);
            mx = std::max(mx, s.back());
          }
          double sum = 0;
          for (double& e : s) sum += (e = std::exp(e - mx));
          for (int64_t j = lo; j <= p; ++j)
            for (int64_t i = 0; i < d; ++i) out[hh * d + i] += s[j - lo] / sum * v[j][g * d + i];
        }
        const auto o = matvec(w(name("self_attn.o_proj.weight")), out);
        add(x[p], gm.enabled ? rmsnorm(o, w(name("post_attention_layernorm.weight"))) : o);
      }
      for (int64_t p = 0; p < n; ++p) {
        const auto xn = rmsnorm(x[p], w(name(gm.enabled ? "pre_feedforward_layernorm.weight"
                                                        : "post_attention_layernorm.weight")));
        std::vector<double> gate, up;
        if (c_.fused_checkpoint_projections) {  // Phi-3: gate rows, then up rows
          const auto gu = matvec(w(name("mlp.gate_up_proj.weight")), xn);
          gate.assign(gu.begin(), gu.begin() + c_.intermediate_size);
          up.assign(gu.begin() + c_.intermediate_size, gu.end());
        } else {
          gate = matvec(w(name("mlp.gate_proj.weight")), xn);
          up = matvec(w(name("mlp.up_proj.weight")), xn);
        }
        std::vector<double> a(gate.size());
        for (size_t i = 0; i < a.size(); ++i) {
          const double g = gate[i];
          a[i] = gm.enabled ? 0.5 * g *
                                  (1 + std::tanh(std::sqrt(2 / std::numbers::pi) *
                                                 (g + 0.044715 * g * g * g))) *
                                  up[i]
                            : g / (1.0 + std::exp(-g)) * up[i];
        }
        const auto down = matvec(w(name("mlp.down_proj.weight")), a);
        add(x[p], gm.enabled ? rmsnorm(down, w(name("post_feedforward_layernorm.weight"))) : down);
      }
    }
    const auto xn = rmsnorm(x[n - 1], w("model.norm.weight"));
    auto logits =
        matvec(w(c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"), xn);
    if (const double cap = gm.final_logit_softcapping; cap > 0)
      for (double& v : logits) v = cap * std::tanh(v / cap);
    return logits;
  }

 private:
  const std::vector<float>& w(const std::string& name) {
    auto& t = weights_[name];
    if (t.empty()) {
      const TensorView& view = store_.get(name);
      t.resize(view.numel());
      for (int64_t i = 0; i < view.numel(); ++i) t[i] = view.at(i);
    }
    return t;
  }
  std::vector<double> rmsnorm(const std::vector<double>& x,
                              const std::vector<float>& weight) const {
    double ss = 0;
    for (double e : x) ss += e * e;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c_.rms_norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = norm_weight(weight[i]) * x[i] * inv;
    return y;
  }
  // Gemma's RMSNorm scales by (1 + w).
  double norm_weight(float w) const { return c_.gemma.enabled ? 1.0 + w : w; }
  void norm_heads(std::vector<double>& x, const std::vector<float>& weight) const {
    const size_t d = weight.size();
    for (size_t start = 0; start + d <= x.size(); start += d) {
      double ss = 0;
      for (size_t i = 0; i < d; ++i) ss += x[start + i] * x[start + i];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + c_.rms_norm_eps);
      for (size_t i = 0; i < d; ++i) x[start + i] = norm_weight(weight[i]) * x[start + i] * inv;
    }
  }
  static std::vector<double> matvec(const std::vector<float>& m, const std::vector<double>& x) {
    const size_t cols = x.size(), rows = m.size() / cols;
    std::vector<double> y(rows, 0.0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < cols; ++i) y[r] += m[r * cols + i] * x[i];
    return y;
  }
  static void add(std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  }
  static void add(std::vector<double>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  }
  // Hugging Face rotate_half RoPE with the default / linear / llama3 / longrope frequencies, on
  // the first rotary_dim dims of the head (transformers' Phi-3 apply_rotary_pos_emb).
  // `local`: Gemma 3's sliding layers, rope_local_base_freq and no scaling.
  void rope(double* x, int64_t pos, bool local) const {
    const int64_t dims = static_cast<int64_t>(static_cast<double>(c_.head_dim) *
                                              c_.partial_rotary_factor),
                  half = dims / 2;
    const double theta = local ? *c_.gemma.rope_local_theta : c_.rope_theta;
    const RopeScaling s = local ? RopeScaling{} : c_.rope_scaling;
    // _compute_longrope_parameters: cos and sin scaled by sqrt(1 + ln(scale) / ln(original)).
    double mscale = 1;
    if (s.type == "longrope") {
      const double orig = static_cast<double>(s.original_max_position_embeddings);
      const double scale = static_cast<double>(c_.max_position_embeddings) / orig;
      if (scale > 1) mscale = std::sqrt(1 + std::log(scale) / std::log(orig));
    }
    for (int64_t i = 0; i < half; ++i) {
      double f = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dims));
      if (s.type == "longrope") f /= (long_factors_ ? s.long_factor : s.short_factor)[i];
      if (s.type == "linear") f /= s.factor;
      if (s.type == "llama3") {
        const double old_len = static_cast<double>(s.original_max_position_embeddings);
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > old_len / s.low_freq_factor) {
          f /= s.factor;
        } else if (wavelen >= old_len / s.high_freq_factor) {
          const double smooth =
              (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
      }
      const double a = static_cast<double>(pos) * f, cs = std::cos(a) * mscale,
                   sn = std::sin(a) * mscale;
      const double x0 = x[i], x1 = x[i + half];
      x[i] = x0 * cs - x1 * sn;
      x[i + half] = x1 * cs + x0 * sn;
    }
  }

  ModelConfig c_;
  const TensorStore& store_;
  bool long_factors_;
  std::map<std::string, std::vector<float>> weights_;
};

// ---------------------------------------------------------------------------------------------
// Sequences, pages and steps.

struct Seq {
  SeqId id = 0;
  std::vector<TokenId> tokens;  // every token the sequence will have
  std::vector<PageId> pages;    // block table
  int32_t cached = 0;           // tokens already in the KV cache
  // Per page, whether it fills from the last slot (BROS bidirectional pages).
  std::vector<uint8_t> reversed_pages;
};

// Hands out page ids in a shuffled order, so block tables are never contiguous.
class Pages {
 public:
  explicit Pages(int64_t n, uint32_t seed = 5) {
    for (PageId p = 0; p < n; ++p) free_.push_back(p);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(seed));
  }
  Seq seq(SeqId id, std::vector<TokenId> tokens, int page_size) {
    Seq s{id, std::move(tokens), {}, 0};
    const size_t pages = (s.tokens.size() + page_size - 1) / page_size;
    for (size_t i = 0; i < pages; ++i) {
      s.pages.push_back(free_.back());
      free_.pop_back();
    }
    return s;
  }

 private:
  std::vector<PageId> free_;
};

std::vector<TokenId> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<TokenId> dist(0, 4095);  // inside every test model's vocabulary
  std::vector<TokenId> t(n);
  for (auto& e : t) e = dist(rng);
  return t;
}

class Step {
 public:
  // The next n tokens of s as one chunk.
  Step& add(Seq& s, int32_t n, bool logits = true) {
    SeqChunk c;
    c.seq = s.id;
    c.num_cached = s.cached;
    c.num_tokens = n;
    c.token_offset = batch_.num_tokens();
    c.block_table = s.pages;
    c.wants_logits = logits;
    c.reversed_pages = s.reversed_pages;
    for (int32_t i = 0; i < n; ++i) {
      batch_.tokens.push_back(s.tokens.at(s.cached + i));
      batch_.positions.push_back(s.cached + i);
    }
    batch_.chunks.push_back(c);
    added_.push_back(&s);
    return *this;
  }
  // Runs the step and returns one logits row per added chunk (empty when it wanted none).
  std::vector<std::vector<float>> run(Backend& backend) {
    const int64_t vocab = backend.config().vocab_size;
    std::vector<float> flat(batch_.num_logit_rows() * vocab);
    backend.forward(batch_, flat);
    std::vector<std::vector<float>> rows;
    int64_t r = 0;
    for (size_t i = 0; i < batch_.chunks.size(); ++i) {
      added_[i]->cached += batch_.chunks[i].num_tokens;
      if (!batch_.chunks[i].wants_logits) {
        rows.emplace_back();
        continue;
      }
      rows.emplace_back(flat.begin() + r * vocab, flat.begin() + (r + 1) * vocab);
      ++r;
    }
    return rows;
  }
  const ForwardBatch& batch() const { return batch_; }

 private:
  ForwardBatch batch_;
  std::vector<Seq*> added_;
};

double rel_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return diff / scale;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_err(a, std::vector<double>(b.begin(), b.end()));
}

::testing::AssertionResult Bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "first difference at " << i << ": " << a[i] << " vs "
                                           << b[i] << " (rel err " << rel_err(a, b) << ")";
  return ::testing::AssertionSuccess();
}

std::vector<TokenId> prefix(const Seq& s, int32_t n) {
  return {s.tokens.begin(), s.tokens.begin() + n};
}

// Three sequences over three steps: multi-page prompts, a prompt split in two chunks, decode
// tokens mixed with a prefill chunk. Every logits row is checked against the reference.
void check_against_reference(const TestModel& m, double tol, bool deterministic, int page_size = 16,
                             CpuGemmLib lib = CpuGemmLib::kOneDnn, int64_t max_model_len = 0) {
  BackendOptions o;
  o.deterministic = deterministic;
  o.page_size = page_size;
  o.num_pages = 256;
  o.max_model_len = max_model_len;
  auto backend = make_cpu_backend(m.config, m.store, o, lib);
  const int64_t len = max_model_len > 0 ? max_model_len : m.config.max_position_embeddings;
  Reference ref(m, len > m.config.rope_scaling.original_max_position_embeddings);
  Pages pages(256);
  Seq a = pages.seq(1, random_tokens(42, 1), page_size);
  Seq b = pages.seq(2, random_tokens(28, 2), page_size);
  Seq c = pages.seq(3, random_tokens(27, 3), page_size);
  auto expect_close = [&](const std::vector<float>& got, const Seq& s, const char* what) {
    const double err = rel_err(got, ref.logits(prefix(s, s.cached)));
    if (std::getenv("BLEND_TEST_VERBOSE"))
      std::printf("%s seq %ld: rel err %.3g\n", what, (long)s.id, err);
    EXPECT_LT(err, tol) << what << " (seq " << s.id << ", " << s.cached << " tokens)";
  };

  auto rows = Step().add(a, 40).add(b, 25).add(c, 17, /*logits=*/false).run(*backend);
  EXPECT_TRUE(rows[2].empty());
  expect_close(rows[0], a, "40-token prompt");
  expect_close(rows[1], b, "25-token prompt");

  rows = Step().add(b, 1).add(c, 9).add(a, 1).run(*backend);
  expect_close(rows[0], b, "decode");
  expect_close(rows[1], c, "second prefill chunk");
  expect_close(rows[2], a, "decode");

  rows = Step().add(a, 1).add(c, 1).add(b, 2).run(*backend);
  expect_close(rows[0], a, "decode");
  expect_close(rows[1], c, "decode after chunked prefill");
  expect_close(rows[2], b, "two-token chunk");
}

// ---------------------------------------------------------------------------------------------

TEST(CpuBackend, MatchesFloat64ReferenceF32) {
  check_against_reference(model("llama"), 1e-5, false);
  check_against_reference(model("llama"), 1e-5, true);
}

TEST(CpuBackend, MatchesFloat64ReferenceOtherPageSizes) {
  check_against_reference(model("llama"), 1e-5, true, /*page_size=*/8);
  check_against_reference(model("llama"), 1e-5, false, /*page_size=*/32);
}

TEST(CpuBackend, MatchesFloat64ReferenceQwen2Bias) {
  check_against_reference(model("qwen2"), 1e-5, false);
}

// Qwen3: per-head RMSNorms of q and k before RoPE, head_dim apart from hidden / heads.
TEST(CpuBackend, MatchesFloat64ReferenceQwen3HeadNorms) {
  check_against_reference(model("qwen3"), 1e-5, false);
  check_against_reference(model("qwen3"), 1e-5, true);
  check_against_reference(model("qwen3", DType::kBF16), 2e-2, false);
}

// Phi-3 (the tiny-phi3 preset's layers): fused qkv_proj / gate_up_proj split by the reference
// itself, 12 of 16 dims rotated, longrope's long factors (the default context, 4096, is over the
// original 1024) or its short ones (an engine capped at 1024), cos and sin scaled by the
// attention factor.
TEST(CpuBackend, MatchesFloat64ReferencePhi3PartialRopeLongrope) {
  const TestModel& m = model("phi3");
  ASSERT_EQ(m.config.rotary_dim(), 12);
  check_against_reference(m, 1e-5, false);
  check_against_reference(m, 1e-5, true);
  check_against_reference(m, 1e-5, false, 16, CpuGemmLib::kOneDnn, /*max_model_len=*/1024);
  check_against_reference(model("phi3", DType::kBF16), 2e-2, false);
}

// Partial RoPE by hand: heads 8 floats apart, of which the first 4 rotate (pairs (0, 2) and
// (1, 3)): angle 90 degrees on the first pair, 0 on the second; dims 4..7 pass unchanged.
TEST(CpuOps, PartialRopeRotatesOnlyTheLeadingDimsOfEachHead) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 16, 17, 18};
  const float cos[] = {0, 1}, sin[] = {1, 0};
  cpu::rope_apply(x.data(), /*heads=*/2, /*stride=*/8, /*half=*/2, cos, sin);
  const std::vector<float> expected = {-3, 2, 1, 4, 5, 6, 7, 8, -13, 12, 11, 14, 15, 16, 17, 18};
  EXPECT_EQ(x, expected);
}

// The two factor sets give different logits, so the test above tells them apart.
TEST(CpuBackend, Phi3ShortAndLongFactorsDiffer) {
  const TestModel& m = model("phi3");
  Reference long_ref(m, true), short_ref(m, false);
  const auto tokens = random_tokens(40, 5);
  const std::vector<double> l = long_ref.logits(tokens);
  EXPECT_GT(rel_err(std::vector<float>(l.begin(), l.end()), short_ref.logits(tokens)), 1e-3);
}

// Gemma 2: (1 + w) norms, embeddings x sqrt(hidden), four norms a layer, GeGLU with tanh GELU,
// query_pre_attn_scalar, attention and final soft-capping, a window on the sliding layer only.
TEST(CpuBackend, MatchesFloat64ReferenceGemma2) {
  check_against_reference(model("gemma2"), 1e-5, false);
  check_against_reference(model("gemma2"), 1e-5, true);
  // The final cap (3) bounds the logits' scale, which the relative error divides by, but not
  // the bf16 error of the logits it leaves nearly linear: about 4% here, where the uncapped
  // models' 0.2% is relative to a peak ten times higher.
  check_against_reference(model("gemma2", DType::kBF16), 6e-2, false);
}

// Gemma 3: q/k norms of (1 + w), the local RoPE base on the sliding layer and linear
// rope_scaling on the global one only.
TEST(CpuBackend, MatchesFloat64ReferenceGemma3) {
  check_against_reference(model("gemma3"), 1e-5, false);
  check_against_reference(model("gemma3"), 1e-5, true);
  check_against_reference(model("gemma3", DType::kBF16), 2e-2, false);
}

TEST(CpuBackend, MatchesFloat64ReferenceLlama3RopeScalingTied) {
  check_against_reference(model("llama3"), 1e-5, false);
}

TEST(CpuBackend, MatchesFloat64ReferenceLinearRopeScaling) {
  check_against_reference(model("linear"), 1e-5, false);
}

TEST(CpuBackend, MatchesFloat64ReferenceHeadDim64) {
  check_against_reference(model("hd64"), 1e-5, true);
}

TEST(CpuBackend, MatchesFloat64ReferenceMistralSlidingWindow) {
  check_against_reference(model("mistral"), 1e-5, true);
}

TEST(CpuBackend, MatchesFloat64ReferenceBF16AndF16) {
  check_against_reference(model("llama", DType::kBF16), 2e-2, false);
  check_against_reference(model("llama", DType::kBF16), 2e-2, true);
  check_against_reference(model("hd64", DType::kF16), 2e-2, false);
}

TEST(CpuBackend, OpenBlasF32Path) {
  check_against_reference(model("llama"), 1e-5, false, 16, CpuGemmLib::kOpenBlas);
  check_against_reference(model("llama"), 1e-5, true, 16, CpuGemmLib::kOpenBlas);
}

// Prefill in one chunk, in several chunks, token by token, then decode; and full recompute of
// every prefix. In deterministic mode all give the same bits; in default mode, close values.
void check_chunking(const TestModel& m, bool deterministic, double tol) {
  auto backend = make_backend(m, deterministic);
  Pages pages(256);
  const auto tokens = random_tokens(42, 7);
  const int32_t prompt = 37;
  auto same = [&](const std::vector<float>& a, const std::vector<float>& b) {
    if (deterministic) {
      EXPECT_TRUE(Bitwise(a, b));
    } else {
      EXPECT_LT(rel_err(a, b), tol);
    }
  };

  std::map<int32_t, std::vector<float>> one_shot;  // logits after k tokens
  Seq s = pages.seq(1, tokens, 16);
  one_shot[prompt] = Step().add(s, prompt).run(*backend)[0];
  while (s.cached < 42) {
    auto row = Step().add(s, 1).run(*backend)[0];
    one_shot[s.cached] = std::move(row);
  }

  Seq chunked = pages.seq(2, tokens, 16);
  Step().add(chunked, 10, false).run(*backend);
  Step().add(chunked, 16).run(*backend);
  same(Step().add(chunked, 11).run(*backend)[0], one_shot[prompt]);
  while (chunked.cached < 42) {
    const auto row = Step().add(chunked, 1).run(*backend)[0];
    same(row, one_shot[chunked.cached]);
  }

  Seq single = pages.seq(3, tokens, 16);
  while (single.cached < 42) {
    const auto row = Step().add(single, 1).run(*backend)[0];
    if (single.cached >= prompt) same(row, one_shot[single.cached]);
  }

  for (int32_t k = prompt + 1; k <= 42; ++k) {
    Seq full = pages.seq(10 + k, prefix(s, k), 16);
    same(Step().add(full, k).run(*backend)[0], one_shot[k]);
  }
}

TEST(CpuBackend, ChunkingAndIncrementalDecodeDeterministic) {
  check_chunking(model("llama"), true, 0);
  check_chunking(model("llama", DType::kBF16), true, 0);
  check_chunking(model("mistral"), true, 0);
  // Gemma 2's capped scores and per-layer window, Gemma 3's two RoPE tables.
  check_chunking(model("gemma2"), true, 0);
  check_chunking(model("gemma3", DType::kBF16), true, 0);
}

TEST(CpuBackend, ChunkingAndIncrementalDecodeDefaultMode) {
  check_chunking(model("llama"), false, 1e-5);
  check_chunking(model("llama", DType::kBF16), false, 1e-2);
}

// A sequence's logits alone and inside batches of 24+ other sequences (prefill chunks and
// decodes of varied lengths), in different orders: bitwise identical in deterministic mode.
void check_batch_invariance(const TestModel& m) {
  constexpr int kOthers = 24;
  auto backend = make_backend(m, true, 16, 1024);
  Pages pages(1024);
  const auto target_tokens = random_tokens(26, 99);

  Seq alone = pages.seq(0, target_tokens, 16);
  std::vector<std::vector<float>> expected;
  expected.push_back(Step().add(alone, 23).run(*backend)[0]);
  for (int i = 0; i < 3; ++i) expected.push_back(Step().add(alone, 1).run(*backend)[0]);

  Seq target = pages.seq(1, target_tokens, 16);
  std::vector<Seq> others;
  std::mt19937 rng(3);
  for (int i = 0; i < kOthers; ++i) {
    const int len = 1 + static_cast<int>(rng() % 60);
    others.push_back(pages.seq(100 + i, random_tokens(len + 8, 1000 + i), 16));
  }
  auto run_with_others = [&](std::vector<int> order, auto add_other) {
    std::shuffle(order.begin(), order.end(), rng);
    Step step;
    size_t target_index = 0;
    for (int i : order) {
      if (i < 0) {
        target_index = step.batch().chunks.size();
        step.add(target, 1);
      } else {
        add_other(step, others[i]);
      }
    }
    EXPECT_EQ(step.batch().chunks.size(), static_cast<size_t>(kOthers + 1));
    return step.run(*backend)[target_index];
  };
  std::vector<int> order(kOthers + 1);
  for (int i = 0; i <= kOthers; ++i) order[i] = i - 1;  // -1 is the target

  // Step 1: everybody's prompt at once (the target's 23 tokens among ~750).
  {
    Step step;
    size_t target_index = 0;
    for (int i = 0; i < kOthers; ++i) {
      if (i == 7) {
        target_index = step.batch().chunks.size();
        step.add(target, 23);
      }
      step.add(others[i], static_cast<int32_t>(others[i].tokens.size()) - 8, i % 3 == 0);
    }
    ASSERT_GT(step.batch().num_tokens(), 400);
    EXPECT_TRUE(Bitwise(step.run(*backend)[target_index], expected[0])) << "prefill in a crowd";
  }
  // Steps 2-4: decodes for all, in shuffled orders; some others take 2-3 tokens at once.
  for (int k = 1; k <= 3; ++k) {
    const auto row = run_with_others(
        order, [&](Step& st, Seq& o) { st.add(o, o.id % 4 == 0 && k < 3 ? 2 : 1); });
    EXPECT_TRUE(Bitwise(row, expected[k])) << "decode step " << k;
  }
}

// BROS §5: two sequences share a page, one filling it from slot 0, the other from the last
// slot. Each one's logits are bitwise those it has alone in pages of its own.
void check_bidirectional_pages(const TestModel& m) {
  auto backend = make_backend(m, true, 16, 64);
  Pages pages(64);
  const auto a_tokens = random_tokens(40, 7), b_tokens = random_tokens(39, 8);
  Seq a_alone = pages.seq(0, a_tokens, 16), b_alone = pages.seq(1, b_tokens, 16);
  std::vector<std::vector<float>> expected_a, expected_b;
  expected_a.push_back(Step().add(a_alone, 38).run(*backend)[0]);
  expected_b.push_back(Step().add(b_alone, 36).run(*backend)[0]);
  for (int k = 0; k < 2; ++k) {
    expected_a.push_back(Step().add(a_alone, 1).run(*backend)[0]);
    expected_b.push_back(Step().add(b_alone, 1).run(*backend)[0]);
  }
  // A: positions 32..39 in slots 0..7 of `shared`; B: positions 32..38 in slots 15..9.
  Seq a = pages.seq(2, a_tokens, 16), b = pages.seq(3, b_tokens, 16);
  // B's first two pages fill from slot 0 (as prefix-cache pages do), its last one backwards.
  b.pages[2] = a.pages[2];
  b.reversed_pages = {0, 0, 1};
  auto step1 = Step().add(b, 36).add(a, 38).run(*backend);
  EXPECT_TRUE(Bitwise(step1[0], expected_b[0]));
  EXPECT_TRUE(Bitwise(step1[1], expected_a[0]));
  for (int k = 1; k <= 2; ++k) {
    auto rows = Step().add(a, 1).add(b, 1).run(*backend);
    EXPECT_TRUE(Bitwise(rows[0], expected_a[k])) << "decode " << k;
    EXPECT_TRUE(Bitwise(rows[1], expected_b[k])) << "decode " << k;
  }
}

TEST(CpuBackend, BidirectionalPagesF32) {
  check_bidirectional_pages(model("llama"));
}

TEST(CpuBackend, BidirectionalPagesBF16) {
  check_bidirectional_pages(model("llama", DType::kBF16));
}

TEST(CpuBackend, BatchInvariantInDeterministicModeF32) {
  check_batch_invariance(model("llama"));
}

TEST(CpuBackend, BatchInvariantInDeterministicModeBF16) {
  check_batch_invariance(model("llama", DType::kBF16));
}

// Soft-capping each score on its own keeps attention's batch invariance (attention.h).
TEST(CpuBackend, BatchInvariantInDeterministicModeGemma) {
  check_batch_invariance(model("gemma2"));
  check_batch_invariance(model("gemma2", DType::kBF16));
  check_batch_invariance(model("gemma3"));
}

// The kernels used where AVX-512 is absent: same reference, same determinism guarantees.
// A pass's thread count (what CoreShare lowers beside a busy neighbour) does not change a
// deterministic result: the same prompt and decodes on all threads and on one give the same bits.
TEST(CpuBackend, DeterministicResultsDoNotDependOnThePassThreadCount) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    auto backend = make_backend(model("base", dtype), true, 16, 64);
    if (backend->threads() < 2) GTEST_SKIP() << "one core: no other thread count to compare";
    Pages pages(64);
    const auto tokens = random_tokens(40, 17);
    auto run = [&](uint32_t id) {
      Seq s = pages.seq(id, tokens, 16);
      std::vector<std::vector<float>> rows{Step().add(s, 37).run(*backend)[0]};
      for (int i = 0; i < 3; ++i) rows.push_back(Step().add(s, 1).run(*backend)[0]);
      return rows;
    };
    const auto all = run(0);
    backend->set_threads(1);
    EXPECT_EQ(backend->threads(), 1);
    const auto one = run(1);
    for (size_t i = 0; i < all.size(); ++i)
      EXPECT_TRUE(Bitwise(all[i], one[i])) << dtype_name(dtype) << " step " << i;
    backend->set_threads(1000);  // clamped to the count at construction
    EXPECT_GE(backend->threads(), 2);
  }
}

TEST(CpuBackend, PortableAttentionKernel) {
  cpu::set_force_portable_kernels(true);
  check_against_reference(model("llama"), 1e-5, true);
  check_against_reference(model("mistral"), 1e-5, false);
  check_chunking(model("llama", DType::kBF16), true, 0);
  check_batch_invariance(model("hd64"));
  check_against_reference(model("gemma2"), 1e-5, true);  // the portable kernel's soft-capping
  check_batch_invariance(model("gemma2"));
  cpu::set_force_portable_kernels(false);
}

// A row's output depends only on the keys it attends to, even where a later key of its chunk is
// NaN: a kernel that weights the keys a row must not see by 0 gets 0 * NaN = NaN, and the
// prefix cache then hands that K/V of the clean prefix to other requests (issue 54: a healthy
// request failed with NaN logits after a poisoned one shared its first token). Position 1's
// input state is NaN; position 0's output, after every layer, must equal the one computed alone.
// 20 positions, so the first key block is a full f32 page (the portable kernel reads it in place).
void check_causal_under_nan(bool portable) {
  cpu::set_force_portable_kernels(portable);
  const TestModel& m = model("llama");
  const int64_t h = m.config.hidden_size, n = 20;
  auto backend = make_backend(m, /*deterministic=*/true);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> states(n * h);
  for (float& v : states) v = normal(rng);
  std::fill_n(states.begin() + h, h, std::numeric_limits<float>::quiet_NaN());
  auto run = [&](int64_t tokens, PageId page) {
    ForwardBatch batch;
    SeqChunk c;
    c.seq = page;
    c.num_tokens = static_cast<int32_t>(tokens);
    c.block_table = {page, page + 1};
    batch.chunks.push_back(c);
    for (int64_t i = 0; i < tokens; ++i) {
      batch.tokens.push_back(0);
      batch.positions.push_back(static_cast<int32_t>(i));
    }
    std::vector<float> out(tokens * h);
    backend->forward_layers(batch, 0, m.config.num_layers,
                            std::span<const float>(states.data(), tokens * h), out, {});
    return out;
  };
  const std::vector<float> with_nan = run(n, 0);
  const std::vector<float> alone = run(1, 2);
  cpu::set_force_portable_kernels(false);
  EXPECT_TRUE(std::isnan(with_nan[h])) << "position 1 is not NaN: the test does not test";
  EXPECT_TRUE(Bitwise({with_nan.begin(), with_nan.begin() + h}, alone))
      << (portable ? "portable" : "default") << " kernel";
}

TEST(CpuBackend, ALaterNanKeyNeverReachesAnEarlierRow) {
  check_causal_under_nan(/*portable=*/true);
  check_causal_under_nan(/*portable=*/false);
}

TEST(CpuBackend, KvBytesPerPageAndCopyPage) {
  const TestModel& m = model("llama", DType::kBF16);
  const ModelConfig& c = m.config;
  auto backend = make_backend(m, true, 16, 32);
  EXPECT_EQ(backend->num_pages(), 32);
  // bf16 pages where oneDNN computes in bf16; f32 on CPUs without a bf16 kernel (AVX2).
  const DType kv = cpu::onednn_has_bf16_matmul() ? DType::kBF16 : DType::kF32;
  EXPECT_EQ(backend->compute_dtype(), kv);
  EXPECT_EQ(backend->kv_bytes_per_page(),
            16 * kv_bytes_per_token(c, static_cast<int>(dtype_size(kv))));
  EXPECT_EQ(make_backend(model("llama"), true, 8, 4)->kv_bytes_per_page(),
            8 * kv_bytes_per_token(c, 4));
  EXPECT_EQ(backend->name(), "cpu");

  // A 20-token prompt fills page 0 and 4 slots of its second page; copy that page elsewhere
  // and decode the same token through either copy.
  Pages pages(32);
  Seq s = pages.seq(1, random_tokens(21, 4), 16);
  Step().add(s, 20).run(*backend);
  Seq copy = s;
  copy.pages[1] = 31 - s.pages[1] == s.pages[1] ? 0 : 31 - s.pages[1];
  ASSERT_NE(copy.pages[1], s.pages[1]);
  ASSERT_NE(copy.pages[1], s.pages[0]);
  backend->copy_page(s.pages[1], copy.pages[1]);
  const auto via_copy = Step().add(copy, 1).run(*backend)[0];
  const auto via_original = Step().add(s, 1).run(*backend)[0];
  EXPECT_TRUE(Bitwise(via_copy, via_original));
  EXPECT_THROW(backend->copy_page(0, 32), Error);
  EXPECT_THROW(backend->copy_page(-1, 0), Error);
}

// BROS lazy checkpointing: read_slots saves some slots of a page into a page image and
// write_slots puts exactly those back, leaving the page's other slots alone.
TEST(CpuBackend, ReadAndWriteSlotsMoveOnlyThoseSlots) {
  auto backend = make_backend(model("llama", DType::kBF16), true, 16, 8);
  const auto bytes = static_cast<size_t>(backend->kv_bytes_per_page());
  Pages pages(8);
  Seq a = pages.seq(1, random_tokens(16, 21), 16), b = pages.seq(2, random_tokens(16, 22), 16);
  Step().add(a, 16).add(b, 16).run(*backend);
  std::vector<std::byte> page_a(bytes), page_b(bytes), image(bytes, std::byte{0x5a});
  backend->read_pages(a.pages, page_a.data());
  backend->read_pages(b.pages, page_b.data());
  ASSERT_NE(page_a, page_b);

  // Save slots 3..6 of a's page, overwrite the page with b's, write the saved slots back.
  backend->read_slots(a.pages[0], 3, 4, image.data());
  backend->write_pages(a.pages, page_b.data());
  backend->write_slots(a.pages[0], 3, 4, image.data());
  std::vector<std::byte> mixed(bytes);
  backend->read_pages(a.pages, mixed.data());
  // A page image, for each layer, K ([kv_head][head_dim][16]) then V ([kv_head][16][head_dim]):
  // a byte belongs to slot 3..6 exactly where the layout puts those slots.
  const ModelConfig& c = backend->config();
  const size_t es = dtype_size(backend->compute_dtype()), d = static_cast<size_t>(c.head_dim),
               heads = static_cast<size_t>(c.num_kv_heads);
  const size_t half = heads * d * 16 * es;  // one layer's K (or V) part
  size_t from_a = 0;
  for (size_t i = 0; i < bytes; ++i) {
    const size_t in_layer = i % (2 * half), part = in_layer % half;
    const size_t slot = in_layer < half ? (part / es) % 16 : (part / es / d) % 16;
    const bool saved = slot >= 3 && slot < 7;
    EXPECT_EQ(mixed[i], saved ? page_a[i] : page_b[i]) << "byte " << i;
    if (saved) {
      EXPECT_EQ(image[i], page_a[i]);
      ++from_a;
    } else {
      ASSERT_EQ(image[i], std::byte{0x5a}) << "read_slots touched byte " << i;
    }
  }
  EXPECT_EQ(from_a, bytes * 4 / 16);
  EXPECT_THROW(backend->read_slots(a.pages[0], 14, 3, image.data()), Error);
}

TEST(CpuBackend, RejectsBadBatches) {
  auto backend = make_backend(model("llama"), false, 16, 8);
  const int64_t vocab = backend->config().vocab_size;
  std::vector<float> logits(2 * vocab);
  auto good = [] {
    ForwardBatch b;
    b.tokens = {1, 2, 3};
    b.positions = {0, 1, 2};
    b.chunks.push_back({.seq = 1,
                        .num_cached = 0,
                        .num_tokens = 3,
                        .token_offset = 0,
                        .block_table = {5},
                        .wants_logits = true});
    return b;
  };
  {
    ForwardBatch b = good();
    EXPECT_NO_THROW(backend->forward(b, logits));
  }
  auto expect_error = [&](auto mutate) {
    ForwardBatch b = good();
    mutate(b);
    EXPECT_THROW(backend->forward(b, logits), Error);
  };
  expect_error([](ForwardBatch& b) { b.chunks[0].block_table = {8}; });
  expect_error([](ForwardBatch& b) { b.chunks[0].block_table = {-1}; });
  expect_error([](ForwardBatch& b) { b.chunks[0].block_table.clear(); });
  expect_error([&](ForwardBatch& b) { b.tokens[1] = static_cast<TokenId>(vocab); });
  expect_error([](ForwardBatch& b) { b.tokens[1] = -3; });
  expect_error([](ForwardBatch& b) { b.positions[2] = 7; });
  expect_error([](ForwardBatch& b) { b.positions.pop_back(); });
  expect_error([](ForwardBatch& b) { b.chunks[0].num_tokens = 2; });
  expect_error([](ForwardBatch& b) { b.chunks[0].token_offset = 1; });
  expect_error([](ForwardBatch& b) { b.chunks[0].num_cached = 20; });  // needs 2 pages
  {
    ForwardBatch b = good();
    std::vector<float> small(vocab - 1);
    EXPECT_THROW(backend->forward(b, small), Error);
  }
}

TEST(CpuBackend, RejectsMissingTensors) {
  const TestModel& m = model("llama");
  ModelConfig c = m.config;
  c.attention_bias = true;  // the folder has no biases
  BackendOptions o;
  o.num_pages = 4;
  EXPECT_THROW(make_cpu_backend(c, m.store, o), Error);
}

}  // namespace
}  // namespace blend
