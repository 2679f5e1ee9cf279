#include "backend/cpu/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

namespace blend::cpu {

KvCache::KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t page_size,
                 int64_t num_pages, DType dtype)
    : layers_(layers),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      page_size_(page_size),
      num_pages_(num_pages),
      dtype_(dtype) {
  if (page_size <= 0) throw Error("cpu backend: page_size must be positive");
  if (num_pages < 0) throw Error("cpu backend: num_pages must not be negative");
  // Not zeroed: a page is only read at positions written before, and untouched memory costs
  // nothing.
  data_ = allocate_buffer(static_cast<size_t>(num_pages) * static_cast<size_t>(bytes_per_page()));
}

void KvCache::copy_page(PageId src, PageId dst) {
  if (src < 0 || src >= num_pages_ || dst < 0 || dst >= num_pages_)
    throw Error("cpu backend: copy_page(" + std::to_string(src) + ", " + std::to_string(dst) +
                ") outside the " + std::to_string(num_pages_) + " KV pages");
  if (src == dst) return;
  for (int64_t layer = 0; layer < layers_; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      std::memcpy(page_ptr(layer, kv, dst), page_ptr(layer, kv, src), page_bytes());
}

void KvCache::read_page(PageId page, std::byte* out) const {
  if (page < 0 || page >= num_pages_)
    throw Error("cpu backend: read_page(" + std::to_string(page) + ") outside the KV pages");
  for (int64_t layer = 0; layer < layers_; ++layer)
    for (int kv = 0; kv < 2; ++kv, out += page_bytes())
      std::memcpy(out, page_ptr(layer, kv, page), page_bytes());
}

void KvCache::write_page(PageId page, const std::byte* in) {
  if (page < 0 || page >= num_pages_)
    throw Error("cpu backend: write_page(" + std::to_string(page) + ") outside the KV pages");
  for (int64_t layer = 0; layer < layers_; ++layer)
    for (int kv = 0; kv < 2; ++kv, in += page_bytes())
      std::memcpy(page_ptr(layer, kv, page), in, page_bytes());
}

void KvCache::copy_slots(PageId page, int64_t first, int64_t count, std::byte* image,
                         bool to_image) const {
  if (page < 0 || page >= num_pages_ || first < 0 || count < 0 || first + count > page_size_)
    throw Error("cpu backend: slots [" + std::to_string(first) + ", " +
                std::to_string(first + count) + ") of page " + std::to_string(page) +
                " are outside the KV pages");
  const int64_t es = static_cast<int64_t>(dtype_size(dtype_));
  auto move = [to_image](std::byte* page_bytes, std::byte* image_bytes, int64_t n) {
    if (to_image) {
      std::memcpy(image_bytes, page_bytes, static_cast<size_t>(n));
    } else {
      std::memcpy(page_bytes, image_bytes, static_cast<size_t>(n));
    }
  };
  std::byte* out = image;
  for (int64_t layer = 0; layer < layers_; ++layer) {
    // K is [kv_head][head_dim][page_size]: one run of `count` elements per (head, dim) row.
    std::byte* k = page_ptr(layer, 0, page);
    for (int64_t row = 0; row < kv_heads_ * head_dim_; ++row) {
      const int64_t off = (row * page_size_ + first) * es;
      move(k + off, out + off, count * es);
    }
    out += page_bytes();
    // V is [kv_head][page_size][head_dim]: one run of count * head_dim elements per head.
    std::byte* v = page_ptr(layer, 1, page);
    for (int64_t h = 0; h < kv_heads_; ++h) {
      const int64_t off = (h * page_size_ + first) * head_dim_ * es;
      move(v + off, out + off, count * head_dim_ * es);
    }
    out += page_bytes();
  }
}

void KvCache::read_slots(PageId page, int64_t first, int64_t count, std::byte* image) const {
  copy_slots(page, first, count, image, true);
}

void KvCache::write_slots(PageId page, int64_t first, int64_t count, const std::byte* image) {
  copy_slots(page, first, count, const_cast<std::byte*>(image), false);
}

namespace {

constexpr int kBlock = 16;  // keys per softmax block; blocks start at multiples of 16

inline float load_elem(const std::byte* base, int64_t i, DType dt) {
  if (dt == DType::kF32) {
    float v;
    std::memcpy(&v, base + i * 4, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, base + i * 2, 2);
  return bf16_to_f32(h);
}

// Everything one work item needs, filled by prepare().
struct Item {
  int64_t rows = 0;      // query rows: tokens x heads of the group
  int64_t block_lo = 0;  // first key block
  int64_t block_hi = 0;  // last key block
  int64_t max_hi = 0;    // highest key position any row attends to
};

struct Scratch {
  std::vector<float> q, o, m, l;        // [rows][D] pre-scaled queries, [rows][D] output, [rows]
  std::vector<int64_t> lo, hi;          // [rows] attended key positions, inclusive
  std::vector<int64_t> active, ja, jb;  // rows that see the current block, their key ranges
  std::vector<float> kt, v;             // one key block: [D][16] keys transposed, [16][D] values
  float softcap = 0;                    // AttentionShape::softcap of the item
  void reserve(int64_t rows, int64_t d) {
    if (static_cast<int64_t>(m.size()) < rows) {
      q.resize(rows * d);
      o.resize(rows * d);
      for (auto* f : {&m, &l}) f->resize(rows);
      for (auto* i : {&lo, &hi, &active, &ja, &jb}) i->resize(rows);
    }
    kt.resize(kBlock * d);
    v.resize(kBlock * d);
  }
};

Item prepare(const ForwardBatch& batch, const AttentionItem& it, const float* qkv, int64_t stride,
             const AttentionShape& sh, Scratch& s) {
  const int64_t d = sh.head_dim, group = sh.num_heads / sh.num_kv_heads;
  const SeqChunk& c = batch.chunks[it.chunk];
  const float scale = sh.scale > 0 ? sh.scale : 1.0f / std::sqrt(static_cast<float>(d));
  Item item;
  item.rows = it.count * group;
  s.reserve(item.rows, d);
  s.softcap = sh.softcap;
  int64_t min_lo = std::numeric_limits<int64_t>::max();
  for (int64_t t = 0; t < it.count; ++t) {
    const int64_t tok = c.token_offset + it.first + t;
    const int64_t pos = batch.positions[tok];
    const int64_t lo =
        sh.sliding_window > 0 ? std::max<int64_t>(0, pos - sh.sliding_window + 1) : 0;
    for (int64_t h = 0; h < group; ++h) {
      const int64_t r = t * group + h;
      const float* q = qkv + tok * stride + (it.kv_head * group + h) * d;
      for (int64_t i = 0; i < d; ++i) s.q[r * d + i] = q[i] * scale;
      s.lo[r] = lo;
      s.hi[r] = pos;
      s.m[r] = -std::numeric_limits<float>::infinity();
      s.l[r] = 0.0f;
    }
    min_lo = std::min(min_lo, lo);
    item.max_hi = std::max(item.max_hi, pos);
  }
  std::fill(s.o.begin(), s.o.begin() + item.rows * d, 0.0f);
  item.block_lo = min_lo / kBlock;
  item.block_hi = item.max_hi / kBlock;
  return item;
}

void finish(const ForwardBatch& batch, const AttentionItem& it, const AttentionShape& sh,
            const Scratch& s, int64_t rows, DType out_dtype, void* out) {
  const int64_t d = sh.head_dim, group = sh.num_heads / sh.num_kv_heads;
  const SeqChunk& c = batch.chunks[it.chunk];
  float tmp[1024];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tok = c.token_offset + it.first + r / group;
    const int64_t col = (it.kv_head * group + r % group) * d;
    const float inv = 1.0f / s.l[r];
    for (int64_t i = 0; i < d; ++i) tmp[i] = s.o[r * d + i] * inv;
    store_row(
        tmp, d, out_dtype,
        static_cast<std::byte*>(out) + (tok * sh.num_heads * d + col) * dtype_size(out_dtype));
  }
}

// `n` elements of the cache's dtype at `src` as floats.
inline void load_run(const std::byte* src, DType dt, int64_t n, float* dst) {
  if (dt == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = load_elem(src, i, dt);
}

// Keys [k0, k0 + n) of one KV head into kt ([D][16], transposed) and v ([16][D]); slots past n
// are zero. Keys in consecutive slots of one page are copied as runs: K is stored transposed per
// page ([head][D][slot]), so a run is one copy per dimension, and V ([head][slot][D]) one copy.
// (The element-by-element gather was half of attention's time on AVX2: docs/BENCHMARKS.md,
// "blend batch vs llama.cpp", session 26.) Reversed pages (BROS) fill from the last slot: their
// keys go one at a time.
void gather_portable(const SeqChunk& c, int64_t kv_head, int64_t k0, int64_t n,
                     const KvCache& cache, int64_t layer, float* kt, float* v) {
  const int64_t d = cache.head_dim(), ps = cache.page_size();
  const DType dt = cache.dtype();
  const auto es = static_cast<int64_t>(dtype_size(dt));
  float column[kBlock];
  int64_t j = 0;
  while (j < n) {
    const int64_t pos = k0 + j;
    const PageId page = c.block_table[pos / ps];
    const int64_t slot = kv_slot(c, pos, ps);
    const bool forward = slot == pos % ps;
    const int64_t run = forward ? std::min(n - j, ps - slot) : 1;
    const std::byte* kp = cache.k_page(layer, page);
    const std::byte* vp = cache.v_page(layer, page);
    for (int64_t i = 0; i < d; ++i) {
      load_run(kp + ((kv_head * d + i) * ps + slot) * es, dt, run, column);
      std::copy(column, column + run, kt + i * kBlock + j);
    }
    load_run(vp + (kv_head * ps + slot) * d * es, dt, run * d, v + j * d);
    j += run;
  }
  for (; j < kBlock; ++j) {
    for (int64_t i = 0; i < d; ++i) kt[i * kBlock + j] = 0.0f;
    std::fill(v + j * d, v + (j + 1) * d, 0.0f);
  }
}

[[gnu::noinline]] float exp_out_of_line(float x) {
  return exp_approx(x);
}

// Portable kernel: the same algorithm as the AVX-512 one, in plain loops, compiled per ISA (on
// an AVX2-only machine it is the kernel that runs).
BLEND_MULTIVERSION
void run_item_portable(const ForwardBatch& batch, const AttentionItem& it, const float* qkv,
                       int64_t stride, int64_t layer, const KvCache& cache,
                       const AttentionShape& sh, DType out_dtype, void* out, Scratch& s) {
  const Item item = prepare(batch, it, qkv, stride, sh, s);
  const SeqChunk& c = batch.chunks[it.chunk];
  const int64_t d = sh.head_dim;
  for (int64_t b = item.block_lo; b <= item.block_hi; ++b) {
    const int64_t k0 = b * kBlock;
    const int64_t n = std::min<int64_t>(kBlock, item.max_hi + 1 - k0);
    // A full block that is one forward f32 page of 16 slots is read where it lies: its keys are
    // already [D][16] and its values [16][D]. Other blocks are gathered into scratch.
    const float* kt = s.kt.data();
    const float* v = s.v.data();
    const int64_t ps = cache.page_size();
    if (n == kBlock && ps == kBlock && cache.dtype() == DType::kF32 && kv_slot(c, k0, ps) == 0) {
      const PageId page = c.block_table[k0 / ps];
      kt = reinterpret_cast<const float*>(cache.k_page(layer, page)) + it.kv_head * d * kBlock;
      v = reinterpret_cast<const float*>(cache.v_page(layer, page)) + it.kv_head * kBlock * d;
    } else {
      gather_portable(c, it.kv_head, k0, n, cache, layer, s.kt.data(), s.v.data());
    }
    for (int64_t r = 0; r < item.rows; ++r) {
      const int64_t ja = std::max(s.lo[r], k0) - k0, jb = std::min(s.hi[r], k0 + kBlock - 1) - k0;
      if (ja > jb) continue;
      const float* q = &s.q[r * d];
      // Four partial sums per key (dimensions i mod 4): four independent chains of
      // multiply-adds per key, where one chain would wait on each add's latency.
      float part[4][kBlock] = {}, sc[kBlock];
      int64_t i4 = 0;
      for (; i4 + 4 <= d; i4 += 4)
        for (int j = 0; j < kBlock; ++j) {
          part[0][j] += q[i4] * kt[i4 * kBlock + j];
          part[1][j] += q[i4 + 1] * kt[(i4 + 1) * kBlock + j];
          part[2][j] += q[i4 + 2] * kt[(i4 + 2) * kBlock + j];
          part[3][j] += q[i4 + 3] * kt[(i4 + 3) * kBlock + j];
        }
      for (; i4 < d; ++i4)
        for (int j = 0; j < kBlock; ++j) part[i4 % 4][j] += q[i4] * kt[i4 * kBlock + j];
      // Fixed 16-lane loops and one out-of-line exp for the row's scalars: each row runs the
      // same instructions whatever its key range, so its bits never depend on its neighbours.
      float mb = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < kBlock; ++j)
        sc[j] = (part[0][j] + part[1][j]) + (part[2][j] + part[3][j]);
      if (s.softcap > 0)
        for (int j = 0; j < kBlock; ++j) sc[j] = softcap(sc[j], s.softcap);
      for (int64_t j = ja; j <= jb; ++j) mb = std::max(mb, sc[j]);
      const float m_new = std::max(s.m[r], mb);
      const float alpha = std::isinf(s.m[r]) ? 0.0f : exp_out_of_line(s.m[r] - m_new);
      float p[kBlock];
      for (int j = 0; j < kBlock; ++j) p[j] = exp_approx(sc[j] - m_new);
      float sum = 0.0f;
      for (int j = 0; j < kBlock; ++j) {
        if (j < ja || j > jb) p[j] = 0.0f;
        sum += p[j];
      }
      // Only the row's own keys [ja, jb] touch its output: a key it must not see is skipped,
      // not weighted 0, since 0 * inf or 0 * NaN is NaN. (A full block read in place holds the
      // chunk's later positions; weighting them 0 let a NaN at position 1 make position 0's
      // output NaN, and the prefix cache then gave that K/V to a healthy request sharing
      // position 0: issue 54.) Each output element stays in a register across the block.
      float* o = &s.o[r * d];
      int64_t i = 0;
      for (; i + 8 <= d; i += 8) {
        Floats8 acc, vj;
        std::memcpy(&acc, o + i, sizeof acc);
        acc *= alpha;
        for (int64_t j = ja; j <= jb; ++j) {
          std::memcpy(&vj, v + j * d + i, sizeof vj);
          acc += p[j] * vj;
        }
        std::memcpy(o + i, &acc, sizeof acc);
      }
      for (; i < d; ++i) {
        float acc = o[i] * alpha;
        for (int64_t j = ja; j <= jb; ++j) acc += p[j] * v[j * d + i];
        o[i] = acc;
      }
      s.l[r] = s.l[r] * alpha + sum;
      s.m[r] = m_new;
    }
  }
  finish(batch, it, sh, s, item.rows, out_dtype, out);
}

#if BLEND_HAVE_AVX512_DISPATCH

// GCC 12's own avx512fintrin.h trips -W(maybe-)uninitialized (its _mm512_undefined_* helpers).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

BLEND_TARGET_AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 16 consecutive cache elements as f32 (bf16 widens exactly); masked lanes are zero.
BLEND_TARGET_AVX512 inline __m512 load16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
BLEND_TARGET_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
BLEND_TARGET_AVX512 inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
BLEND_TARGET_AVX512 inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// One key block as the kernels read it: row i of K^T (16 keys) at kt + i * kt_stride, key j's
// V row at v + j * head_dim, keys past `valid` absent. Either points straight into a cache page
// (T = the cache element) or at a gathered f32 copy.
template <typename T>
struct BlockView {
  const T* kt;
  int64_t kt_stride;
  const T* v;
  __mmask16 valid;
};

// Asks for a coming key block's K and V lines (into L1 with hint T0, L2 with T1) while the
// current block is computed: decode attention is otherwise bound by the latency of reading
// scattered KV pages.
template <int Hint>
BLEND_TARGET_AVX512 inline void prefetch_block(const SeqChunk& c, int64_t kv_head, int64_t k0,
                                               const KvCache& cache, int64_t layer) {
  const int64_t d = cache.head_dim(), ps = cache.page_size();
  const int64_t es = static_cast<int64_t>(dtype_size(cache.dtype()));
  const PageId page = c.block_table[k0 / ps];
  const int64_t slot0 = k0 % ps, n = std::min<int64_t>(kBlock, ps - slot0);
  const auto* kp =
      reinterpret_cast<const char*>(cache.k_page(layer, page)) + (kv_head * d * ps + slot0) * es;
  const auto* vp =
      reinterpret_cast<const char*>(cache.v_page(layer, page)) + (kv_head * ps + slot0) * d * es;
  constexpr auto hint = static_cast<_mm_hint>(Hint);
  if (ps * es <= 64) {  // K^T rows of this head are contiguous: one prefetch per line
    for (int64_t off = 0; off < d * ps * es; off += 64) _mm_prefetch(kp + off, hint);
  } else {
    for (int64_t i = 0; i < d; ++i) _mm_prefetch(kp + i * ps * es, hint);
  }
  for (int64_t off = 0; off < n * d * es; off += 64) _mm_prefetch(vp + off, hint);
}

// Scores of G query rows against one key block. Each row's arithmetic (two chains over even
// and odd head-dim elements, then their sum) is the same whatever G and whichever rows are
// grouped, so grouping for instruction-level parallelism never changes a row's bits.
template <typename T, int G>
BLEND_TARGET_AVX512 inline void scores(const float* const* q, int64_t d, const BlockView<T>& b,
                                       __m512* out) {
  __m512 even[G], odd[G];
  for (int g = 0; g < G; ++g) even[g] = odd[g] = _mm512_setzero_ps();
  for (int64_t i = 0; i < d; i += 2) {
    const __m512 k_even = load16(b.kt + i * b.kt_stride, b.valid);
    const __m512 k_odd = load16(b.kt + (i + 1) * b.kt_stride, b.valid);
    for (int g = 0; g < G; ++g) {
      even[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][i]), k_even, even[g]);
      odd[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][i + 1]), k_odd, odd[g]);
    }
  }
  for (int g = 0; g < G; ++g) out[g] = _mm512_add_ps(even[g], odd[g]);
}

// Online-softmax update of one row with its scores of one block, keys [ja, jb]: new running
// max m and sum l, o scaled by exp(m_old - m), and the block's probabilities into p (zero
// outside [ja, jb]).
template <int NV>
BLEND_TARGET_AVX512 inline void softmax_update(__m512 sc, int64_t ja, int64_t jb, float& m,
                                               float& l, float* o, float* p) {
  // Every step is an explicit instruction, including the scalar ones: an inlined scalar
  // expression may be compiled differently (contracted, vectorised across rows) at different
  // call sites, and a row's bits must not depend on which group it was computed in.
  const __mmask16 mask = static_cast<__mmask16>((0xffffu >> (15 - jb)) & (0xffffu << ja));
  const float m_new = std::max(m, _mm512_mask_reduce_max_ps(mask, sc));
  const __m512 va = std::isinf(m) ? _mm512_setzero_ps() : exp512(_mm512_set1_ps(m - m_new));
  const __m512 pv = _mm512_maskz_mov_ps(mask, exp512(_mm512_sub_ps(sc, _mm512_set1_ps(m_new))));
  _mm512_storeu_ps(p, pv);
  for (int c = 0; c < NV; ++c)
    _mm512_storeu_ps(o + c * 16, _mm512_mul_ps(_mm512_loadu_ps(o + c * 16), va));
  const __m128 sum = _mm_set_ss(_mm512_reduce_add_ps(pv));
  l = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(l), _mm512_castps512_ps128(va), sum));
  m = m_new;
}

// o += p[j] * v[j] for j = a..b in ascending order, one row.
template <typename T, int NV>
BLEND_TARGET_AVX512 inline void pv_row(const float* p, int64_t a, int64_t b, const T* v, float* o) {
  if (a > b) return;
  constexpr int64_t d = NV * 16;
  __m512 acc[NV];
  for (int c = 0; c < NV; ++c) acc[c] = _mm512_loadu_ps(o + c * 16);
  for (int64_t j = a; j <= b; ++j) {
    const __m512 pb = _mm512_set1_ps(p[j]);
    for (int c = 0; c < NV; ++c) acc[c] = _mm512_fmadd_ps(pb, load16(v + j * d + c * 16), acc[c]);
  }
  for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + c * 16, acc[c]);
}

// The same for G rows over a common key range, two 16-lane column chunks at a time: 2G
// independent FMA chains share each V load. Per lane the order (j ascending) is pv_row's.
template <typename T, int NV, int G>
BLEND_TARGET_AVX512 inline void pv_group(const float (*p)[kBlock], int64_t a, int64_t b, const T* v,
                                         float* const* o) {
  constexpr int64_t d = NV * 16;
  for (int c = 0; c < NV; c += 2) {
    const bool two = c + 1 < NV;
    __m512 acc0[G], acc1[G];
    for (int g = 0; g < G; ++g) {
      acc0[g] = _mm512_loadu_ps(o[g] + c * 16);
      acc1[g] = two ? _mm512_loadu_ps(o[g] + c * 16 + 16) : _mm512_setzero_ps();
    }
    for (int64_t j = a; j <= b; ++j) {
      const __m512 v0 = load16(v + j * d + c * 16);
      const __m512 v1 = two ? load16(v + j * d + c * 16 + 16) : _mm512_setzero_ps();
      for (int g = 0; g < G; ++g) {
        const __m512 pb = _mm512_set1_ps(p[g][j]);
        acc0[g] = _mm512_fmadd_ps(pb, v0, acc0[g]);
        acc1[g] = _mm512_fmadd_ps(pb, v1, acc1[g]);
      }
    }
    for (int g = 0; g < G; ++g) {
      _mm512_storeu_ps(o[g] + c * 16, acc0[g]);
      if (two) _mm512_storeu_ps(o[g] + c * 16 + 16, acc1[g]);
    }
  }
}

// ops.h softcap() on each of 16 scores, lane by lane (the scalar function, so both kernels
// cap alike).
BLEND_TARGET_AVX512 inline __m512 softcap16(__m512 x, float cap) {
  alignas(64) float lanes[kBlock];
  _mm512_store_ps(lanes, x);
  for (float& v : lanes) v = softcap(v, cap);
  return _mm512_load_ps(lanes);
}

// G active rows (indices `rows`, key ranges [ja, jb] within the block) against one block.
template <typename T, int NV, int G>
BLEND_TARGET_AVX512 void group_block(Scratch& s, const BlockView<T>& b, const int64_t* rows,
                                     const int64_t* ja, const int64_t* jb) {
  constexpr int64_t d = NV * 16;
  const float* q[G];
  float* o[G];
  for (int g = 0; g < G; ++g) {
    q[g] = &s.q[rows[g] * d];
    o[g] = &s.o[rows[g] * d];
  }
  __m512 sc[G];
  scores<T, G>(q, d, b, sc);
  if (s.softcap > 0)
    for (int g = 0; g < G; ++g) sc[g] = softcap16(sc[g], s.softcap);
  alignas(64) float p[G][kBlock];
  int64_t lo = 0, hi = kBlock - 1;  // keys every row of the group attends to
  for (int g = 0; g < G; ++g) {
    softmax_update<NV>(sc[g], ja[g], jb[g], s.m[rows[g]], s.l[rows[g]], o[g], p[g]);
    lo = std::max(lo, ja[g]);
    hi = std::min(hi, jb[g]);
  }
  if (lo > hi) {
    for (int g = 0; g < G; ++g) pv_row<T, NV>(p[g], ja[g], jb[g], b.v, o[g]);
    return;
  }
  for (int g = 0; g < G; ++g) pv_row<T, NV>(p[g], ja[g], lo - 1, b.v, o[g]);
  pv_group<T, NV, G>(p, lo, hi, b.v, o);
  for (int g = 0; g < G; ++g) pv_row<T, NV>(p[g], hi + 1, jb[g], b.v, o[g]);
}

// All active rows of the item against one block, in groups of 8 (then 4, then what is left).
template <typename T, int NV>
BLEND_TARGET_AVX512 void rows_block(Scratch& s, const BlockView<T>& b, int64_t k0, int64_t rows) {
  int64_t* active = s.active.data();
  int64_t* ja = s.ja.data();
  int64_t* jb = s.jb.data();
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t a = std::max(s.lo[r], k0) - k0, e = std::min(s.hi[r], k0 + kBlock - 1) - k0;
    if (a > e) continue;
    active[n] = r;
    ja[n] = a;
    jb[n] = e;
    ++n;
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) group_block<T, NV, 8>(s, b, active + i, ja + i, jb + i);
  for (; i + 4 <= n; i += 4) group_block<T, NV, 4>(s, b, active + i, ja + i, jb + i);
  switch (n - i) {
    case 3:
      group_block<T, NV, 3>(s, b, active + i, ja + i, jb + i);
      break;
    case 2:
      group_block<T, NV, 2>(s, b, active + i, ja + i, jb + i);
      break;
    case 1:
      group_block<T, NV, 1>(s, b, active + i, ja + i, jb + i);
      break;
    default:
      break;
  }
}

// Key blocks read in place from the cache pages (page_size a multiple of 16, so a block never
// straddles pages), elements of type T.
template <typename T, int NV>
BLEND_TARGET_AVX512 void blocks_in_place(const SeqChunk& c, const AttentionItem& it,
                                         const Item& item, const KvCache& cache, int64_t layer,
                                         Scratch& s) {
  constexpr int64_t d = NV * 16;
  const int64_t ps = cache.page_size();
  // Prefetch distances in blocks: far into L2, near into L1 (more than ~4 blocks in L1 would
  // evict the one being computed).
  constexpr int64_t kFar = 6, kNear = 2;
  for (int64_t b = item.block_lo; b <= std::min(item.block_hi, item.block_lo + kFar - 1); ++b)
    prefetch_block<_MM_HINT_T1>(c, it.kv_head, b * kBlock, cache, layer);
  for (int64_t b = item.block_lo; b <= item.block_hi; ++b) {
    const int64_t k0 = b * kBlock;
    if (b + kFar <= item.block_hi)
      prefetch_block<_MM_HINT_T1>(c, it.kv_head, k0 + kFar * kBlock, cache, layer);
    if (b + kNear <= item.block_hi)
      prefetch_block<_MM_HINT_T0>(c, it.kv_head, k0 + kNear * kBlock, cache, layer);
    const PageId page = c.block_table[k0 / ps];
    const int64_t slot0 = k0 % ps, n = std::min<int64_t>(kBlock, item.max_hi + 1 - k0);
    const BlockView<T> view{
        reinterpret_cast<const T*>(cache.k_page(layer, page)) + it.kv_head * d * ps + slot0, ps,
        reinterpret_cast<const T*>(cache.v_page(layer, page)) + (it.kv_head * ps + slot0) * d,
        static_cast<__mmask16>((1u << n) - 1u)};
    if (std::is_same_v<T, float> || item.rows <= 4) {
      rows_block<T, NV>(s, view, k0, item.rows);
      continue;
    }
    // Many query rows (a prefill tile): widen the bf16 block to f32 once instead of once per
    // row group. The values are the same, so the rows' results are too.
    for (int64_t i = 0; i < d; ++i)
      _mm512_storeu_ps(&s.kt[i * kBlock], load16(view.kt + i * ps, view.valid));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t c16 = 0; c16 < d; c16 += 16)
        _mm512_storeu_ps(&s.v[j * d + c16], load16(view.v + j * d + c16));
    rows_block<float, NV>(s, BlockView<float>{s.kt.data(), kBlock, s.v.data(), view.valid}, k0,
                          item.rows);
  }
}

template <int NV>
BLEND_TARGET_AVX512 void run_item_avx512(const ForwardBatch& batch, const AttentionItem& it,
                                         const float* qkv, int64_t stride, int64_t layer,
                                         const KvCache& cache, const AttentionShape& sh,
                                         DType out_dtype, void* out, Scratch& s) {
  const Item item = prepare(batch, it, qkv, stride, sh, s);
  const SeqChunk& c = batch.chunks[it.chunk];
  if (cache.page_size() % kBlock == 0 &&
      !has_reversed_pages(c, item.max_hi + 1, cache.page_size())) {
    if (cache.dtype() == DType::kF32) {
      blocks_in_place<float, NV>(c, it, item, cache, layer, s);
    } else {
      blocks_in_place<uint16_t, NV>(c, it, item, cache, layer, s);
    }
  } else {  // blocks straddle pages or run backwards: gather each into f32 scratch first
    for (int64_t b = item.block_lo; b <= item.block_hi; ++b) {
      const int64_t k0 = b * kBlock;
      gather_portable(c, it.kv_head, k0, std::min<int64_t>(kBlock, item.max_hi + 1 - k0), cache,
                      layer, s.kt.data(), s.v.data());
      rows_block<float, NV>(s, BlockView<float>{s.kt.data(), kBlock, s.v.data(), 0xffff}, k0,
                            item.rows);
    }
  }
  finish(batch, it, sh, s, item.rows, out_dtype, out);
}

#pragma GCC diagnostic pop

#endif  // BLEND_HAVE_AVX512_DISPATCH

}  // namespace

std::vector<AttentionItem> plan_attention(const ForwardBatch& batch, const AttentionShape& sh) {
  const int64_t group = sh.num_heads / sh.num_kv_heads;
  // About 16 query rows per item: enough rows to share each key block's loads, few enough to
  // leave many items for the threads.
  const int32_t tokens = static_cast<int32_t>(std::max<int64_t>(1, 16 / group));
  std::vector<AttentionItem> items;
  std::vector<int64_t> cost;
  for (int32_t ci = 0; ci < static_cast<int32_t>(batch.chunks.size()); ++ci) {
    const SeqChunk& c = batch.chunks[ci];
    for (int32_t first = 0; first < c.num_tokens; first += tokens) {
      const int32_t count = std::min(tokens, c.num_tokens - first);
      int64_t keys = c.num_cached + first + count;
      if (sh.sliding_window > 0) keys = std::min(keys, sh.sliding_window + count);
      for (int32_t g = 0; g < sh.num_kv_heads; ++g) {
        items.push_back({ci, g, first, count});
        cost.push_back(keys * count);
      }
    }
  }
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<AttentionItem> sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(items[i]);
  return sorted;
}

void write_kv(const ForwardBatch& batch, const float* qkv, int64_t stride, int64_t k_col,
              int64_t v_col, int64_t layer, KvCache& cache, int threads) {
  const int64_t d = cache.head_dim(), ps = cache.page_size(), heads = cache.kv_heads();
  const DType dt = cache.dtype();
  const int64_t n = batch.num_tokens();
  std::vector<int32_t> chunk_of(n);
  for (int32_t ci = 0; ci < static_cast<int32_t>(batch.chunks.size()); ++ci) {
    const SeqChunk& c = batch.chunks[ci];
    std::fill_n(chunk_of.begin() + c.token_offset, c.num_tokens, ci);
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t tok = 0; tok < n; ++tok) {
    const SeqChunk& c = batch.chunks[chunk_of[tok]];
    const int64_t pos = batch.positions[tok];
    const PageId page = c.block_table[pos / ps];
    const int64_t slot = kv_slot(c, pos, ps);
    const float* k = qkv + tok * stride + k_col;
    const float* v = qkv + tok * stride + v_col;
    std::byte* kp = cache.k_page(layer, page);
    std::byte* vp = cache.v_page(layer, page);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < d; ++i) {
        const int64_t ki = (h * d + i) * ps + slot;  // K is stored transposed
        if (dt == DType::kF32) {
          std::memcpy(kp + ki * 4, &k[h * d + i], 4);
        } else {
          const uint16_t b = f32_to_bf16(k[h * d + i]);
          std::memcpy(kp + ki * 2, &b, 2);
        }
      }
      store_row(v + h * d, d, dt, vp + (h * ps + slot) * d * dtype_size(dt));
    }
  }
}

void paged_attention(const ForwardBatch& batch, const std::vector<AttentionItem>& items,
                     const float* qkv, int64_t stride, int64_t layer, const KvCache& cache,
                     const AttentionShape& sh, DType out_dtype, void* out, int threads) {
  using Kernel = void (*)(const ForwardBatch&, const AttentionItem&, const float*, int64_t, int64_t,
                          const KvCache&, const AttentionShape&, DType, void*, Scratch&);
  Kernel kernel = run_item_portable;
#if BLEND_HAVE_AVX512_DISPATCH
  if (use_avx512()) {
    switch (sh.head_dim) {  // one instantiation per head_dim, so the output stays in registers
      case 16:
        kernel = run_item_avx512<1>;
        break;
      case 32:
        kernel = run_item_avx512<2>;
        break;
      case 48:
        kernel = run_item_avx512<3>;
        break;
      case 64:
        kernel = run_item_avx512<4>;
        break;
      case 80:
        kernel = run_item_avx512<5>;
        break;
      case 96:
        kernel = run_item_avx512<6>;
        break;
      case 128:
        kernel = run_item_avx512<8>;
        break;
      case 256:
        kernel = run_item_avx512<16>;
        break;
      default:
        break;  // other sizes take the portable kernel
    }
  }
#endif
  if (sh.head_dim > 1024 || sh.head_dim % 2 != 0)
    throw Error("cpu backend: head_dim " + std::to_string(sh.head_dim) + " not supported");
  const int64_t n = static_cast<int64_t>(items.size());
#pragma omp parallel num_threads(threads)
  {
    Scratch s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i)
      kernel(batch, items[i], qkv, stride, layer, cache, sh, out_dtype, out, s);
  }
}

}  // namespace blend::cpu
