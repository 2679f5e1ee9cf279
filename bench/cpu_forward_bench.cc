// cpu backend throughput against the machine's GEMM compute bound (DESIGN.md §6: benchmarks
// report the median of several runs and the ratio to the bound). Prints JSON lines:
//   {"kind":"gemm", ...}     (a) GEMM FLOP/s at the model's shapes: oneDNN bf16/f32, OpenBLAS f32
//   {"kind":"forward", ...}  (b) tokens/s of prefill-only and decode-only steps, default and
//                            deterministic mode, (d) as a fraction of the GEMM bound
//   {"kind":"ops", ...}      (c) per-operation time of one large step
//
//   cpu_forward_bench --preset smollm-135m [--dtype bf16|f32] [--threads N]
//                     [--prefill 256,512,1024] [--prompt-len 256] [--decode 64,128,256]
//                     [--reps 5]
//   cpu_forward_bench --model DIR ...
// A preset is generated into $TMPDIR/blend-bench-PRESET-DTYPE once and reused.
//   options: --gemm-only, --no-gemm (only the bound: the model's GEMM kind at 512 and 1024
//   rows), --modes default,deterministic, --f32-gemm onednn|openblas, --q8-kernel
//   avx512-vnni|avx-vnni|avx2|portable (a Q8_0 or Q4_K_M model, e.g. a `blend model import-gguf`
//   folder: the integer kernel to run at most)
//   {"kind":"overlap", ...}  with --overlap P:S:C (issue 8: NanoFlow §4.3 carried to the CPU):
//                            a compute-heavy step (P prefill tokens) and a memory-heavy one (S
//                            decodes at C cached tokens each), one after the other on all the
//                            threads against both at once, each on half of them
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <dnnl.hpp>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/q8_gemm.h"
#include "bench_util.h"
#include "core/error.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"

namespace blend {
namespace {

using nlohmann::json;

using bench::emit;
using bench::median_run;
using bench::median_seconds;
using bench::now;
using bench::parse_list;

// A forward step's median time, with the per-op times of that same run.
double median_forward(int reps, CpuBackend& backend, const ForwardBatch& batch,
                      std::vector<float>& logits, CpuOpTimes& ops) {
  std::vector<CpuOpTimes> runs;
  const auto [index, seconds] = median_run(reps, [&] {
    backend.reset_op_times();
    backend.forward(batch, logits);
    runs.push_back(backend.op_times());
  });
  ops = runs[index + 1];  // runs[0] is the warm-up
  return seconds;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

struct Options {
  std::string model_dir, preset = "smollm-135m", dtype = "bf16", modes = "default,deterministic";
  int threads = 0, reps = 5;
  int64_t prompt_len = 256;  // prefill batches are made of prompts of this length
  std::vector<int64_t> prefill = {256, 512, 1024}, decode = {64, 128, 256};
  bool gemm = true, forward = true;
  int64_t overlap_prefill = 0, overlap_seqs = 0, overlap_context = 0;  // --overlap P:S:C
  CpuGemmLib f32_gemm = CpuGemmLib::kOneDnn;
};

struct Shape {
  const char* name;
  int64_t k, n;
  int64_t per_layer;  // how many times a layer runs it (lm_head: 0)
};

std::vector<Shape> model_shapes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  return {{"qkv", h, q + 2 * kv, 1},
          {"o_proj", q, h, 1},
          {"gate_up", h, 2 * f, 1},
          {"down", f, h, 1},
          {"lm_head", h, c.vocab_size, 0}};
}

// Times one GEMM shape through the backend's own Linear (packed weights, same kernels).
double gemm_seconds(cpu::GemmContext& ctx, const Shape& s, int64_t m, int reps) {
  const DType dt = ctx.options().compute;
  std::vector<std::byte> w(static_cast<size_t>(s.k * s.n) * dtype_size(dt));
  std::mt19937 rng(1);
  for (size_t i = 0; i + 1 < w.size(); i += 2) {  // small random values in either dtype
    const float v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
    if (dt == DType::kF32) {
      if (i % 4 == 0) std::memcpy(&w[i], &v, 4);
    } else {
      const uint16_t b = f32_to_bf16(v);
      std::memcpy(&w[i], &b, 2);
    }
  }
  TensorView view;
  view.name = s.name;
  view.dtype = dt;
  view.shape = {s.n, s.k};
  view.data = w.data();
  view.nbytes = w.size();
  cpu::Linear linear(ctx, {&view});
  const int64_t mp = ctx.padded_rows(m);
  std::vector<std::byte> x(static_cast<size_t>(mp * s.k) * dtype_size(dt), std::byte{0x3c});
  std::vector<float> y(mp * s.n);
  return median_seconds(reps, [&] { linear.forward(x.data(), m, y.data()); });
}

// (a) GEMM FLOP/s per shape, and the aggregate over the four layer GEMMs (weighted by how
// often a forward pass runs them): that aggregate is the compute bound of the forward pass.
// With `all` false only the variant the forward pass uses is measured, at 512 and 1024 rows
// (enough for the bound, and quick).
double bench_gemms(const ModelConfig& c, const Options& o, DType model_dtype, bool all) {
  double bound = 0;
  struct Variant {
    const char* name;
    cpu::GemmOptions options;
  };
  std::vector<Variant> variants = {
      {"onednn_bf16", {.compute = DType::kBF16, .lib = cpu::GemmLib::kOneDnn}},
      {"onednn_f32", {.compute = DType::kF32, .lib = cpu::GemmLib::kOneDnn}},
      {"openblas_f32", {.compute = DType::kF32, .lib = cpu::GemmLib::kOpenBlas}}};
  // The bound is the variant the forward pass runs: bf16 checkpoints compute in f32 where
  // oneDNN has no bf16 matmul (AVX2-only CPUs).
  const DType compute = cpu_compute_dtype(model_dtype);
  const std::string bound_variant = compute == DType::kBF16               ? "onednn_bf16"
                                    : o.f32_gemm == CpuGemmLib::kOpenBlas ? "openblas_f32"
                                                                          : "onednn_f32";
  for (const auto& v : variants) {
    if (!all && v.name != bound_variant) continue;
    if (v.options.compute == DType::kBF16 && !cpu::onednn_has_bf16_matmul()) continue;
    cpu::GemmContext ctx(v.options);
    // GEMMs run several times slower for the first few hundred ms of the process on this
    // machine (observed, cause not pinned down); burn a second on an untimed shape.
    for (const double t0 = now(); now() - t0 < 1.0;) gemm_seconds(ctx, model_shapes(c)[0], 256, 3);
    for (int64_t m : {int64_t{256}, int64_t{512}, int64_t{1024}}) {
      if (!all && m == 256) continue;
      double layer_flops = 0, layer_time = 0;
      for (const Shape& s : model_shapes(c)) {
        if (s.per_layer == 0 && (m != 256 || !all)) continue;  // lm_head: decode-sized batches
        const double t = gemm_seconds(ctx, s, m, o.reps);
        const double flops = 2.0 * m * s.k * s.n;
        emit({{"kind", "gemm"},
              {"lib", v.name},
              {"shape", s.name},
              {"m", m},
              {"k", s.k},
              {"n", s.n},
              {"ms", t * 1e3},
              {"gflops", flops / t / 1e9}});
        if (s.per_layer) {
          layer_flops += flops;
          layer_time += t;
        }
      }
      const double rate = layer_flops / layer_time;
      emit({{"kind", "gemm_bound"}, {"lib", v.name}, {"m", m}, {"gflops", rate / 1e9}});
      if (v.name == bound_variant) bound = std::max(bound, rate);
    }
  }
  return bound;
}

struct Seq {
  std::vector<TokenId> tokens;
  std::vector<PageId> pages;
};

// Random prompts of up to `prompt_len` tokens, `tokens` in all, one logits row each, in fresh
// pages numbered from `next_page` on (advanced past them).
ForwardBatch prefill_batch(int64_t tokens, int64_t prompt_len, int page, PageId& next_page,
                           const std::function<std::vector<TokenId>(int64_t)>& random_tokens) {
  ForwardBatch b;
  for (int64_t s = 0; s * prompt_len < tokens; ++s) {
    const int64_t n = std::min(prompt_len, tokens - s * prompt_len);
    SeqChunk ch;
    ch.seq = s;
    ch.num_tokens = static_cast<int32_t>(n);
    ch.token_offset = b.num_tokens();
    ch.wants_logits = true;
    for (int64_t k = 0; k < (n + page - 1) / page; ++k) ch.block_table.push_back(next_page++);
    const auto t = random_tokens(n);
    for (int64_t i = 0; i < n; ++i) {
      b.tokens.push_back(t[static_cast<size_t>(i)]);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    b.chunks.push_back(ch);
  }
  return b;
}

// The first `n` tokens of `prompt` as one sequence in `pages`, no logits (fills a template).
ForwardBatch template_batch(const std::vector<TokenId>& prompt, int64_t n,
                            std::vector<PageId> pages) {
  ForwardBatch b;
  SeqChunk ch;
  ch.num_tokens = static_cast<int32_t>(n);
  ch.block_table = std::move(pages);
  b.tokens.assign(prompt.begin(), prompt.begin() + n);
  for (int64_t i = 0; i < n; ++i) b.positions.push_back(static_cast<int32_t>(i));
  b.chunks.push_back(ch);
  return b;
}

// One decode token for each of the first `seqs` sequences: sequence s has contexts[s] cached
// tokens of `prompt` in tables[s] and decodes prompt[contexts[s]].
ForwardBatch decode_batch(int64_t seqs, const std::vector<int64_t>& contexts,
                          const std::vector<std::vector<PageId>>& tables,
                          const std::vector<TokenId>& prompt) {
  ForwardBatch b;
  for (int64_t s = 0; s < seqs; ++s) {
    const auto i = static_cast<size_t>(s);
    SeqChunk ch;
    ch.seq = s;
    ch.num_cached = static_cast<int32_t>(contexts[i]);
    ch.num_tokens = 1;
    ch.token_offset = b.num_tokens();
    ch.block_table = tables[i];
    ch.wants_logits = true;
    b.tokens.push_back(prompt[static_cast<size_t>(contexts[i])]);
    b.positions.push_back(static_cast<int32_t>(contexts[i]));
    b.chunks.push_back(ch);
  }
  return b;
}

// (b)-(d) for one mode.
void bench_forward(const ModelConfig& c, const TensorStore& store, const Options& o,
                   bool deterministic, double bound) {
  const int page = 16;
  const int64_t max_ctx = 256, min_ctx = 128;
  const int64_t max_decode =
      o.decode.empty() ? 0 : *std::max_element(o.decode.begin(), o.decode.end());
  const int64_t max_prefill =
      o.prefill.empty() ? 0 : *std::max_element(o.prefill.begin(), o.prefill.end());
  const int64_t pages_per_seq = (max_ctx + 1 + page - 1) / page;
  BackendOptions bo;
  bo.threads = o.threads;
  bo.deterministic = deterministic;
  bo.page_size = page;
  bo.num_pages = (max_decode + 1) * pages_per_seq + (max_prefill + page - 1) / page + 1;
  const double t_load = now();
  auto backend = make_cpu_backend(c, store, bo, o.f32_gemm);
  const char* mode = deterministic ? "deterministic" : "default";
  emit({{"kind", "load"},
        {"mode", mode},
        {"seconds", now() - t_load},
        {"gemm", backend->gemm_info()},
        {"kv_bytes_per_page", backend->kv_bytes_per_page()},
        {"num_pages", backend->num_pages()}});

  const int64_t layer_params = c.num_matmul_parameters() - c.vocab_size * c.hidden_size;
  const int64_t lm_params = c.vocab_size * c.hidden_size;
  std::mt19937 rng(7);
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> t(n);
    for (auto& e : t) e = static_cast<TokenId>(rng() % c.vocab_size);
    return t;
  };
  PageId next_page = 0;
  auto take_pages = [&](int64_t n) {
    std::vector<PageId> p(n);
    for (auto& e : p) e = next_page++;
    return p;
  };

  // context: prompt length (prefill) or average cached tokens (decode) per sequence.
  auto report = [&](const char* phase, int64_t batch, int64_t tokens, int64_t logit_rows,
                    int64_t context, double seconds, const CpuOpTimes& ops) {
    const double gemm_flops = 2.0 * (layer_params * tokens + lm_params * logit_rows);
    json j = {{"kind", "forward"},
              {"mode", mode},
              {"phase", phase},
              {"batch", batch},
              {"tokens", tokens},
              {"context", context},
              {"ms", seconds * 1e3},
              {"tokens_per_s", tokens / seconds},
              {"gemm_gflops", gemm_flops / seconds / 1e9}};
    if (bound > 0) {
      j["bound_gflops"] = bound / 1e9;
      // (d) useful GEMM FLOPs per second over the measured GEMM rate at these shapes.
      j["fraction_of_bound"] = gemm_flops / seconds / bound;
      // The brief's formula, tokens/s * 2 * matmul params (lm_head counted for every token).
      j["fraction_formula"] = tokens / seconds * 2.0 * c.num_matmul_parameters() / bound;
    }
    emit(j);
    const double n = static_cast<double>(ops.steps);
    emit({{"kind", "ops"},
          {"mode", mode},
          {"phase", phase},
          {"tokens", tokens},
          {"ms",
           {{"embed_checks", ops.embed / n * 1e3},
            {"norm", ops.norm / n * 1e3},
            {"qkv", ops.qkv / n * 1e3},
            {"rope_kv_write", ops.rope_kv / n * 1e3},
            {"attention", ops.attention / n * 1e3},
            {"o_proj", ops.o_proj / n * 1e3},
            {"gate_up", ops.gate_up / n * 1e3},
            {"act", ops.act / n * 1e3},
            {"down", ops.down / n * 1e3},
            {"lm_head", ops.lm_head / n * 1e3},
            {"total", ops.total() / n * 1e3}}}});
  };

  // Prefill-only: prompts of o.prompt_len tokens (or the whole batch when smaller), one logits
  // row each.
  for (int64_t tokens : o.prefill) {
    const int64_t per_seq = std::min<int64_t>(o.prompt_len, tokens);
    const PageId first = next_page;
    const ForwardBatch b = prefill_batch(tokens, per_seq, page, next_page, random_tokens);
    std::vector<float> logits(b.num_logit_rows() * c.vocab_size);
    CpuOpTimes ops;
    const double t = median_forward(o.reps, *backend, b, logits, ops);
    report("prefill", static_cast<int64_t>(b.chunks.size()), tokens, b.num_logit_rows(), per_seq, t,
           ops);
    next_page = first;  // prefill pages are reused by the next size
  }
  next_page = static_cast<PageId>((max_prefill + page - 1) / page + 1);

  if (max_decode == 0) return;
  // Decode-only: one template prompt of max_ctx tokens is prefilled once; every decode sequence
  // gets its own copies of its pages (copy_page), so attention reads distinct memory.
  Seq tmpl{random_tokens(max_ctx + 1), take_pages(pages_per_seq)};
  backend->forward(template_batch(tmpl.tokens, max_ctx, tmpl.pages), {});
  std::vector<int64_t> contexts(max_decode);
  std::vector<std::vector<PageId>> tables(max_decode);
  for (int64_t s = 0; s < max_decode; ++s) {
    contexts[s] = min_ctx + static_cast<int64_t>(rng() % (max_ctx - min_ctx + 1));
    tables[s] = take_pages(contexts[s] / page + 1);
    for (size_t p = 0; p < tables[s].size(); ++p) backend->copy_page(tmpl.pages[p], tables[s][p]);
  }
  for (int64_t batch : o.decode) {
    const ForwardBatch b = decode_batch(batch, contexts, tables, tmpl.tokens);
    const int64_t ctx_sum = std::accumulate(contexts.begin(), contexts.begin() + batch, int64_t{0});
    std::vector<float> logits(b.num_logit_rows() * c.vocab_size);
    CpuOpTimes ops;
    const double t = median_forward(o.reps, *backend, b, logits, ops);
    report("decode", batch, batch, batch, ctx_sum / batch, t, ops);
  }
}

// Does splitting the cores between a compute-bound and a memory-bound step beat running them
// one after the other on all cores? Each step gets a backend of its own (same weights, own KV),
// once with all threads and once with half; the concurrent pair runs on two std::threads, each
// backend's forward() setting its own thread's OpenMP team size.
void bench_overlap(const ModelConfig& c, const TensorStore& store, const Options& o, int threads) {
  const int page = 16;
  const int64_t p = o.overlap_prefill, seqs = o.overlap_seqs, ctx = o.overlap_context;
  const int64_t ctx_pages = (ctx + 1 + page - 1) / page;
  std::mt19937 rng(11);
  auto random_tokens = [&](int64_t n) {
    std::vector<TokenId> t(static_cast<size_t>(n));
    for (auto& e : t) e = static_cast<TokenId>(rng() % c.vocab_size);
    return t;
  };
  auto make = [&](int backend_threads, int64_t pages) {
    BackendOptions bo;
    bo.threads = backend_threads;
    bo.page_size = page;
    bo.num_pages = pages;
    return make_cpu_backend(c, store, bo, o.f32_gemm);
  };
  // The compute-heavy step: prompts of o.prompt_len tokens, p in all.
  PageId next = 0;
  const ForwardBatch prefill = prefill_batch(p, o.prompt_len, page, next, random_tokens);
  const int64_t prefill_pages = next;
  // The memory-heavy step: seqs decodes, each over its own copy of a ctx-token prompt held in
  // pages [0, ctx_pages).
  const std::vector<TokenId> prompt = random_tokens(ctx + 1);
  std::vector<std::vector<PageId>> tables(static_cast<size_t>(seqs + 1));
  for (int64_t s = 0; s <= seqs; ++s)
    for (int64_t k = 0; k < ctx_pages; ++k)
      tables[static_cast<size_t>(s)].push_back(static_cast<PageId>(s * ctx_pages + k));
  const std::vector<int64_t> contexts(static_cast<size_t>(seqs), ctx);
  const ForwardBatch decode = decode_batch(
      seqs, contexts, std::vector<std::vector<PageId>>(tables.begin() + 1, tables.end()), prompt);
  const int64_t decode_pages = (seqs + 1) * ctx_pages;
  auto fill_kv = [&](Backend& b) {  // the prompt into pages [0, ctx_pages), then copied
    b.forward(template_batch(prompt, ctx, tables[0]), {});
    for (int64_t s = 1; s <= seqs; ++s)
      for (int64_t k = 0; k < ctx_pages; ++k)
        b.copy_page(static_cast<PageId>(k), static_cast<PageId>(s * ctx_pages + k));
  };
  const int half = std::max(1, threads / 2);
  auto compute_all = make(threads, prefill_pages), compute_half = make(half, prefill_pages);
  auto memory_all = make(threads, decode_pages), memory_half = make(half, decode_pages);
  fill_kv(*memory_all);
  fill_kv(*memory_half);
  std::vector<float> logits_p(static_cast<size_t>(prefill.num_logit_rows() * c.vocab_size));
  std::vector<float> logits_d(static_cast<size_t>(decode.num_logit_rows() * c.vocab_size));
  const double t_compute = median_seconds(o.reps, [&] { compute_all->forward(prefill, logits_p); });
  const double t_memory = median_seconds(o.reps, [&] { memory_all->forward(decode, logits_d); });
  const double t_compute_half =
      median_seconds(o.reps, [&] { compute_half->forward(prefill, logits_p); });
  const double t_memory_half =
      median_seconds(o.reps, [&] { memory_half->forward(decode, logits_d); });
  const double t_both = median_seconds(o.reps, [&] {
    std::thread other([&] { memory_half->forward(decode, logits_d); });
    compute_half->forward(prefill, logits_p);
    other.join();
  });
  emit({{"kind", "overlap"},
        {"threads", threads},
        {"prefill_tokens", p},
        {"decode_seqs", seqs},
        {"context", ctx},
        {"compute_ms", t_compute * 1e3},
        {"memory_ms", t_memory * 1e3},
        {"sequential_ms", (t_compute + t_memory) * 1e3},
        {"compute_half_ms", t_compute_half * 1e3},
        {"memory_half_ms", t_memory_half * 1e3},
        {"overlapped_ms", t_both * 1e3},
        {"speedup", (t_compute + t_memory) / t_both}});
}

int run(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--model")
      o.model_dir = value();
    else if (a == "--preset")
      o.preset = value();
    else if (a == "--dtype")
      o.dtype = value();
    else if (a == "--threads")
      o.threads = std::stoi(value());
    else if (a == "--reps")
      o.reps = std::stoi(value());
    else if (a == "--prefill")
      o.prefill = parse_list(value());
    else if (a == "--decode")
      o.decode = parse_list(value());
    else if (a == "--prompt-len")
      o.prompt_len = std::stoll(value());
    else if (a == "--modes")
      o.modes = value();
    else if (a == "--gemm-only")
      o.forward = false;
    else if (a == "--no-gemm")
      o.gemm = false;
    else if (a == "--overlap") {
      const std::vector<int64_t> v = parse_list([&] {
        std::string x = value();
        std::replace(x.begin(), x.end(), ':', ',');
        return x;
      }());
      if (v.size() != 3) throw Error("--overlap takes PREFILL:SEQS:CONTEXT");
      o.overlap_prefill = v[0];
      o.overlap_seqs = v[1];
      o.overlap_context = v[2];
    } else if (a == "--f32-gemm") {
      o.f32_gemm = value() == "openblas" ? CpuGemmLib::kOpenBlas : CpuGemmLib::kOneDnn;
    } else if (a == "--q8-kernel") {  // Q8_0 / Q4_K_M: cap the integer kernels
      const std::string k = value();
      bool found = false;
      for (const cpu::Q8Kernel kernel : {cpu::Q8Kernel::kAvx512Vnni, cpu::Q8Kernel::kAvxVnni,
                                         cpu::Q8Kernel::kAvx2, cpu::Q8Kernel::kPortable})
        if (cpu::q8_kernel_name(kernel) == k) {
          cpu::cap_q8_kernel(kernel);
          found = true;
        }
      if (!found) throw Error("--q8-kernel: avx512-vnni, avx-vnni, avx2 or portable, not " + k);
      if (cpu::q8_kernel_name(cpu::best_q8_kernel()) != k)
        throw Error("--q8-kernel " + k + ": this CPU does not run it");
    } else {
      throw Error("unknown argument " + a);
    }
  }
  const int threads = o.threads > 0 ? o.threads : omp_get_num_procs();
  omp_set_num_threads(threads);

  std::filesystem::path dir = o.model_dir;
  if (dir.empty()) {
    auto config = find_model_preset(o.preset);
    if (!config) throw Error("unknown preset " + o.preset);
    const auto tmp =
        std::filesystem::temp_directory_path() / ("blend-bench-" + o.preset + "-" + o.dtype);
    RandomInitOptions ro;
    ro.dtype = o.dtype == "f32" ? DType::kF32 : DType::kBF16;
    ro.tokenizer_dir = default_tokenizer_dir();
    if (!std::filesystem::exists(tmp / "config.json")) {  // generated once, reused by later runs
      const double t0 = now();
      write_random_model(*config, tmp, ro);
      emit({{"kind", "generate"},
            {"preset", o.preset},
            {"dtype", o.dtype},
            {"dir", tmp.string()},
            {"seconds", now() - t0}});
    }
    dir = tmp;
  }
  const ModelConfig config = ModelConfig::from_dir(dir);
  const TensorStore store = TensorStore::open_dir(dir);
  const DType dtype = check_tensors(config, store, QuantizedWeights::kAllowMatrices);
  emit({{"kind", "machine"},
        {"cpu", cpu_model_name()},
        {"threads", threads},
        {"onednn_isa", static_cast<int>(dnnl::get_effective_cpu_isa())},
        {"model", o.model_dir.empty() ? o.preset : o.model_dir},
        {"dtype", dtype_name(dtype)},
        {"matmul_params", config.num_matmul_parameters()}});

  if (o.overlap_prefill > 0) {
    bench_overlap(config, store, o, threads);
    return 0;
  }
  // The bound is always measured (the forward fractions need it); --no-gemm skips the table.
  const double bound = bench_gemms(config, o, dtype, o.gemm);
  if (o.forward) {
    if (o.modes.find("default") != std::string::npos) bench_forward(config, store, o, false, bound);
    if (o.modes.find("deterministic") != std::string::npos)
      bench_forward(config, store, o, true, bound);
  }
  return 0;
}

}  // namespace
}  // namespace blend

int main(int argc, char** argv) {
  try {
    return blend::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_forward_bench: %s\n", e.what());
    return 1;
  }
}
