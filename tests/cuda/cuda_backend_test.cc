// The cuda backend against the cpu backend (issue 28). The layout tests and the no-GPU refusal
// run everywhere; the rest need a GPU and skip with a message without one (CI has none: they
// run on the GPU machine, bench/gpu/README.md).
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <memory_resource>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/batch_layout.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/knobs.h"
#include "backend/cuda/nano_split.h"
#include "backend/cuda/pinned_memory.h"
#include "backend/cuda/sm_partition.h"
#include "core/error.h"
#include "model/presets.h"
#include "model/random_init.h"
#include "model/safetensors.h"
#include "test_models.h"
#include "test_util.h"

namespace blend {
namespace {

// ---------------------------------------------------------------------------------------------
// BatchLayout: what the kernels read, packed on the host.

TEST(BatchLayout, PacksTokensTablesDirectionsAndLogitRows) {
  ForwardBatch b;
  b.tokens = {5, 6, 7, 8, 9};
  b.positions = {3, 4, 5, 0, 1};
  SeqChunk a{.seq = 1,
             .num_cached = 3,
             .num_tokens = 3,
             .token_offset = 0,
             .block_table = {10, 11, 12, 99},
             .wants_logits = true,
             .reversed_pages = {0, 1}};
  SeqChunk c{.seq = 2,
             .num_cached = 0,
             .num_tokens = 2,
             .token_offset = 3,
             .block_table = {20},
             .wants_logits = false,
             .reversed_pages = {}};
  b.chunks = {a, c};
  const cuda::BatchLayout l = cuda::layout_batch(b, /*page_size=*/2);
  auto at = [&](int64_t offset, int64_t n) {
    return std::vector<int32_t>(l.data.begin() + offset, l.data.begin() + offset + n);
  };
  EXPECT_EQ(l.num_tokens, 5);
  EXPECT_EQ(l.num_chunks, 2);
  EXPECT_EQ(at(l.tokens, 5), (std::vector<int32_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ(at(l.positions, 5), (std::vector<int32_t>{3, 4, 5, 0, 1}));
  EXPECT_EQ(at(l.token_chunk, 5), (std::vector<int32_t>{0, 0, 0, 1, 1}));
  // Chunk a reaches position 5: pages 0..2 of its table (page 99 is beyond and not copied).
  EXPECT_EQ(at(l.chunk_table, 2), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(at(l.tables, 4), (std::vector<int32_t>{10, 11, 12, 20}));
  EXPECT_EQ(at(l.reversed, 4), (std::vector<int32_t>{0, 1, 0, 0}));
  ASSERT_EQ(l.num_logit_rows, 1);
  EXPECT_EQ(at(l.logit_rows, 1), (std::vector<int32_t>{2}));
  // No prefill tiles asked for: every token goes to the single-token kernel.
  EXPECT_EQ(l.num_prefill_tiles, 0);
  EXPECT_EQ(at(l.single_tokens, 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(l.max_single_context, 6);  // chunk a's last token is at position 5
  EXPECT_EQ(l.table_capacity, 4);
  EXPECT_EQ(static_cast<int64_t>(l.data.size()), l.reversed + 4);  // the tables come last
}

// What a CUDA graph of a step replays: every array's offset in the packed metadata, and its size.
void expect_same_offsets(const cuda::BatchLayout& a, const cuda::BatchLayout& b) {
  for (auto offset :
       {&cuda::BatchLayout::tokens, &cuda::BatchLayout::positions, &cuda::BatchLayout::token_chunk,
        &cuda::BatchLayout::chunk_table, &cuda::BatchLayout::logit_rows,
        &cuda::BatchLayout::prefill_tiles, &cuda::BatchLayout::single_tokens,
        &cuda::BatchLayout::tables, &cuda::BatchLayout::reversed})
    EXPECT_EQ(a.*offset, b.*offset);
  EXPECT_EQ(a.data.size(), b.data.size());
}

// A CUDA graph of a decode step (BLEND_CUDA_GRAPHS) replays the kernels' arguments: two decode
// steps of the same count whose sequences reach different numbers of pages keep every offset
// when the tables' capacity holds both; the tables hold each step's own pages, zeros after.
TEST(BatchLayout, DecodeStepsOfOneCountKeepTheirOffsetsWithinTheTableCapacity) {
  auto decodes = [](std::vector<int32_t> contexts) {
    ForwardBatch b;
    for (size_t i = 0; i < contexts.size(); ++i) {
      SeqChunk c{.seq = static_cast<SeqId>(i),
                 .num_cached = contexts[i],
                 .num_tokens = 1,
                 .token_offset = static_cast<int32_t>(i),
                 .block_table = {},
                 .wants_logits = true};
      for (int32_t p = 0; p <= contexts[i] / 4; ++p)
        c.block_table.push_back(static_cast<PageId>(100 * i + p));
      b.tokens.push_back(7);
      b.positions.push_back(contexts[i]);
      b.chunks.push_back(c);
    }
    return b;
  };
  const ForwardBatch early = decodes({3, 9, 14}), later = decodes({4, 12, 15});
  const cuda::BatchLayout a = cuda::layout_batch(early, 4, 16, 8, /*table_capacity=*/16);
  const cuda::BatchLayout b = cuda::layout_batch(later, 4, 16, 8, 16);
  expect_same_offsets(a, b);
  EXPECT_EQ(a.table_capacity, 16);
  // 1 + 3 + 4 pages before, 2 + 4 + 4 after.
  EXPECT_EQ(std::vector<int32_t>(a.data.begin() + a.tables, a.data.begin() + a.tables + 9),
            (std::vector<int32_t>{0, 100, 101, 102, 200, 201, 202, 203, 0}));
  EXPECT_EQ(std::vector<int32_t>(b.data.begin() + b.tables, b.data.begin() + b.tables + 11),
            (std::vector<int32_t>{0, 1, 100, 101, 102, 103, 200, 201, 202, 203, 0}));
  // Past the capacity the tables grow, and the offsets after them move.
  const cuda::BatchLayout small = cuda::layout_batch(later, 4, 16, 8, 4);
  EXPECT_EQ(small.table_capacity, 10);
  EXPECT_EQ(small.tables, b.tables);
  EXPECT_NE(small.reversed, b.reversed);
}

// Decode graphs are captured for 1, 2, 4 and multiples of 8 rows (as vLLM's); a step of fewer
// rows is padded to its graph's count with rows of token 0 at position 0 on a scratch page, after
// its own rows. Padded steps of 5 and 7 rows have the layout offsets of one 8-row graph, and
// their own rows are packed as they were.
TEST(BatchLayout, DecodeStepsPaddedToTheirGraphsRowsShareItsOffsets) {
  for (const auto& [rows, graph] : std::vector<std::pair<int32_t, int32_t>>{
           {1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8}, {8, 8}, {9, 16}, {500, 504}, {512, 512}})
    EXPECT_EQ(cuda::graph_rows(rows), graph) << rows;
  EXPECT_EQ(cuda::graph_rows(513), 0);
  EXPECT_EQ(cuda::graph_rows(0), 0);
  auto decodes = [](int32_t n) {
    ForwardBatch b;
    for (int32_t i = 0; i < n; ++i) {
      SeqChunk c{.seq = static_cast<SeqId>(i + 1),
                 .num_cached = 5 + i,
                 .num_tokens = 1,
                 .token_offset = i,
                 .block_table = {100 * i, 100 * i + 1, 100 * i + 2},
                 .wants_logits = true};
      b.tokens.push_back(40 + i);
      b.positions.push_back(5 + i);
      b.chunks.push_back(c);
    }
    return b;
  };
  constexpr PageId kScratch = 77;
  const ForwardBatch five = cuda::pad_decode_batch(decodes(5), 8, kScratch),
                     seven = cuda::pad_decode_batch(decodes(7), 8, kScratch);
  ASSERT_EQ(five.num_tokens(), 8);
  EXPECT_EQ(five.num_logit_rows(), 8);
  const cuda::BatchLayout a = cuda::layout_batch(five, 4, 16, 8, /*table_capacity=*/256);
  const cuda::BatchLayout b = cuda::layout_batch(seven, 4, 16, 8, 256);
  expect_same_offsets(a, b);
  EXPECT_EQ(a.num_single_tokens, 8);
  EXPECT_EQ(a.max_single_context, 10);  // the batch's own rows decide it, not the padding
  // The five rows as they were, then three of token 0 at position 0, logit rows 0..7, and each
  // padding row's table the scratch page alone.
  EXPECT_EQ(std::vector<int32_t>(a.data.begin() + a.tokens, a.data.begin() + a.tokens + 8),
            (std::vector<int32_t>{40, 41, 42, 43, 44, 0, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(a.data.begin() + a.positions, a.data.begin() + a.positions + 8),
            (std::vector<int32_t>{5, 6, 7, 8, 9, 0, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(a.data.begin() + a.logit_rows, a.data.begin() + a.logit_rows + 8),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // (Rows 0-2 reach 2 pages each, rows 3-4 three: 12 entries before the padding's.)
  EXPECT_EQ(std::vector<int32_t>(a.data.begin() + a.tables + 10, a.data.begin() + a.tables + 16),
            (std::vector<int32_t>{401, 402, kScratch, kScratch, kScratch, 0}));
  // A step already at its graph's count is unchanged.
  EXPECT_EQ(cuda::pad_decode_batch(decodes(8), 8, kScratch).chunks.size(), 8u);
}

TEST(BatchLayout, CutsLongChunksIntoPrefillTilesAndLeavesTheRestSingle) {
  ForwardBatch b;
  auto add = [&](SeqId seq, int32_t cached, int32_t n) {
    SeqChunk c{.seq = seq,
               .num_cached = cached,
               .num_tokens = n,
               .token_offset = b.num_tokens(),
               .block_table = std::vector<PageId>(64, 0)};
    for (int32_t i = 0; i < n; ++i) {
      b.tokens.push_back(1);
      b.positions.push_back(cached + i);
    }
    b.chunks.push_back(c);
  };
  add(1, 40, 1);   // a decode: single
  add(2, 0, 37);   // a prompt: tiles of 16, 16, 5
  add(3, 10, 3);   // a short chunk: single
  add(4, 20, 16);  // exactly one tile
  const cuda::BatchLayout l = cuda::layout_batch(b, 16, /*tile_tokens=*/16, /*min_tile_chunk=*/8);
  auto at = [&](int64_t offset, int64_t n) {
    return std::vector<int32_t>(l.data.begin() + offset, l.data.begin() + offset + n);
  };
  ASSERT_EQ(l.num_prefill_tiles, 4);
  EXPECT_EQ(at(l.prefill_tiles, 8), (std::vector<int32_t>{1, 16, 17, 16, 33, 5, 41, 16}));
  ASSERT_EQ(l.num_single_tokens, 4);
  EXPECT_EQ(at(l.single_tokens, 4), (std::vector<int32_t>{0, 38, 39, 40}));
}

// A nano-batch's layout is the whole batch's layout of the same chunks, counted from the
// range's first token and chunk: the second chunk alone packs as a batch of that chunk would.
TEST(BatchLayout, ChunkRangesCountFromTheirFirstTokenAndChunk) {
  ForwardBatch b;
  b.tokens = {5, 6, 7, 8, 9, 4};
  b.positions = {3, 4, 5, 0, 1, 7};
  b.chunks = {SeqChunk{.seq = 1,
                       .num_cached = 3,
                       .num_tokens = 3,
                       .token_offset = 0,
                       .block_table = {10, 11, 12},
                       .wants_logits = true},
              SeqChunk{.seq = 2,
                       .num_cached = 0,
                       .num_tokens = 2,
                       .token_offset = 3,
                       .block_table = {20},
                       .wants_logits = true,
                       .reversed_pages = {1}},
              SeqChunk{.seq = 3,
                       .num_cached = 7,
                       .num_tokens = 1,
                       .token_offset = 5,
                       .block_table = {30, 31, 32, 33},
                       .wants_logits = true}};
  const cuda::BatchLayout tail = cuda::layout_chunks(b, 1, 3, /*page_size=*/2);
  ForwardBatch alone;
  alone.tokens = {8, 9, 4};
  alone.positions = {0, 1, 7};
  alone.chunks = {b.chunks[1], b.chunks[2]};
  alone.chunks[0].token_offset = 0;
  alone.chunks[1].token_offset = 2;
  const cuda::BatchLayout whole = cuda::layout_batch(alone, 2);
  EXPECT_EQ(tail.num_tokens, 3);
  EXPECT_EQ(tail.num_chunks, 2);
  EXPECT_EQ(tail.num_logit_rows, 2);
  EXPECT_EQ(tail.max_single_context, 8);
  EXPECT_EQ(tail.data, whole.data);
  EXPECT_EQ(tail.logit_rows, whole.logit_rows);
  EXPECT_EQ(tail.single_tokens, whole.single_tokens);
  // The head alone is the first chunk, and the three ranges' sizes add up.
  const cuda::BatchLayout head = cuda::layout_chunks(b, 0, 1, 2);
  EXPECT_EQ(head.num_tokens, 3);
  EXPECT_EQ(head.num_logit_rows, 1);
  EXPECT_EQ(cuda::layout_chunks(b, 0, 3, 2).data, cuda::layout_batch(b, 2).data);
}

// ---------------------------------------------------------------------------------------------
// Nano-batch cuts (nano_split.h), on an H100-like 8B step: 2e-5 s per token of GEMMs, 7.3 ms
// per weight read, 6e-8 s per cached token of attention (131 KB per token at 2.2 TB/s).
cuda::NanoCost h100_like(double interference = 0.71) {
  return {.gemm_seconds_per_token = 2e-5,
          .weight_seconds = 7.3e-3,
          .kv_seconds_per_token = 6e-8,
          .interference = interference};
}

std::vector<cuda::ChunkWork> decodes(int n, int context) {
  return std::vector<cuda::ChunkWork>(n, cuda::ChunkWork{.tokens = 1, .cached = context});
}

// The cut is the brute-force best over every cut of the model, and it only splits for a gain.
TEST(NanoSplit, PicksTheShortestPipelineAndSplitsOnlyForAGain) {
  // 256 decodes at 1,024 cached tokens, then a 2,048-token prompt chunk: GEMMs 45 ms, decode
  // attention 15.7 ms. The decodes' attention belongs beside the prompt's GEMMs.
  std::vector<cuda::ChunkWork> step = decodes(256, 1024);
  step.push_back({.tokens = 2048, .cached = 0});
  const cuda::NanoCost cost = h100_like();
  const cuda::NanoSplit s = cuda::choose_nano_split(step, cost);
  ASSERT_GT(s.cut, 0);
  double best = 1e30;
  int best_cut = 0;
  for (size_t c = 1; c < step.size(); ++c) {
    double gx = 0, ax = 0, gy = 0, ay = 0, tx = 0, ty = 0;
    for (size_t i = 0; i < step.size(); ++i) {
      const double a = cuda::nano_attention_seconds(cost, step[i]);
      (i < c ? ax : ay) += a;
      (i < c ? tx : ty) += step[i].tokens;
    }
    gx = cuda::nano_gemm_seconds(cost, tx);
    gy = cuda::nano_gemm_seconds(cost, ty);
    const double t = cuda::nano_pipeline_seconds(cost, gx, ax, gy, ay);
    if (t < best) best = t, best_cut = static_cast<int>(c);
  }
  EXPECT_EQ(s.cut, best_cut);
  EXPECT_DOUBLE_EQ(s.pipelined_s, best);
  // Sequential: 2,304 tokens of GEMMs (46.1 ms) + attention (15.7 + 3.9 ms). The cut puts the
  // decodes on one side: their attention runs beside the prompt's GEMMs, at 0.71 interference
  // 48.3 + 0.71 x 19.7 = 62.2 ms against 65.8.
  EXPECT_EQ(s.cut, 256);
  EXPECT_NEAR(s.sequential_s, 2304 * 2e-5 + 256 * 1025 * 6e-8 + 32 * 2048 * 6e-8, 1e-9);
  EXPECT_NEAR(s.pipelined_s, 0.0622, 1e-4);
  // A few decodes are weight-bound: a second weight read costs more than the overlap saves.
  EXPECT_EQ(cuda::choose_nano_split(decodes(8, 1024), cost).cut, 0);
  // ... unless a test asks for a cut wherever there are two chunks.
  EXPECT_GT(cuda::choose_nano_split(decodes(8, 1024), cost, 0.95, /*always=*/true).cut, 0);
  // One chunk cannot be cut.
  EXPECT_EQ(cuda::choose_nano_split(std::vector<cuda::ChunkWork>{{2048, 0}}, cost, 0.95, true).cut,
            0);
}

// Where overlapping gains nothing (interference 1: overlapped work takes as long as run in
// turn), no cut is predicted to beat the whole step, whatever the mix.
TEST(NanoSplit, AtInterferenceOneNoCutBeatsTheWholeStep) {
  const cuda::NanoCost cost = h100_like(1.0);
  for (int d : {2, 64, 512})
    for (int prompt : {0, 64, 4096}) {
      std::vector<cuda::ChunkWork> step = decodes(d, 1024);
      if (prompt > 0) step.push_back({.tokens = prompt, .cached = 0});
      const cuda::NanoSplit s = cuda::choose_nano_split(step, cost, 1.0, /*always=*/true);
      EXPECT_GE(s.pipelined_s, s.sequential_s - 1e-12) << d << " decodes, prompt " << prompt;
    }
}

// Flash-decoding splits: none when the (token, KV head) blocks fill the GPU or the contexts
// are short, else enough for two blocks per multiprocessor, at most 32, two tiles each.
TEST(DecodeSplits, FillTheGpuOnlyWhereTheBatchCannot) {
  EXPECT_EQ(cuda::decode_splits(256, 8, 1024, 132), 1);
  EXPECT_EQ(cuda::decode_splits(17, 8, 4096, 132), 1);
  EXPECT_EQ(cuda::decode_splits(1, 8, 1024, 132), 16);  // 33 wanted, 1024 keys = 16 x 64
  EXPECT_EQ(cuda::decode_splits(2, 8, 100000, 132), 17);
  EXPECT_EQ(cuda::decode_splits(1, 1, 1 << 20, 132), 32);
  EXPECT_EQ(cuda::decode_splits(1, 8, 64, 132), 1);
  EXPECT_EQ(cuda::decode_scratch_floats(1, 32, 128, 16), size_t{32} * 16 * 130);
  EXPECT_EQ(cuda::decode_scratch_floats(4, 32, 128, 1), 0u);
}

// Splits against the last wave: 2,048 equal blocks of 32 tiles with 660 resident run in 4
// waves, the last 10% full (4 x 33 = 132 tile times); 4 splits run 13 waves of 8 + 1 = 117, the
// least of s = 1..16 (s = 2: 7 x 17 = 119, s = 3: 10 x 12 = 120, s = 5: 16 x 8 = 128).
TEST(DecodeSplits, WavesSplitWhereTheLastWaveIsMostlyEmpty) {
  EXPECT_EQ(cuda::wave_splits(2048, 32, 660), 4);
  EXPECT_EQ(cuda::wave_splits(1320, 32, 660), 1);  // two whole waves: splitting only adds cost
  EXPECT_EQ(cuda::wave_splits(700, 3, 660), 1);    // too few tiles to split (two per split)
  // One block past a whole wave: s = 2 gives 3 waves of 4 + 1 = 15 against 2 x 9 = 18 (s = 4
  // ties at 5 x 3 = 15: the fewer splits win).
  EXPECT_EQ(cuda::wave_splits(661, 8, 660), 2);
  EXPECT_EQ(cuda::wave_splits(0, 32, 660), 1);
  // The scratch is sized by the same bound: 100 keys are 4 tiles, so up to 2 splits.
  EXPECT_EQ(cuda::decode_tiles(100), 4);
  EXPECT_EQ(cuda::wave_splits_most(cuda::decode_tiles(100)), 2);
  EXPECT_EQ(cuda::wave_splits_most(cuda::decode_tiles(1 << 20)), 32);
}

// Both KV layouts place every (page, layer) run of layer_elems() once: the runs tile the cache
// exactly, and a page-major page is one run of page_elems().
TEST(KvLayout, EveryPageLayerRunIsPlacedOnceInTheCache) {
  for (const auto layout : {cuda::KvLayout::kPageMajor, cuda::KvLayout::kLayerMajor}) {
    cuda::KvView kv{.num_layers = 3, .num_kv_heads = 2, .head_dim = 8, .page_size = 4};
    const int64_t pages = 5;
    cuda::set_kv_layout(kv, layout, pages);
    std::vector<int> covered(static_cast<size_t>(pages * kv.page_elems()), 0);
    for (int64_t p = 0; p < pages; ++p)
      for (int64_t l = 0; l < kv.num_layers; ++l) {
        const int64_t at = p * kv.page_stride + l * kv.layer_stride;
        ASSERT_GE(at, 0);
        ASSERT_LE(at + kv.layer_elems(), static_cast<int64_t>(covered.size()));
        for (int64_t e = 0; e < kv.layer_elems(); ++e) ++covered[at + e];
      }
    EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
    if (layout == cuda::KvLayout::kPageMajor) {
      EXPECT_EQ(kv.layer_stride, kv.layer_elems());
      EXPECT_EQ(kv.page_stride, kv.page_elems());
    } else {
      EXPECT_EQ(kv.page_stride, kv.layer_elems());  // a layer's pages are back to back
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Test models: the tiny preset and its variants (as in tests/backend/cpu_backend_test.cc).

using testing::TestModel;

const TestModel& model(const std::string& variant, DType dtype) {
  return testing::test_model(variant, dtype);
}

constexpr int kPageSize = 4;
constexpr int64_t kPages = 256;

BackendOptions options() {
  BackendOptions o;
  o.page_size = kPageSize;
  o.num_pages = kPages;
  return o;
}

// Sets environment variables for its lifetime (the backend reads its kernel knobs at
// construction), restoring them after.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::map<std::string, std::string> vars) {
    for (auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ScopedEnv(const std::string& name, const std::string& value)
      : ScopedEnv(std::map<std::string, std::string>{{name, value}}) {}
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) v ? setenv(k.c_str(), v->c_str(), 1) : unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

#define SKIP_WITHOUT_GPU()                                               \
  do {                                                                   \
    std::string why;                                                     \
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

// Green contexts: on a GPU the SMs split at the asked count (rounded up by the driver) with
// some left for the other group, and a split that leaves none is refused; without a GPU the
// partition refuses with the reason.
TEST(SmPartition, SplitsTheSmsOrRefusesWithTheReason) {
  std::string why;
  if (!cuda_device_available(&why)) {
    EXPECT_THROW(cuda::SmPartition{8}, Error);
    return;
  }
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  cuda::SmPartition p(16);
  EXPECT_GE(p.sms(0), 16);
  EXPECT_GT(p.sms(1), 0);
  EXPECT_LE(p.sms(0) + p.sms(1), sms);
  cudaStream_t first = p.make_stream(0);
  ASSERT_NE(first, nullptr);
  EXPECT_NE(p.make_stream(1), nullptr);
  // An event of the group's context records on the group's stream, and a primary-context
  // stream can wait on it.
  cudaEvent_t done = p.make_event(0, /*timing=*/false);
  EXPECT_EQ(cudaEventRecord(done, first), cudaSuccess);
  cudaStream_t primary = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&primary, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(primary, done, 0), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(primary), cudaSuccess);
  cudaStreamDestroy(primary);
  {
    const cuda::SmPartition::Current in_group(p, 1);  // pushed and popped again
  }
  int device = -1;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_THROW(cuda::SmPartition{sms}, Error);
}

// A value each environment knob refuses (the knob tests, with and without a GPU).
const std::vector<std::pair<std::string, std::string>>& bad_knob_values() {
  static const std::vector<std::pair<std::string, std::string>> values = {
      {"BLEND_CUDA_ATTENTION", "fast"},
      {"BLEND_CUDA_PREFILL", "flash"},
      {"BLEND_CUDA_GATE_UP", "f16"},
      {"BLEND_CUDA_KV_LAYOUT", "head"},
      {"BLEND_CUDA_DECODE_SPLITS", "0"},
      {"BLEND_CUDA_DECODE_SPLITS", "4x"},
      {"BLEND_CUDA_DECODE_GRID", "rows"},
      {"BLEND_CUDA_NANO_BATCHES", "yes"},
      {"BLEND_CUDA_NANO_GEMM_SMS", "-1"},
      {"BLEND_CUDA_NANO_INTERFERENCE", "high"},
      {"BLEND_CUDA_NANO_INTERFERENCE", "3"},
      {"BLEND_CUDA_NANO_SM_SPLIT", "mps"},
      // green without a pipelined step or without an SM count to split at
      {"BLEND_CUDA_NANO_SM_SPLIT", "green"},
      // a profile without a pipelined step
      {"BLEND_CUDA_NANO_PROFILE", "nano.json"},
      {"BLEND_CUDA_GRAPHS", "always"},
      {"BLEND_CUDA_DRAW", "cuts"}};
  return values;
}

// The environment knobs, read without a GPU: each known value, and a clear refusal naming the
// variable for an unknown one.
TEST(CudaKnobs, ReadsKnownValuesAndRefusesUnknownOnes) {
  {
    const cuda::Knobs k = cuda::read_knobs();  // nothing set in the test's environment
    EXPECT_EQ(k.attention, cuda::AttentionKernel::kDefault);
    EXPECT_EQ(k.prefill, cuda::PrefillKernel::kMma);
    EXPECT_FALSE(k.gate_up_bf16);
    EXPECT_EQ(k.nano, cuda::NanoMode::kOff);
    EXPECT_FALSE(k.nano_green);
    EXPECT_FALSE(k.nano_interference.has_value());
    EXPECT_FALSE(k.graphs);
    EXPECT_FALSE(k.draw_cuts);
  }
  {
    ScopedEnv env("BLEND_CUDA_GRAPHS", "decode");
    EXPECT_TRUE(cuda::read_knobs().graphs);
  }
  {
    ScopedEnv env("BLEND_CUDA_DRAW", "all");
    EXPECT_TRUE(cuda::read_knobs().draw_cuts);
  }
  {
    ScopedEnv env({{"BLEND_CUDA_ATTENTION", "warps"},
                   {"BLEND_CUDA_PREFILL", "wmma"},
                   {"BLEND_CUDA_GATE_UP", "bf16"},
                   {"BLEND_CUDA_KV_LAYOUT", "layer"},
                   {"BLEND_CUDA_DECODE_SPLITS", "5"},
                   {"BLEND_CUDA_DECODE_GRID", "heads"},
                   {"BLEND_CUDA_NANO_BATCHES", "auto"},
                   {"BLEND_CUDA_NANO_GEMM_SMS", "100"},
                   {"BLEND_CUDA_NANO_SM_SPLIT", "green"},
                   {"BLEND_CUDA_NANO_INTERFERENCE", "0.71"}});
    const cuda::Knobs k = cuda::read_knobs();
    EXPECT_EQ(k.attention, cuda::AttentionKernel::kWarps);
    EXPECT_EQ(k.prefill, cuda::PrefillKernel::kWmma);
    EXPECT_TRUE(k.gate_up_bf16);
    EXPECT_EQ(k.kv_layout, cuda::KvLayout::kLayerMajor);
    EXPECT_EQ(k.min_decode_splits, 5);
    EXPECT_TRUE(k.decode_heads_fastest);
    EXPECT_EQ(k.nano, cuda::NanoMode::kAuto);
    EXPECT_EQ(k.nano_gemm_sms, 100);
    EXPECT_TRUE(k.nano_green);
    EXPECT_DOUBLE_EQ(k.nano_interference.value_or(-1), 0.71);
  }
  {
    ScopedEnv env(std::map<std::string, std::string>{{"BLEND_CUDA_NANO_BATCHES", "auto"},
                                                     {"BLEND_CUDA_NANO_PROFILE", "nano.json"}});
    const cuda::Knobs k = cuda::read_knobs();
    EXPECT_EQ(k.nano_profile, "nano.json");
    EXPECT_TRUE(k.nano_green);  // the profile's plans are held by green contexts
  }
  // Beside a profile, what it replaces is refused, naming the profile.
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{{"BLEND_CUDA_NANO_GEMM_SMS", "64"},
                                                        {"BLEND_CUDA_NANO_SM_SPLIT", "cublas"},
                                                        {"BLEND_CUDA_NANO_INTERFERENCE", "0.5"}}) {
    ScopedEnv env({{"BLEND_CUDA_NANO_BATCHES", "always"},
                   {"BLEND_CUDA_NANO_PROFILE", "nano.json"},
                   {name, value}});
    try {
      cuda::read_knobs();
      ADD_FAILURE() << name << "=" << value << " was accepted beside a profile";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("BLEND_CUDA_NANO_PROFILE"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  for (const auto& [name, value] : bad_knob_values()) {
    ScopedEnv env(name, value);
    try {
      cuda::read_knobs();
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// The same knobs as command-line flags (--cuda-NAME, issue 55): a flag wins over its variable,
// errors name the flag the value came from, and an unknown knob name is refused.
TEST(CudaKnobs, FlagsWinOverTheEnvironmentAndAreNamedInErrors) {
  {
    ScopedEnv env("BLEND_CUDA_ATTENTION", "warps");
    EXPECT_EQ(cuda::parse_knobs({}).attention, cuda::AttentionKernel::kWarps);
    EXPECT_EQ(cuda::parse_knobs({{"attention", "tiled32"}}).attention,
              cuda::AttentionKernel::kTiled32);
    const cuda::Knobs k = cuda::parse_knobs({{"nano-batches", "auto"},
                                             {"nano-gemm-sms", "64"},
                                             {"nano-sm-split", "green"},
                                             {"graphs", "decode"}});
    EXPECT_EQ(k.nano, cuda::NanoMode::kAuto);
    EXPECT_EQ(k.nano_gemm_sms, 64);
    EXPECT_TRUE(k.nano_green);
    EXPECT_TRUE(k.graphs);
  }
  const auto message = [](const std::map<std::string, std::string>& flags) {
    try {
      cuda::parse_knobs(flags);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message({{"attention", "fast"}}),
            "--cuda-attention=fast: expected default, pipelined3, warps, warps8, tiled64 or "
            "tiled32");
  EXPECT_NE(message({{"decode-splits", "99"}}).find("--cuda-decode-splits=99"), std::string::npos);
  EXPECT_NE(message({{"nano-profile", "p.json"}})
                .find("--cuda-nano-profile plans pipelined steps: "
                      "it needs --cuda-nano-batches"),
            std::string::npos);
  EXPECT_EQ(message({{"attenton", "warps"}}), "--cuda-attenton: no such cuda backend knob");
  // Every knob has a flag and a variable of the documented form.
  EXPECT_EQ(cuda::knob_specs().size(), 13u);
  EXPECT_EQ(cuda::knob_env_var("nano-gemm-sms"), "BLEND_CUDA_NANO_GEMM_SMS");
}

TEST(CudaBackend, WithoutAGpuItRefusesWithTheReason) {
  std::string why;
  if (cuda_device_available(&why)) GTEST_SKIP() << "a GPU is present";
  const TestModel& m = model("base", DType::kBF16);
  try {
    make_cuda_backend(m.config, m.store, options());
    FAIL() << "made a cuda backend without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no usable GPU"), std::string::npos) << e.what();
  }
}

// An architecture the GPU path has not been checked on is refused by name, GPU or not.
TEST(CudaBackend, RefusesQwen3sHeadNormsByName) {
  const TestModel& m = model("qwen3", DType::kBF16);
  try {
    make_cuda_backend(m.config, m.store, options());
    FAIL() << "made a cuda backend for Qwen3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Qwen3ForCausalLM (per-head q/k norms)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaBackend, RefusesPhi3sPartialRopeAndLongropeByName) {
  const TestModel& m = model("phi3", DType::kBF16);
  try {
    make_cuda_backend(m.config, m.store, options());
    FAIL() << "made a cuda backend for Phi-3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Phi3ForCausalLM (partial RoPE, longrope)"),
              std::string::npos)
        << e.what();
  }
}

// Gemma 2 / 3 have no kernels on the GPU path yet: refused by name, GPU or not.
TEST(CudaBackend, RefusesGemmaByName) {
  for (const char* variant : {"gemma2", "gemma3"}) {
    const TestModel& m = model(variant, DType::kBF16);
    try {
      make_cuda_backend(m.config, m.store, options());
      FAIL() << "made a cuda backend for " << variant;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(m.config.architecture + " ((1 + w) norms"),
                std::string::npos)
          << e.what();
    }
  }
}

// A sequence fed to both backends: its tokens so far and the pages it owns.
struct Seq {
  SeqId id = 0;
  std::vector<TokenId> tokens;  // all tokens, including those not yet computed
  int32_t cached = 0;
  std::vector<PageId> pages;
  std::vector<uint8_t> reversed;
};

// Appends `n` tokens of `s` (from s.cached) as one chunk, taking pages from `next_page`.
void add_chunk(ForwardBatch& b, Seq& s, int32_t n, PageId& next_page) {
  SeqChunk c;
  c.seq = s.id;
  c.num_cached = s.cached;
  c.num_tokens = n;
  c.token_offset = b.num_tokens();
  while (static_cast<int64_t>(s.pages.size()) * kPageSize < s.cached + n) {
    s.pages.push_back(next_page++);
    s.reversed.push_back(s.id % 2 == 0 && s.pages.size() % 2 == 0 ? 1 : 0);
  }
  c.block_table = s.pages;
  c.reversed_pages = s.reversed;
  c.wants_logits = s.cached + n == static_cast<int32_t>(s.tokens.size());
  for (int32_t i = 0; i < n; ++i) {
    b.tokens.push_back(s.tokens[s.cached + i]);
    b.positions.push_back(s.cached + i);
  }
  b.chunks.push_back(std::move(c));
  s.cached += n;
}

std::vector<TokenId> prompt(int n, int salt) {
  std::vector<TokenId> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 101 + 5) % 4000;
  return t;
}

// Largest |a - b| over the largest |a|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(a[i])));
  }
  return num / den;
}

struct Case {
  std::string variant;
  DType dtype;
  double tolerance;                   // relative error of the logits against the cpu backend's
  std::string attention = "default";  // BLEND_CUDA_ATTENTION: which attention kernels run
  std::string layout = "page";        // BLEND_CUDA_KV_LAYOUT
  std::string splits = "fill";        // BLEND_CUDA_DECODE_SPLITS
  std::string grid = "tokens";        // BLEND_CUDA_DECODE_GRID
  std::string nano = "off";           // BLEND_CUDA_NANO_BATCHES
  std::string nano_sms = "0";         // BLEND_CUDA_NANO_GEMM_SMS
  std::string prefill = "mma";        // BLEND_CUDA_PREFILL
  std::string gate_up = "f32";        // BLEND_CUDA_GATE_UP
  std::string sm_split = "cublas";    // BLEND_CUDA_NANO_SM_SPLIT
};

// One step on both backends: every logits row of `gpu` equals `cpu`'s within `tolerance`
// (relative).
void expect_step_matches(Backend& cpu, Backend& gpu, const ForwardBatch& batch, int64_t vocab,
                         double tolerance, int step) {
  std::vector<float> lc(batch.num_logit_rows() * vocab), lg(lc.size());
  cpu.forward(batch, lc);
  gpu.forward(batch, lg);
  EXPECT_LT(relative_error(lc, lg), tolerance) << "step " << step;
}

// Three steps of mixed prefill chunks and decodes over three sequences (one of them on reversed
// pages, one prompt split into two chunks), each matching (expect_step_matches).
void expect_mixed_steps_match(Backend& cpu, Backend& gpu, const TestModel& m, double tolerance) {
  // d is long enough that attention crosses several key tiles (of 32 and of 64).
  Seq a{.id = 1, .tokens = prompt(11, 1)}, b{.id = 2, .tokens = prompt(17, 2)},
      c{.id = 4, .tokens = prompt(3, 3)}, d{.id = 6, .tokens = prompt(150, 4)};
  PageId next = 0;
  auto run = [&](const ForwardBatch& batch, int step) {
    expect_step_matches(cpu, gpu, batch, m.config.vocab_size, tolerance, step);
  };
  ForwardBatch s1;
  add_chunk(s1, a, 11, next);
  add_chunk(s1, b, 9, next);
  add_chunk(s1, d, 100, next);
  run(s1, 1);
  ForwardBatch s2;
  a.tokens.push_back(77);
  add_chunk(s2, a, 1, next);
  add_chunk(s2, b, 8, next);
  add_chunk(s2, c, 3, next);
  add_chunk(s2, d, 50, next);
  run(s2, 2);
  ForwardBatch s3;
  for (Seq* s : {&a, &b, &c, &d}) {
    s->tokens.push_back(123);
    add_chunk(s3, *s, 1, next);
  }
  run(s3, 3);
}

class CudaMatchesCpu : public ::testing::TestWithParam<Case> {};

TEST_P(CudaMatchesCpu, LogitsOfMixedSteps) {
  SKIP_WITHOUT_GPU();
  const Case& p = GetParam();
  const TestModel& m = model(p.variant, p.dtype);
  auto cpu = make_cpu_backend(m.config, m.store, options());
  std::unique_ptr<Backend> gpu;
  {
    ScopedEnv env({{"BLEND_CUDA_ATTENTION", p.attention},
                   {"BLEND_CUDA_KV_LAYOUT", p.layout},
                   {"BLEND_CUDA_DECODE_SPLITS", p.splits},
                   {"BLEND_CUDA_DECODE_GRID", p.grid},
                   {"BLEND_CUDA_NANO_BATCHES", p.nano},
                   {"BLEND_CUDA_NANO_GEMM_SMS", p.nano_sms},
                   {"BLEND_CUDA_PREFILL", p.prefill},
                   {"BLEND_CUDA_GATE_UP", p.gate_up},
                   {"BLEND_CUDA_NANO_SM_SPLIT", p.sm_split}});
    gpu = make_cuda_backend(m.config, m.store, options());
  }
  EXPECT_EQ(gpu->compute_dtype(), cpu->compute_dtype());
  EXPECT_EQ(gpu->kv_bytes_per_token(), cpu->kv_bytes_per_token());
  expect_mixed_steps_match(*cpu, *gpu, m, p.tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaMatchesCpu,
    ::testing::Values(
        Case{"base", DType::kF32, 1e-4}, Case{"base", DType::kBF16, 2e-2},
        Case{"qwen2", DType::kF32, 1e-4}, Case{"llama3", DType::kF32, 1e-4},
        Case{"mistral", DType::kF32, 1e-4}, Case{"hd128", DType::kF32, 1e-4},
        Case{"hd128", DType::kBF16, 2e-2}, Case{"mistral", DType::kBF16, 2e-2},
        Case{"qwen2", DType::kBF16, 2e-2}, Case{"hd128", DType::kBF16, 2e-2, "tiled64"},
        Case{"base", DType::kF32, 1e-4, "tiled32"}, Case{"mistral", DType::kF32, 1e-4, "tiled32"},
        Case{"hd128", DType::kBF16, 2e-2, "tiled32"},
        Case{"hd128", DType::kBF16, 2e-2, "default", "layer"},
        Case{"mistral", DType::kF32, 1e-4, "default", "layer"},
        Case{"qwen2", DType::kBF16, 2e-2, "pipelined3"},
        Case{"hd128", DType::kBF16, 2e-2, "pipelined3", "layer", "waves"},
        Case{"hd128", DType::kBF16, 2e-2, "default", "page", "3"},
        Case{"mistral", DType::kBF16, 2e-2, "pipelined3", "page", "5"},
        Case{"hd128", DType::kBF16, 2e-2, "warps"},
        Case{"hd64", DType::kBF16, 2e-2, "warps8", "layer"},
        Case{"mistral-hd128", DType::kBF16, 2e-2, "warps"},
        Case{"mistral-hd128", DType::kBF16, 2e-2, "default"},
        Case{"hd128", DType::kBF16, 2e-2, "warps8", "page", "3"},
        Case{"hd128", DType::kBF16, 2e-2, "warps", "page", "waves"},
        Case{"hd128", DType::kBF16, 2e-2, "warps", "page", "fill", "heads"},
        Case{"hd128", DType::kBF16, 2e-2, "default", "page", "3", "heads"},
        Case{"mistral-hd128", DType::kBF16, 2e-2, "warps8", "layer", "4", "heads"},
        Case{"base", DType::kF32, 1e-4, "default", "page", "fill", "tokens", "always"},
        Case{"hd128", DType::kBF16, 2e-2, "default", "page", "fill", "tokens", "always"},
        Case{"qwen2", DType::kBF16, 2e-2, "default", "layer", "fill", "tokens", "always"},
        Case{"mistral", DType::kF32, 1e-4, "warps", "page", "fill", "tokens", "always"},
        Case{"hd128", DType::kBF16, 2e-2, "default", "page", "fill", "tokens", "off", "0", "wmma"},
        Case{"mistral-hd128", DType::kBF16, 2e-2, "default", "layer", "fill", "tokens", "off", "0",
             "wmma"},
        Case{"hd64", DType::kBF16, 2e-2, "default", "page", "fill", "tokens", "off", "0", "wmma"},
        Case{"hd128", DType::kBF16, 2e-2, "default", "page", "fill", "tokens", "off", "0", "mma",
             "bf16"},
        Case{"qwen2", DType::kBF16, 2e-2, "default", "page", "fill", "tokens", "always", "0", "mma",
             "bf16"},
        // The pipeline on green contexts: GEMM phases on 64 (or 32) SMs, attention on the rest.
        Case{"hd128", DType::kBF16, 2e-2, "default", "page", "fill", "tokens", "always", "64",
             "mma", "f32", "green"},
        Case{"mistral", DType::kF32, 1e-4, "warps", "page", "fill", "tokens", "always", "32", "mma",
             "f32", "green"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string name = i.param.variant + (i.param.dtype == DType::kF32 ? "_f32_" : "_bf16_") +
                         i.param.attention + "_" + i.param.layout + "_splits_" + i.param.splits +
                         "_" + i.param.grid +
                         (i.param.nano == "off" ? "" : "_nano_" + i.param.nano) +
                         (i.param.nano_sms == "0" ? "" : "_sms_" + i.param.nano_sms) +
                         (i.param.prefill == "mma" ? "" : "_prefill_" + i.param.prefill) +
                         (i.param.gate_up == "f32" ? "" : "_gate_up_" + i.param.gate_up) +
                         (i.param.sm_split == "cublas" ? "" : "_" + i.param.sm_split);
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// NanoFlow §5.5 end to end: the backend times its phases at each green split
// (measure_nano_profile), the profile file plans its pipelined steps (BLEND_CUDA_NANO_PROFILE),
// and their logits equal the cpu backend's.
TEST(CudaBackend, MeasuredNanoProfilePlansStepsWhoseLogitsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("hd128", DType::kBF16);
  BackendOptions o = options();
  o.num_pages = 0;
  auto timer = make_cuda_backend(m.config, m.store, o);
  timer->allocate_kv(cuda::NanoGrid{.decode_sequences = {4, 16}}.pages_needed(kPageSize));
  const cuda::NanoProfile profile = timer->measure_nano_profile(3);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  EXPECT_EQ(profile.total_sms, sms);
  EXPECT_EQ(profile.layers, m.config.num_layers);
  EXPECT_GE(profile.sm_step, 1);
  EXPECT_EQ(profile.gemm.sms.back(), sms);  // the whole GPU is a column of both
  EXPECT_EQ(profile.attention.sms.back(), sms);
  EXPECT_GE(profile.gemm.sms.size(), 2u);
  EXPECT_EQ(profile.attention.work.size(), 2u);  // 4 and 16 decodes: what the pages hold
  // More tokens take longer on the whole GPU, and so do more decodes.
  const size_t cols = profile.gemm.sms.size();
  EXPECT_GT(profile.gemm.seconds[(profile.gemm.work.size() - 1) * cols + cols - 1],
            profile.gemm.seconds[cols - 1]);
  const size_t acols = profile.attention.sms.size();
  EXPECT_GT(profile.attention.seconds[acols + acols - 1], profile.attention.seconds[acols - 1]);

  const std::string path = ::testing::TempDir() + "/nano_profile.json";
  auto write_profile = [&](const nlohmann::json& j) { std::ofstream(path) << j.dump(); };
  write_profile(cuda::nano_profile_to_json(profile));
  auto cpu = make_cpu_backend(m.config, m.store, options());
  std::unique_ptr<Backend> gpu;
  {
    ScopedEnv env(std::map<std::string, std::string>{{"BLEND_CUDA_NANO_BATCHES", "always"},
                                                     {"BLEND_CUDA_NANO_PROFILE", path}});
    gpu = make_cuda_backend(m.config, m.store, options());
  }
  expect_mixed_steps_match(*cpu, *gpu, m, 2e-2);
  // A profile of another GPU or model is refused at load.
  nlohmann::json other = cuda::nano_profile_to_json(profile);
  other["layers"] = profile.layers + 1;
  write_profile(other);
  ScopedEnv env(std::map<std::string, std::string>{{"BLEND_CUDA_NANO_BATCHES", "auto"},
                                                   {"BLEND_CUDA_NANO_PROFILE", path}});
  EXPECT_THROW(make_cuda_backend(m.config, m.store, options()), Error);
}

// BLEND_CUDA_GRAPHS=decode: four sequences decoding together for 40 steps share one graph
// (their step's counts, context bucket and buffers repeat), captured once and replayed; every
// step's logits equal the cpu backend's. A mixed step runs uncaptured.
TEST(CudaBackend, DecodeStepsReplayOneGraphWithTheCpuBackendsLogits) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("hd128", DType::kBF16);
  auto cpu = make_cpu_backend(m.config, m.store, options());
  std::unique_ptr<CudaBackend> gpu;
  {
    ScopedEnv env("BLEND_CUDA_GRAPHS", "decode");
    gpu = make_cuda_backend(m.config, m.store, options());
  }
  std::vector<Seq> seqs;
  for (int i = 0; i < 4; ++i) seqs.push_back({.id = 10 + i, .tokens = prompt(5 + 3 * i, i)});
  PageId next = 0;
  auto run = [&](const ForwardBatch& batch, int step) {
    expect_step_matches(*cpu, *gpu, batch, m.config.vocab_size, 2e-2, step);
  };
  ForwardBatch prefill;
  for (Seq& q : seqs) add_chunk(prefill, q, static_cast<int32_t>(q.tokens.size()), next);
  run(prefill, 0);
  EXPECT_EQ(gpu->graph_stats().captured, 0);  // not a decode step
  auto decode_steps = [&](int first, int last) {
    for (int step = first; step <= last; ++step) {
      ForwardBatch decode;
      for (Seq& q : seqs) {
        q.tokens.push_back(static_cast<TokenId>((step * 31 + q.id) % 4000));
        add_chunk(decode, q, 1, next);
      }
      run(decode, step);
    }
  };
  decode_steps(1, 40);
  EXPECT_EQ(gpu->graph_stats().failed, 0);
  EXPECT_EQ(gpu->graph_stats().captured, 1);
  EXPECT_EQ(gpu->graph_stats().replayed, 39);
  // One sequence ends: three rows, padded to the four-row graph's count (cuda::graph_rows) on the
  // scratch page, replay the same graph, and the three rows' logits are still the cpu's.
  seqs.pop_back();
  decode_steps(41, 50);
  EXPECT_EQ(gpu->graph_stats().failed, 0);
  EXPECT_EQ(gpu->graph_stats().captured, 1);
  EXPECT_EQ(gpu->graph_stats().replayed, 49);
}

// Greedy decoding for 128 steps on an f32 checkpoint: the same tokens as the cpu backend.
TEST(CudaBackend, GreedyTokensEqualTheCpuBackendsFor128Steps) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("base", DType::kF32);
  BackendOptions o = options();
  o.num_pages = 64;
  auto cpu = make_cpu_backend(m.config, m.store, o);
  auto gpu = make_cuda_backend(m.config, m.store, o);
  const int64_t vocab = m.config.vocab_size;
  auto decode = [&](Backend& be) {
    Seq s{.id = 1, .tokens = prompt(20, 9)};
    PageId next = 0;
    std::vector<TokenId> out;
    std::vector<float> logits(vocab);
    for (int step = 0; step < 128; ++step) {
      ForwardBatch batch;
      add_chunk(batch, s, static_cast<int32_t>(s.tokens.size()) - s.cached, next);
      be.forward(batch, logits);
      const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
      out.push_back(static_cast<TokenId>(best));
      s.tokens.push_back(static_cast<TokenId>(best));
    }
    return out;
  };
  EXPECT_EQ(decode(*cpu), decode(*gpu));
}

// Forwards one 8-token prompt, so that KV pages 0 and 1 hold its K/V (page size 4).
void fill_first_pages(Backend& b, const TestModel& m) {
  Seq a{.id = 1, .tokens = prompt(8, 5)};
  PageId next = 0;
  ForwardBatch batch;
  add_chunk(batch, a, 8, next);
  std::vector<float> logits(m.config.vocab_size);
  b.forward(batch, logits);
}

class PageImages : public ::testing::TestWithParam<std::string> {};

// Page images: read_pages / write_pages / copy_page / the slot copies move exactly the bytes
// they name, in either KV layout (BLEND_CUDA_KV_LAYOUT), and the image is the same whatever the
// layout (the host tier's pages do not depend on it).
TEST_P(PageImages, RoundTrip) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("base", DType::kBF16);
  auto make = [&](const std::string& layout) {
    ScopedEnv env("BLEND_CUDA_KV_LAYOUT", layout);
    return make_cuda_backend(m.config, m.store, options());
  };
  auto gpu = make(GetParam());
  auto other = make(GetParam() == "page" ? "layer" : "page");
  fill_first_pages(*gpu, m);
  fill_first_pages(*other, m);
  const auto bytes = static_cast<size_t>(gpu->kv_bytes_per_page());
  std::vector<std::byte> p0(bytes), p1(bytes), back(bytes);
  const std::vector<PageId> first{0}, second{1}, far{100};
  gpu->read_pages(first, p0.data());
  gpu->read_pages(second, p1.data());
  EXPECT_NE(p0, p1);
  other->read_pages(first, back.data());
  EXPECT_EQ(back, p0) << "the page image depends on the layout";
  gpu->write_pages(far, p0.data());
  gpu->read_pages(far, back.data());
  EXPECT_EQ(back, p0);
  gpu->copy_page(1, 100);
  gpu->read_pages(far, back.data());
  EXPECT_EQ(back, p1);
  // Slots 1..2 of page 0 into page 100 (holding page 1): only those slots change.
  std::vector<std::byte> image(bytes, std::byte{0});
  gpu->read_slots(0, 1, 2, image.data());
  gpu->write_slots(100, 1, 2, image.data());
  gpu->read_pages(far, back.data());
  const size_t slot =
      bytes / (static_cast<size_t>(m.config.num_layers) * 2 * m.config.num_kv_heads * kPageSize);
  for (size_t run = 0; run < bytes / (slot * kPageSize); ++run)
    for (size_t s = 0; s < kPageSize; ++s) {
      const size_t at = (run * kPageSize + s) * slot;
      const auto& want = s == 1 || s == 2 ? p0 : p1;
      ASSERT_TRUE(std::equal(back.begin() + at, back.begin() + at + slot, want.begin() + at))
          << "run " << run << " slot " << s;
    }
  EXPECT_THROW(gpu->copy_page(0, kPages), Error);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PageImages, ::testing::Values("page", "layer"));

// The host tier's memory works with or without a GPU: pinned where the driver pins, heap memory
// where it refuses (here, without a GPU), and freed blocks are kept by size for reuse either way
// only when pinned.
TEST(PinnedHostMemory, GivesUsableMemoryWithOrWithoutAGpu) {
  cuda::PinnedHostMemory memory(/*cache_bytes=*/1 << 20);
  std::string why;
  const bool gpu = cuda_device_available(&why);
  for (int round = 0; round < 3; ++round) {
    std::pmr::vector<std::byte> block(4096 + static_cast<size_t>(round), std::byte{1}, &memory);
    for (size_t i = 0; i < block.size(); i += 512) block[i] = std::byte{static_cast<uint8_t>(i)};
    EXPECT_EQ(block[512], std::byte{static_cast<uint8_t>(512)});
  }
  std::pmr::vector<std::byte> again(4096, std::byte{2}, &memory);  // round 0's size
  EXPECT_EQ(memory.pinned_blocks() + memory.pageable_blocks(), gpu ? 3u : 4u);
  EXPECT_EQ(memory.reused_blocks(), gpu ? 1u : 0u);
  EXPECT_EQ(memory.pageable_blocks(), gpu ? 0u : 4u) << (gpu ? "" : "no GPU: " + why);
}

// The KV host tier's memory (Backend::host_memory) is page-locked, pages round-trip through it,
// and a freed block is reused rather than pinned again.
TEST(CudaBackend, HostTierMemoryIsPinnedAndReused) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("base", DType::kBF16);
  auto gpu = make_cuda_backend(m.config, m.store, options());
  fill_first_pages(*gpu, m);
  const auto bytes = static_cast<size_t>(gpu->kv_bytes_per_page());
  std::pmr::memory_resource* memory = gpu->host_memory();
  ASSERT_NE(memory, std::pmr::new_delete_resource());
  std::vector<std::byte> pageable(bytes);
  gpu->read_pages(std::vector<PageId>{0}, pageable.data());
  const void* first = nullptr;
  for (int round = 0; round < 2; ++round) {
    std::pmr::vector<std::byte> pinned(bytes, std::byte{0}, memory);
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, pinned.data()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << "round " << round;
    if (round == 0) {
      first = pinned.data();
    } else {
      EXPECT_EQ(pinned.data(), first) << "the freed block is reused";
    }
    gpu->read_pages(std::vector<PageId>{0}, pinned.data());
    EXPECT_TRUE(std::equal(pinned.begin(), pinned.end(), pageable.begin()));
    gpu->write_pages(std::vector<PageId>{50}, pinned.data());
  }
  std::vector<std::byte> back(bytes);
  gpu->read_pages(std::vector<PageId>{50}, back.data());
  EXPECT_EQ(back, pageable);
}

TEST(CudaBackend, RefusesUnknownKernelKnobs) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("base", DType::kBF16);
  for (const auto& [name, value] : bad_knob_values()) {
    ScopedEnv env(name, value);
    EXPECT_THROW(make_cuda_backend(m.config, m.store, options()), Error) << name << "=" << value;
  }
}

// forward_argmax: the argmax of forward()'s logits, found on the GPU.
TEST(CudaBackend, ArgmaxOnTheGpuEqualsTheArgmaxOfTheLogits) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("hd128", DType::kBF16);
  auto gpu = make_cuda_backend(m.config, m.store, options());
  Seq a{.id = 1, .tokens = prompt(9, 7)}, b{.id = 2, .tokens = prompt(5, 8)};
  PageId next = 0;
  ForwardBatch batch;
  add_chunk(batch, a, 9, next);
  add_chunk(batch, b, 5, next);
  const int64_t vocab = m.config.vocab_size;
  std::vector<float> logits(2 * vocab);
  gpu->forward(batch, logits);
  std::vector<TokenId> tokens(2);
  ASSERT_TRUE(gpu->forward_argmax(batch, tokens));
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(tokens[r],
              std::max_element(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab) -
                  (logits.begin() + r * vocab));
}

// forward_draw: each row's token and logprobs are the host sampler's on forward()'s logits, at
// temperatures with and without the top-k / top-p / min-p cuts as at the argmax
// (backend/cuda/draw.cu).
TEST(CudaBackend, DrawsOnTheGpuAsTheHostSamplerDrawsFromTheLogits) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("hd128", DType::kBF16);
  auto gpu = [&] {  // the knob is read when the backend is made
    ScopedEnv env("BLEND_CUDA_DRAW", "all");
    return make_cuda_backend(m.config, m.store, options());
  }();
  constexpr int kSeqs = 12;
  std::vector<Seq> seqs;
  for (int s = 0; s < kSeqs; ++s)
    seqs.push_back(Seq{.id = s + 1, .tokens = prompt(3 + 2 * s, 20 + s)});
  PageId next = 0;
  ForwardBatch batch;
  for (Seq& s : seqs) add_chunk(batch, s, static_cast<int32_t>(s.tokens.size()), next);
  const int64_t vocab = m.config.vocab_size;
  std::vector<float> logits(kSeqs * vocab);
  gpu->forward(batch, logits);
  std::vector<SamplingParams> params(kSeqs);
  std::vector<SampleRow> rows(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    SamplingParams& p = params[s];
    p.temperature = s == 0 ? 0.0f : 0.6f + 0.3f * static_cast<float>(s % 4);
    if (s % 3 == 1) p.top_k = 2 + s;
    if (s % 4 == 2) p.top_p = 0.5f + 0.05f * static_cast<float>(s);
    if (s == 5 || s == 11) p.min_p = 0.1f;
    if (s % 2 == 0) p.logprobs = s == 0 ? 0 : s;
    rows[s] = {.seq = s + 1, .params = &p, .rng_seed = 900 + static_cast<uint64_t>(s)};
  }
  const std::optional<std::vector<DeviceDraw>> draws = device_draws(rows);
  ASSERT_TRUE(draws.has_value());
  std::vector<SampledToken> out(kSeqs);
  ASSERT_TRUE(gpu->forward_draw(batch, *draws, out));
  for (int s = 0; s < kSeqs; ++s) {
    const std::span<const float> row(logits.data() + s * vocab, static_cast<size_t>(vocab));
    const SampledToken host = sample_token(row, params[s], 900 + static_cast<uint64_t>(s), 0);
    EXPECT_EQ(out[s].token, host.token) << "row " << s;
    EXPECT_EQ(out[s].logprob, host.logprob) << "row " << s;
    ASSERT_EQ(out[s].top.size(), host.top.size()) << "row " << s;
    for (size_t j = 0; j < host.top.size(); ++j) {
      EXPECT_EQ(out[s].top[j].token, host.top[j].token) << "row " << s << " top " << j;
      EXPECT_EQ(out[s].top[j].logprob, host.top[j].logprob) << "row " << s << " top " << j;
    }
  }
  // Without BLEND_CUDA_DRAW=all the cuts and logprobs are the host's: the backend declines.
  auto plain = make_cuda_backend(m.config, m.store, options());
  EXPECT_FALSE(plain->forward_draw(batch, *draws, out));
  // What the step timings record follows: these rows are sampled on the device only with all.
  EXPECT_TRUE(gpu->samples_on_device(rows));
  EXPECT_FALSE(plain->samples_on_device(rows));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<SampleRow> greedy_rows{{.seq = 1, .params = &greedy}};
  EXPECT_TRUE(plain->samples_on_device(greedy_rows));
}

TEST(CudaBackend, RefusesDeterministicMode) {
  SKIP_WITHOUT_GPU();
  const TestModel& m = model("base", DType::kBF16);
  BackendOptions o = options();
  o.deterministic = true;
  EXPECT_THROW(make_cuda_backend(m.config, m.store, o), Error);
}

}  // namespace
}  // namespace blend
