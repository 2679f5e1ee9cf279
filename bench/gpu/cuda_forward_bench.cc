// cuda backend step times against the GPU's own bounds, measured in the same run (DESIGN.md §6:
// median of several runs, ratio to the bound). Prints JSON lines:
//   {"kind":"bounds", ...}   peak dense bf16 GEMM FLOP/s (cuBLAS, 8192^3), device-to-device
//                            copy bandwidth (bytes read + written per second) and read
//                            bandwidth (cublasSasum over 2 GiB)
//   {"kind":"decode", ...}   a decode step of B sequences at C cached tokens each: tokens/s, the
//                            per-op GPU times, attention's bytes moved / time against the copy
//                            bandwidth (issue 28's roofline), the step against its bound (weights
//                            + KV read at the copy bandwidth, or the GEMMs at peak)
//   {"kind":"prefill", ...}  a prefill step of N prompts of P tokens each
//   {"kind":"mixed", ...}    D decodes at C cached tokens and one P-token prompt chunk after
//                            them (the engine's chunked-prefill step), against the larger of the
//                            GEMM bound and the weight + KV read bound
//   {"kind":"draw", ...}     with --draw: sampling R rows of the model's vocabulary where the
//                            logits are (draw.cu) for each kind of row (argmax, temperature, the
//                            top-k / top-p / min-p cuts, logprobs), the logits' bytes / time
//                            against the read bandwidth, and the host sampler's time for the same
//                            rows on one thread (sample_token; the logits' copy not counted)
//
//   cuda_forward_bench --model DIR [--decode 1,64,256] [--context 1024] [--prefill 4x512]
//                      [--mixed D:P,...] [--draw 64,256] [--reps 5]
// BLEND_CUDA_NANO_BATCHES (cuda_backend.cc) runs the steps as two overlapped nano-batches;
// per-op times are then not recorded (zeros), the step time is.
// The KV pages a decode step reads are zeros (the step's time does not depend on their values);
// each sequence owns its own pages, so reads are not shared through the L2.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../bench_util.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"
#include "backend/layer_op_seconds.h"
#include "core/error.h"
#include "model/safetensors.h"
#include "sampling/sampler.h"

namespace blend {
namespace {

using nlohmann::json;

using bench::emit;
using bench::median_seconds;
using bench::now;
using bench::parse_list;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Peak dense bf16 GEMM FLOP/s (cuBLAS, f32 accumulation, n^3) and copy bandwidth.
json measure_bounds() {
  const int n = 8192;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMalloc(&a, size_t{2} * n * n), "cudaMalloc");
  check(cudaMalloc(&b, size_t{2} * n * n), "cudaMalloc");
  check(cudaMalloc(&c, size_t{4} * n * n), "cudaMalloc");
  check(cudaMemset(a, 0x3c, size_t{2} * n * n), "cudaMemset");  // bf16 ~0.0115: not zeros
  check(cudaMemset(b, 0x3c, size_t{2} * n * n), "cudaMemset");
  cublasHandle_t h = nullptr;
  cublasCreate(&h);
  const float alpha = 1, beta = 0;
  auto gemm = [&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                 &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  const double gemm_s = median_seconds(7,
                                       [&] {
                                         for (int i = 0; i < 5; ++i) gemm();
                                         check(cudaDeviceSynchronize(), "gemm");
                                       }) /
                        5;
  cublasDestroy(h);
  const size_t bytes = size_t{1} << 31;
  void *src = nullptr, *dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  const double copy_s = median_seconds(7, [&] {
    check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy");
    check(cudaDeviceSynchronize(), "copy");
  });
  // A read-only stream: cuBLAS's f32 sum of absolute values over the same 2 GiB.
  cublasCreate(&h);
  const int floats = static_cast<int>(bytes / 4);
  check(cudaMemset(src, 0x3c, bytes), "cudaMemset");
  float sum = 0;
  const double read_s = median_seconds(7, [&] {
    cublasSasum(h, floats, static_cast<const float*>(src), 1, &sum);
    check(cudaDeviceSynchronize(), "asum");
  });
  cublasDestroy(h);
  for (void* p : {a, b, c, src, dst}) cudaFree(p);
  return {{"kind", "bounds"},
          {"device", cuda_device_description()},
          {"gemm_bf16_flops", 2.0 * n * n * n / gemm_s},
          {"copy_bytes_per_s", 2.0 * static_cast<double>(bytes) / copy_s},
          {"read_bytes_per_s", static_cast<double>(bytes) / read_s}};
}

json op_json(const CudaOpTimes& t, int64_t steps) {
  const double k = 1.0 / static_cast<double>(std::max<int64_t>(1, steps));
  json j;
  for (const auto& [op, ms] : layer_op_seconds(t, k)) j[op + "_ms"] = ms;  // ms per step
  j["total_ms"] = t.total() * k;
  return j;
}

// Times draw_rows on `rows` model-like rows (normal(-4, 3) logits, six high ones) of `vocab`
// logits for each kind of row, and the host sampler on the same rows.
void bench_draws(int64_t rows, int64_t vocab, int reps, double read_bw) {
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(-4.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (float& x : logits) x = noise(rng);
  for (int64_t r = 0; r < rows; ++r)
    for (int k = 0; k < 6; ++k) logits[r * vocab + rng() % vocab] = 8.0f + static_cast<float>(k);
  float* d_logits = nullptr;
  void* d_scratch = nullptr;
  const size_t top = static_cast<size_t>(rows * kMaxDeviceLogprobs);
  const size_t scratch_bytes = rows * (sizeof(DeviceDraw) + sizeof(cuda::DrawResult)) +
                               top * (sizeof(int32_t) + sizeof(float));
  check(cudaMalloc(reinterpret_cast<void**>(&d_logits), logits.size() * sizeof(float)),
        "cudaMalloc");
  check(cudaMalloc(&d_scratch, scratch_bytes), "cudaMalloc");
  check(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  auto* d_params = static_cast<DeviceDraw*>(d_scratch);
  auto* d_results = reinterpret_cast<cuda::DrawResult*>(d_params + rows);
  auto* d_top_ids = reinterpret_cast<int32_t*>(d_results + rows);
  auto* d_top_logits = reinterpret_cast<float*>(d_top_ids + top);
  struct Kind {
    const char* name;
    SamplingParams params;
  };
  std::vector<Kind> kinds(6);
  kinds[0] = {"argmax", {}};
  kinds[0].params.temperature = 0.0f;
  kinds[1] = {"temperature 0.7", {}};
  kinds[2] = {"top_k 50", {}};
  kinds[2].params.top_k = 50;
  kinds[3] = {"top_p 0.9", {}};
  kinds[3].params.top_p = 0.9f;
  kinds[4] = {"top_k 50 + top_p 0.9 + min_p 0.02", {}};
  kinds[4].params.top_k = 50;
  kinds[4].params.top_p = 0.9f;
  kinds[4].params.min_p = 0.02f;
  kinds[5] = {"logprobs 5", {}};
  kinds[5].params.logprobs = 5;
  for (size_t k = 1; k < kinds.size(); ++k) kinds[k].params.temperature = 0.7f;
  for (const Kind& kind : kinds) {
    const SamplingParams& p = kind.params;
    std::vector<DeviceDraw> params;
    bool full = false;
    for (int64_t r = 0; r < rows; ++r) {
      params.push_back(device_draw_of(p, static_cast<uint64_t>(r), 0));
      full |= params.back().cuts_or_logprobs();
    }
    check(cudaMemcpy(d_params, params.data(), params.size() * sizeof(DeviceDraw),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
    constexpr int kLaunches = 10;
    const double s =
        median_seconds(reps,
                       [&] {
                         for (int i = 0; i < kLaunches; ++i)
                           cuda::draw_rows(d_logits, rows, vocab, d_params, full, d_results,
                                           d_top_ids, d_top_logits, nullptr);
                         check(cudaDeviceSynchronize(), "draw_rows");
                       }) /
        kLaunches;
    const double host =
        median_seconds(3,
                       [&] {
                         for (int64_t r = 0; r < std::min<int64_t>(rows, 16); ++r)
                           sample_token(std::span<const float>(logits.data() + r * vocab,
                                                               static_cast<size_t>(vocab)),
                                        p, static_cast<uint64_t>(r), 0);
                       }) /
        static_cast<double>(std::min<int64_t>(rows, 16));
    const double bytes = static_cast<double>(rows * vocab) * sizeof(float);
    emit({{"kind", "draw"},
          {"rows", rows},
          {"vocab", vocab},
          {"setting", kind.name},
          {"ms", s * 1e3},
          {"logits_bytes_per_s", bytes / s},
          {"fraction_of_read", bytes / s / read_bw},
          {"host_ms_per_row", host * 1e3},
          {"host_ms_for_the_rows", host * 1e3 * static_cast<double>(rows)}});
  }
  cudaFree(d_logits);
  cudaFree(d_scratch);
}

int run(int argc, char** argv) {
  std::string model_dir, prefill_arg = "4x512";
  std::vector<int64_t> decode = {1, 64, 256}, draw_rows_list;
  std::vector<std::pair<int64_t, int64_t>> mixed;  // (decodes, prompt tokens)
  int64_t context = 1024;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model")
      model_dir = next();
    else if (a == "--decode")
      decode = parse_list(next());
    else if (a == "--context")
      context = std::stoll(next());
    else if (a == "--prefill")
      prefill_arg = next();
    else if (a == "--mixed") {
      const std::string list = next();
      for (size_t pos = 0; pos < list.size();) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        const std::string item = list.substr(pos, comma - pos);
        const size_t colon = item.find(':');
        if (colon == std::string::npos) throw Error("--mixed wants D:P items, got " + item);
        mixed.emplace_back(std::stoll(item.substr(0, colon)), std::stoll(item.substr(colon + 1)));
        pos = comma + 1;
      }
    } else if (a == "--draw")
      draw_rows_list = parse_list(next());
    else if (a == "--reps")
      reps = std::stoi(next());
    else
      throw Error("unknown option " + a);
  }
  if (model_dir.empty()) throw Error("--model DIR is required");
  const json bounds = measure_bounds();
  emit(bounds);
  const double peak = bounds["gemm_bf16_flops"], copy_bw = bounds["copy_bytes_per_s"],
               read_bw = bounds["read_bytes_per_s"];

  const ModelConfig config = ModelConfig::from_dir(model_dir);
  const TensorStore store = TensorStore::open_dir(model_dir);
  const int64_t x = prefill_arg.find('x');
  const int64_t prompts = std::stoll(prefill_arg.substr(0, x)),
                prompt_len = std::stoll(prefill_arg.substr(x + 1));
  int64_t max_decode = *std::max_element(decode.begin(), decode.end()), longest = prompt_len;
  for (const auto& [d, p] : mixed) {
    max_decode = std::max(max_decode, d + 1);
    longest = std::max(longest, p);
  }
  BackendOptions o;
  o.page_size = 16;
  const int64_t pages_per_seq = (std::max(context + 1, longest) + 15) / 16;
  o.num_pages = std::max(max_decode, prompts) * pages_per_seq + 1;
  const double t0 = now();
  auto backend = make_cuda_backend(config, store, o);
  std::fprintf(stderr, "loaded %s in %.1f s; %lld KV pages\n", model_dir.c_str(), now() - t0,
               static_cast<long long>(o.num_pages));
  const double params = static_cast<double>(config.num_matmul_parameters());
  const double weight_bytes = params * (backend->compute_dtype() == DType::kF32 ? 4 : 2);

  // One sequence per chunk, each with its own pages.
  auto batch_of = [&](int64_t seqs, int64_t cached, int64_t tokens) {
    ForwardBatch b;
    for (int64_t s = 0; s < seqs; ++s) {
      SeqChunk c;
      c.seq = s;
      c.num_cached = static_cast<int32_t>(cached);
      c.num_tokens = static_cast<int32_t>(tokens);
      c.token_offset = b.num_tokens();
      c.wants_logits = true;
      for (int64_t p = 0; p < pages_per_seq; ++p)
        c.block_table.push_back(static_cast<PageId>(s * pages_per_seq + p));
      for (int64_t t = 0; t < tokens; ++t) {
        b.tokens.push_back(static_cast<TokenId>((s * 7919 + t * 104729) % config.vocab_size));
        b.positions.push_back(static_cast<int32_t>(cached + t));
      }
      b.chunks.push_back(std::move(c));
    }
    return b;
  };
  auto time_step = [&](const ForwardBatch& b, CudaOpTimes& ops) {
    std::vector<TokenId> tokens(b.num_logit_rows());
    backend->set_op_timing(false);
    const double s = median_seconds(reps, [&] {
      if (!backend->forward_argmax(b, tokens)) throw Error("argmax declined");
    });
    backend->set_op_timing(true);
    backend->reset_op_times();
    if (!backend->forward_argmax(b, tokens)) throw Error("argmax declined");
    ops = backend->op_times();
    backend->set_op_timing(false);
    return s;
  };

  for (int64_t bsz : decode) {
    const ForwardBatch b = batch_of(bsz, context, 1);
    CudaOpTimes ops;
    const double s = time_step(b, ops);
    const double kv_bytes = static_cast<double>(bsz) * static_cast<double>(context + 1) *
                            static_cast<double>(backend->kv_bytes_per_token());
    // The step's bound: the weights and the KV read once at the copy bandwidth (bytes read +
    // written per second: a read-only stream is at least as fast), or the GEMMs at peak,
    // whichever is longer.
    const double bound = std::max((weight_bytes + kv_bytes) / copy_bw,
                                  2.0 * params * static_cast<double>(bsz) / peak);
    emit({{"kind", "decode"},
          {"batch", bsz},
          {"context", context},
          {"step_ms", s * 1e3},
          {"tokens_per_s", static_cast<double>(bsz) / s},
          {"fraction_of_step_bound", bound / s},
          {"attention_bytes_per_s", kv_bytes / (ops.attention * 1e-3)},
          {"attention_fraction_of_copy", kv_bytes / (ops.attention * 1e-3) / copy_bw},
          {"attention_fraction_of_read", kv_bytes / (ops.attention * 1e-3) / read_bw},
          {"ops", op_json(ops, 1)}});
  }
  {
    const ForwardBatch b = batch_of(prompts, 0, prompt_len);
    CudaOpTimes ops;
    const double s = time_step(b, ops);
    const double tokens = static_cast<double>(prompts * prompt_len);
    emit({{"kind", "prefill"},
          {"prompts", prompts},
          {"prompt_len", prompt_len},
          {"step_ms", s * 1e3},
          {"tokens_per_s", tokens / s},
          {"fraction_of_gemm_bound", 2.0 * params * tokens / peak / s},
          {"ops", op_json(ops, 1)}});
  }
  for (const auto& [d, p] : mixed) {
    ForwardBatch b = batch_of(d, context, 1);
    const ForwardBatch prompt = batch_of(d + 1, 0, p);  // its last chunk: sequence d
    SeqChunk c = prompt.chunks.back();
    c.token_offset = b.num_tokens();
    b.tokens.insert(b.tokens.end(), prompt.tokens.end() - p, prompt.tokens.end());
    b.positions.insert(b.positions.end(), prompt.positions.end() - p, prompt.positions.end());
    b.chunks.push_back(std::move(c));
    CudaOpTimes ops;
    const double s = time_step(b, ops);
    const double tokens = static_cast<double>(d + p);
    const double kv_bytes = static_cast<double>(d) * static_cast<double>(context + 1) *
                            static_cast<double>(backend->kv_bytes_per_token());
    const double bound =
        std::max((weight_bytes + kv_bytes) / copy_bw, 2.0 * params * tokens / peak);
    emit({{"kind", "mixed"},
          {"decodes", d},
          {"context", context},
          {"prompt_tokens", p},
          {"step_ms", s * 1e3},
          {"tokens_per_s", tokens / s},
          {"fraction_of_step_bound", bound / s},
          {"ops", op_json(ops, 1)}});
  }
  for (int64_t rows : draw_rows_list) bench_draws(rows, config.vocab_size, reps, read_bw);
  return 0;
}

}  // namespace
}  // namespace blend

int main(int argc, char** argv) {
  try {
    return blend::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_forward_bench: %s\n", e.what());
    return 1;
  }
}
