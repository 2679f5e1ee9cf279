// Sampling on the GPU (backend/cuda/draw.cu): every row's token equals the host sampler's on the
// same logits, argmax and temperature rows alike, and rows the host must decide are flagged. The
// tests need a GPU and skip with a message without one (CI has none).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "sampling/sampler.h"

namespace blend {
namespace {

#define SKIP_WITHOUT_GPU()                                               \
  do {                                                                   \
    std::string why;                                                     \
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

void check(cudaError_t e) {
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}

// draw_rows over host rows (row r = logits[r * vocab, (r + 1) * vocab)) with parameters
// `params` (empty: every row's argmax).
struct DeviceRows {
  std::vector<cuda::DrawResult> results;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logits;
};
DeviceRows draw_on_gpu(const std::vector<float>& logits, int64_t vocab,
                       const std::vector<DeviceDraw>& params, int64_t rows) {
  float* d_logits = nullptr;
  DeviceDraw* d_params = nullptr;
  cuda::DrawResult* d_results = nullptr;
  int32_t* d_top_ids = nullptr;
  float* d_top_logits = nullptr;
  const size_t top = static_cast<size_t>(rows * kMaxDeviceLogprobs);
  check(cudaMalloc(reinterpret_cast<void**>(&d_logits), logits.size() * sizeof(float)));
  check(cudaMalloc(reinterpret_cast<void**>(&d_results), rows * sizeof(cuda::DrawResult)));
  check(cudaMalloc(reinterpret_cast<void**>(&d_top_ids), top * sizeof(int32_t)));
  check(cudaMalloc(reinterpret_cast<void**>(&d_top_logits), top * sizeof(float)));
  check(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  bool full = false;
  if (!params.empty()) {
    check(cudaMalloc(reinterpret_cast<void**>(&d_params), params.size() * sizeof(DeviceDraw)));
    check(cudaMemcpy(d_params, params.data(), params.size() * sizeof(DeviceDraw),
                     cudaMemcpyHostToDevice));
    for (const DeviceDraw& p : params) full |= p.cuts_or_logprobs();
  }
  cuda::draw_rows(d_logits, rows, vocab, d_params, full, d_results, d_top_ids, d_top_logits,
                  nullptr);
  check(cudaDeviceSynchronize());
  DeviceRows out{std::vector<cuda::DrawResult>(static_cast<size_t>(rows)),
                 std::vector<int32_t>(top), std::vector<float>(top)};
  check(cudaMemcpy(out.results.data(), d_results, rows * sizeof(cuda::DrawResult),
                   cudaMemcpyDeviceToHost));
  check(cudaMemcpy(out.top_ids.data(), d_top_ids, top * sizeof(int32_t), cudaMemcpyDeviceToHost));
  check(
      cudaMemcpy(out.top_logits.data(), d_top_logits, top * sizeof(float), cudaMemcpyDeviceToHost));
  for (void* p :
       {static_cast<void*>(d_logits), static_cast<void*>(d_params), static_cast<void*>(d_results),
        static_cast<void*>(d_top_ids), static_cast<void*>(d_top_logits)})
    cudaFree(p);
  return out;
}

TEST(CudaDraw, EveryRowIsTheHostSamplersToken) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  int64_t compared = 0, temperature_rows = 0, off_argmax = 0;
  // Vocabularies with a partial block and a partial group of eight, and Llama 3's.
  for (const int64_t vocab :
       {int64_t{1}, int64_t{7}, int64_t{300}, int64_t{4093}, int64_t{128256}}) {
    ASSERT_TRUE(cuda::draw_fits(vocab));
    constexpr int kRows = 48;
    std::vector<float> logits(static_cast<size_t>(kRows * vocab));
    std::normal_distribution<float> noise(-4.0f, 3.0f);
    std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
    for (float& x : logits) x = noise(rng);
    std::vector<DeviceDraw> draws(kRows);
    std::vector<SamplingParams> params(kRows);
    for (int r = 0; r < kRows; ++r) {
      float* row = logits.data() + r * vocab;
      for (int k = 0; k < 5; ++k) row[pick(rng)] = 6.0f + static_cast<float>(k % 3);  // ties too
      params[r].temperature = r % 4 == 0 ? 0.0f : 0.5f + 0.25f * static_cast<float>(r % 5);
      draws[r] = device_draw_of(params[r], 77 + static_cast<uint64_t>(r), r);
    }
    const DeviceRows gpu = draw_on_gpu(logits, vocab, draws, kRows);
    for (int r = 0; r < kRows; ++r) {
      const std::span<const float> row(logits.data() + r * vocab, static_cast<size_t>(vocab));
      const SampledToken host = sample_token(row, params[r], 77 + static_cast<uint64_t>(r), r);
      EXPECT_EQ(gpu.results[r].flag, 0) << "vocab " << vocab << " row " << r;
      EXPECT_EQ(gpu.results[r].token, host.token) << "vocab " << vocab << " row " << r;
      ++compared;
      if (draws[r].inv_temperature != 0) {
        ++temperature_rows;
        const auto argmax = std::max_element(row.begin(), row.end()) - row.begin();
        off_argmax += host.token != argmax ? 1 : 0;
      }
    }
  }
  EXPECT_EQ(compared, 5 * 48);
  EXPECT_GT(off_argmax, temperature_rows / 4);  // the draws are draws, not argmaxes
}

TEST(CudaDraw, RowsTheHostMustDecideAreFlagged) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kVocab = 1000;
  std::vector<float> logits(4 * kVocab, 0.5f);
  logits[10] = std::numeric_limits<float>::quiet_NaN();                // row 0: NaN
  logits[kVocab + 20] = std::numeric_limits<float>::infinity();        // row 1: +inf
  std::fill(logits.begin() + 2 * kVocab, logits.begin() + 3 * kVocab,  // row 2: no maximum
            -std::numeric_limits<float>::infinity());
  logits[3 * kVocab + 999] = 2.0f;  // row 3: fine
  SamplingParams p;
  p.temperature = 1.0f;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const DeviceRows gpu = draw_on_gpu(logits, kVocab,
                                     {device_draw_of(p, 1, 0), device_draw_of(greedy, 1, 0),
                                      device_draw_of(p, 1, 0), device_draw_of(p, 1, 0)},
                                     4);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(gpu.results[r].flag, r < 3 ? 1 : 0) << "row " << r;
  EXPECT_EQ(
      gpu.results[3].token,
      sample_token(std::span<const float>(logits.data() + 3 * kVocab, kVocab), p, 1, 0).token);
}

// Rows with the cuts and logprobs: the token, its logprob and the top logprobs are the host
// sampler's, bit for bit, on rows with many ties (the cuts break them by id) and model-like rows.
TEST(CudaDraw, CutsAndLogprobsAreTheHostSamplers) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  int64_t compared = 0, cut_rows = 0;
  for (const int64_t vocab : {int64_t{7}, int64_t{300}, int64_t{4093}, int64_t{128256}}) {
    ASSERT_TRUE(cuda::draw_fits(vocab));
    constexpr int kRows = 40;
    std::vector<float> logits(static_cast<size_t>(kRows * vocab));
    std::normal_distribution<float> noise(-4.0f, 3.0f);
    std::vector<DeviceDraw> draws(kRows);
    std::vector<SamplingParams> params(kRows);
    for (int r = 0; r < kRows; ++r) {
      float* row = logits.data() + r * vocab;
      for (int64_t i = 0; i < vocab; ++i)
        row[i] = r % 3 == 0 ? static_cast<float>(rng() % 6) : noise(rng);  // ties, or a tail
      if (r % 5 == 0) row[0] = -0.0f;
      SamplingParams& p = params[r];
      p.temperature = r % 8 == 0 ? 0.0f : 0.5f + 0.25f * static_cast<float>(r % 4);
      p.top_k = r % 4 == 1 ? 0 : 2 + r % 50;
      p.top_p = r % 3 == 2 ? 1.0f : 0.3f + 0.1f * static_cast<float>(r % 7);
      p.min_p = r % 5 == 3 ? 0.02f : 0.0f;
      if (r % 2 == 0) p.logprobs = r % 21;
      draws[r] = device_draw_of(p, 300 + static_cast<uint64_t>(r), r);
      cut_rows += draws[r].inv_temperature != 0 && (p.top_k > 0 || p.top_p < 1.0f) ? 1 : 0;
    }
    const DeviceRows gpu = draw_on_gpu(logits, vocab, draws, kRows);
    for (int r = 0; r < kRows; ++r) {
      const std::span<const float> row(logits.data() + r * vocab, static_cast<size_t>(vocab));
      const SampledToken host = sample_token(row, params[r], 300 + static_cast<uint64_t>(r), r);
      const cuda::DrawResult& g = gpu.results[r];
      const std::string where = "vocab " + std::to_string(vocab) + " row " + std::to_string(r);
      ASSERT_EQ(g.flag, 0) << where;
      EXPECT_EQ(g.token, host.token) << where;
      if (!params[r].logprobs) continue;
      EXPECT_EQ(row_logprob(g.token_logit, g.max, g.total), host.logprob) << where;
      for (size_t j = 0; j < host.top.size(); ++j) {
        const size_t k = static_cast<size_t>(r * kMaxDeviceLogprobs) + j;
        EXPECT_EQ(gpu.top_ids[k], host.top[j].token) << where << " top " << j;
        EXPECT_EQ(row_logprob(gpu.top_logits[k], g.max, g.total), host.top[j].logprob)
            << where << " top " << j;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 60);
  EXPECT_GT(cut_rows, 80);
}

}  // namespace
}  // namespace blend
