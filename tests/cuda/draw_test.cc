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

struct DeviceRows {
  std::vector<int32_t> tokens, flags;
};

// draw_rows over host rows (row r = logits[r * vocab, (r + 1) * vocab)).
DeviceRows draw_on_gpu(const std::vector<float>& logits, int64_t vocab,
                       const std::vector<float>& inv_t, const std::vector<double>& uniforms) {
  const auto rows = static_cast<int64_t>(inv_t.size());
  float *d_logits = nullptr, *d_inv = nullptr;
  double* d_u = nullptr;
  int32_t* d_out = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&d_logits), logits.size() * sizeof(float)));
  check(cudaMalloc(reinterpret_cast<void**>(&d_inv), inv_t.size() * sizeof(float)));
  check(cudaMalloc(reinterpret_cast<void**>(&d_u), uniforms.size() * sizeof(double)));
  check(cudaMalloc(reinterpret_cast<void**>(&d_out), 2 * rows * sizeof(int32_t)));
  check(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  check(cudaMemcpy(d_inv, inv_t.data(), inv_t.size() * sizeof(float), cudaMemcpyHostToDevice));
  check(cudaMemcpy(d_u, uniforms.data(), uniforms.size() * sizeof(double), cudaMemcpyHostToDevice));
  cuda::draw_rows(d_logits, rows, vocab, d_inv, d_u, d_out, d_out + rows, nullptr);
  check(cudaDeviceSynchronize());
  std::vector<int32_t> host(2 * rows);
  check(cudaMemcpy(host.data(), d_out, host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  for (void* p : {static_cast<void*>(d_logits), static_cast<void*>(d_inv), static_cast<void*>(d_u),
                  static_cast<void*>(d_out)})
    cudaFree(p);
  return {std::vector<int32_t>(host.begin(), host.begin() + rows),
          std::vector<int32_t>(host.begin() + rows, host.end())};
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
    std::vector<float> inv_t(kRows);
    std::vector<double> uniforms(kRows);
    std::vector<SamplingParams> params(kRows);
    for (int r = 0; r < kRows; ++r) {
      float* row = logits.data() + r * vocab;
      for (int k = 0; k < 5; ++k) row[pick(rng)] = 6.0f + static_cast<float>(k % 3);  // ties too
      params[r].temperature = r % 4 == 0 ? 0.0f : 0.5f + 0.25f * static_cast<float>(r % 5);
      inv_t[r] = r % 4 == 0 ? 0.0f : 1.0f / params[r].temperature;
      uniforms[r] = sampling_uniform(77 + static_cast<uint64_t>(r), r);
    }
    const DeviceRows gpu = draw_on_gpu(logits, vocab, inv_t, uniforms);
    for (int r = 0; r < kRows; ++r) {
      const std::span<const float> row(logits.data() + r * vocab, static_cast<size_t>(vocab));
      const SampledToken host = sample_token(row, params[r], 77 + static_cast<uint64_t>(r), r);
      EXPECT_EQ(gpu.flags[r], 0) << "vocab " << vocab << " row " << r;
      EXPECT_EQ(gpu.tokens[r], host.token) << "vocab " << vocab << " row " << r;
      ++compared;
      if (inv_t[r] != 0) {
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
  const DeviceRows gpu = draw_on_gpu(logits, kVocab, {1.0f, 0.0f, 1.0f, 1.0f},
                                     {0.5, 0.5, 0.5, sampling_uniform(1, 0)});
  EXPECT_EQ(gpu.flags, (std::vector<int32_t>{1, 1, 1, 0}));
  SamplingParams p;
  p.temperature = 1.0f;
  EXPECT_EQ(
      gpu.tokens[3],
      sample_token(std::span<const float>(logits.data() + 3 * kVocab, kVocab), p, 1, 0).token);
}

}  // namespace
}  // namespace blend
