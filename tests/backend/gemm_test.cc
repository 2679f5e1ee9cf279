#include "backend/cpu/gemm.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "model/safetensors.h"

namespace blend::cpu {
namespace {

// The compute dtypes oneDNN runs on this CPU.
std::vector<DType> compute_dtypes() {
  std::vector<DType> d{DType::kF32};
  if (onednn_has_bf16_matmul()) d.push_back(DType::kBF16);
  return d;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

// The compute-dtype elements at `data` as floats.
std::vector<float> decoded(const std::byte* data, int64_t n, DType dt) {
  std::vector<float> v(static_cast<size_t>(n));
  if (dt == DType::kF32) {
    std::memcpy(v.data(), data, v.size() * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, data + i * 2, 2);
      v[i] = bf16_to_f32(h);
    }
  }
  return v;
}

// `v` rounded to the compute dtype as Linear converts weights.
std::vector<float> rounded(std::vector<float> v, DType dt) {
  if (dt == DType::kBF16)
    for (float& f : v) f = bf16_to_f32(f32_to_bf16(f));
  return v;
}

TensorView view(const std::string& name, const std::vector<float>& v, std::vector<int64_t> shape) {
  return {.name = name,
          .dtype = DType::kF32,
          .shape = std::move(shape),
          .data = reinterpret_cast<const std::byte*>(v.data()),
          .nbytes = v.size() * 4};
}

// A layer with several 256-column slices and an odd tail (n = 600), K = 200, and a bias.
struct Layer {
  static constexpr int64_t k = 200, n = 600;
  std::vector<float> w = random_floats(n * k, 1), b = random_floats(n, 2);
  TensorView wv = view("w", w, {n, k}), bv = view("b", b, {n});
};

// Regression (issue 25): deterministic mode cut each row tile into column slices written
// straight into y's rows (a strided output), which oneDNN's brgemm matmul does not take, so every
// multi-slice layer ran oneDNN's reference kernel ("ref:any"), 100-400x slower.
TEST(Gemm, DeterministicSlicesRunAnOptimizedKernel) {
  const Layer layer;
  for (DType dt : compute_dtypes()) {
    GemmContext ctx({.compute = dt, .row_tile = deterministic_row_tile(dt, 16)});
    Linear linear(ctx, {&layer.wv}, {&layer.bv});
    const std::string impl = linear.impl();
    EXPECT_EQ(impl.find("ref"), std::string::npos) << dtype_name(dt) << ": " << impl;
  }
}

// Regression (issue 25): 256-column slices cut a K = 64 lm_head (the tiny preset's) into 500
// kernel calls whose fixed cost tripled its time. Slices now hold about the same number of
// weights whatever K, and come in a multiple of the threads so that a one-tile call keeps them
// all busy.
TEST(Gemm, DeterministicSlicesFollowTheWeightCountAndTheThreads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const auto wide = random_floats(32768 * 64, 5), square = random_floats(576 * 576, 6);
  const TensorView wide_view = view("wide", wide, {32768, 64});
  const TensorView square_view = view("square", square, {576, 576});
  GemmContext ctx({.compute = DType::kF32, .row_tile = deterministic_row_tile(DType::kF32, 16)});
  const Linear lm_head(ctx, {&wide_view}), o_proj(ctx, {&square_view});
  omp_set_num_threads(saved);
  EXPECT_LE(lm_head.num_slices(), 16u);  // 256 columns a slice: 128
  EXPECT_EQ(lm_head.num_slices() % 2, 0u);
  EXPECT_EQ(o_proj.num_slices(), 2u);  // 256 columns a slice: 3, two on one thread
}

// Deterministic mode over several tiles and slices: y = x W^T + b, and y += ... with
// accumulate, against a float64 reference; and each row's bits are those of the row alone.
TEST(Gemm, DeterministicTilesMatchReferenceAndSingleRows) {
  const Layer layer;
  constexpr int64_t k = Layer::k, n = Layer::n, m = 37;
  const auto xf = random_floats(m * k, 3);
  const auto y0 = random_floats(m * n, 4);
  for (DType dt : compute_dtypes()) {
    GemmContext ctx({.compute = dt, .row_tile = deterministic_row_tile(dt, 16)});
    // Three threads at load: three slices, the last one narrower.
    const int saved = omp_get_max_threads();
    omp_set_num_threads(3);
    Linear linear(ctx, {&layer.wv}, {&layer.bv});
    omp_set_num_threads(saved);
    ASSERT_EQ(linear.num_slices(), 3u);
    const int64_t mp = ctx.padded_rows(m);
    const size_t es = dtype_size(dt);
    std::vector<std::byte> x(static_cast<size_t>(mp * k) * es);
    store_row(xf.data(), m * k, dt, x.data());
    // The reference sees the inputs as the kernel does (rounded to the compute dtype).
    const auto xr = decoded(x.data(), m * k, dt), wr = rounded(layer.w, dt);
    const double tol = dt == DType::kF32 ? 1e-4 : 1e-2;

    for (bool accumulate : {false, true}) {
      std::vector<float> y(static_cast<size_t>(mp * n), 0.0f);
      if (accumulate) std::memcpy(y.data(), y0.data(), y0.size() * 4);
      linear.forward(x.data(), m, y.data(), accumulate);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double ref = layer.b[j] + (accumulate ? y0[i * n + j] : 0.0);
          for (int64_t c = 0; c < k; ++c) ref += double{xr[i * k + c]} * wr[j * k + c];
          ASSERT_NEAR(y[i * n + j], ref, tol) << dtype_name(dt) << " row " << i << " col " << j;
        }
      // Row 33 (in the second tile) alone, at the top of a tile of zero rows.
      std::vector<std::byte> one(static_cast<size_t>(ctx.padded_rows(1) * k) * es);
      std::memcpy(one.data(), x.data() + 33 * k * es, k * es);
      std::vector<float> y1(static_cast<size_t>(ctx.padded_rows(1) * n), 0.0f);
      if (accumulate) std::memcpy(y1.data(), y0.data() + 33 * n, n * 4);
      linear.forward(one.data(), 1, y1.data(), accumulate);
      EXPECT_EQ(std::memcmp(y1.data(), y.data() + 33 * n, n * 4), 0)
          << dtype_name(dt) << (accumulate ? " accumulate" : "");
    }
  }
}

}  // namespace
}  // namespace blend::cpu
