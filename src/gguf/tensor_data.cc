#include "gguf/tensor_data.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/quant.h"
#include "gguf/export.h"

namespace blend {

int64_t gguf_permuted_source_row(int64_t row, int64_t n_head, int64_t rows) {
  // weights.reshape(n_head, 2, rows/n_head/2, ...).swapaxes(1, 2).reshape(rows, ...)
  const int64_t hd = rows / n_head, half = hd / 2;
  const int64_t h = row / hd, r = row % hd;
  return h * hd + (r % 2) * half + r / 2;
}

std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  if (c.rope_scaling.type != "llama3") return {};
  const int64_t dim = c.head_dim;
  const float base = static_cast<float>(c.rope_theta);
  const float factor = static_cast<float>(c.rope_scaling.factor);
  const float low = static_cast<float>(c.rope_scaling.low_freq_factor);
  const float high = static_cast<float>(c.rope_scaling.high_freq_factor);
  const float old_ctx = static_cast<float>(c.rope_scaling.original_max_position_embeddings);
  const float low_wavelen =
      static_cast<float>(static_cast<double>(c.rope_scaling.original_max_position_embeddings) /
                         c.rope_scaling.low_freq_factor);
  const float high_wavelen =
      static_cast<float>(static_cast<double>(c.rope_scaling.original_max_position_embeddings) /
                         c.rope_scaling.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  std::vector<float> out;
  for (int64_t i = 0; i < dim; i += 2) {
    const float e = static_cast<float>(i) / static_cast<float>(dim);
    const float freq = 1.0f / std::pow(base, e);
    const float wavelen = two_pi / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(factor);
    } else {
      const float smooth = (old_ctx / wavelen - low) / (high - low);
      out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return out;
}

namespace gguf_internal {
namespace {

float load_element(const std::byte* p, DType t) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case DType::kQ8_0:  // a block type: check_tensors refuses it before an export reads one
    case DType::kQ5_0:
    case DType::kQ4_K:
    case DType::kQ6_K:
      throw Error("GGUF export reads f32, bf16 or f16 tensors, not " + std::string(dtype_name(t)) +
                  " blocks");
  }
  return 0;
}

void store_element(std::byte* p, GgmlType t, float v) {
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(p, &v, 4);
      return;
    case GgmlType::kBF16: {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    case GgmlType::kF16: {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(p, &h, 2);
      return;
    }
    default:  // block types are quantized a row at a time, never element by element
      throw Error("gguf: element-wise store of a block-quantized type");
  }
}

// Converts n elements; bytes are copied unchanged when the types agree.
void convert(const std::byte* src, DType st, std::byte* dst, GgmlType dt, size_t n) {
  if (ggml_type_of(st) == dt) {
    std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  const size_t ss = dtype_size(st), ds = ggml_type_size(dt);
  for (size_t i = 0; i < n; ++i) store_element(dst + i * ds, dt, load_element(src + i * ss, st));
}

}  // namespace

void release_pages(const TensorView& v) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(v.data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(v.data) + v.nbytes + page - 1) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

namespace {

// Row r of t (HF row gguf_permuted_source_row(r) when permuted) as f32 in `row`, quantized to
// t.type at `q`.
void quantize_source_row(const PlannedTensor& t, int64_t r, int64_t rows, int64_t cols, float* row,
                         std::byte* q) {
  if (t.source) {
    const int64_t sr = t.permute_heads > 0 ? gguf_permuted_source_row(r, t.permute_heads, rows) : r;
    const size_t ss = dtype_size(t.source->dtype);
    for (int64_t c = 0; c < cols; ++c)
      row[c] =
          load_element(t.source->data + static_cast<size_t>(sr * cols + c) * ss, t.source->dtype);
  } else {
    std::copy_n(t.values.begin() + r * cols, cols, row);
  }
  quantize_row(static_cast<uint32_t>(t.type), row, q, cols);
}

// A block-quantized tensor: each row (after the q/k permutation) converted to f32 and quantized
// with ggml's reference quantizer. Rows are independent, so a chunk of them (~8 MiB of f32) is
// quantized on every core and written in order: the same bytes as one thread, in about
// 1 / cores of the time (llama-quantize also quantizes on all threads).
void write_quantized(OutFile& out, const PlannedTensor& t) {
  const int64_t rows = t.shape.size() > 1 ? t.shape[0] : 1;
  const int64_t cols = t.numel() / rows;
  const GgmlBlockLayout layout = *ggml_block_layout(static_cast<uint32_t>(t.type));
  const size_t row_bytes = static_cast<size_t>(cols) / layout.block_elems * layout.block_bytes;
  const int64_t chunk_rows = std::max<int64_t>(1, (int64_t{8} << 20) / (cols * 4));
  std::vector<float> values(static_cast<size_t>(std::min(rows, chunk_rows) * cols));
  std::vector<std::byte> q(static_cast<size_t>(std::min(rows, chunk_rows)) * row_bytes);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    std::exception_ptr failure;  // an exception may not leave an OpenMP region
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      try {
        quantize_source_row(t, r0 + i, rows, cols, values.data() + i * cols,
                            q.data() + static_cast<size_t>(i) * row_bytes);
      } catch (...) {
#pragma omp critical(blend_gguf_quantize_failure)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    out.write(q.data(), static_cast<size_t>(n) * row_bytes);
  }
}

}  // namespace

void write_tensor_data(OutFile& out, const PlannedTensor& t) {
  if (ggml_block_layout(static_cast<uint32_t>(t.type))->block_elems > 1)
    return write_quantized(out, t);
  const size_t ds = ggml_type_size(t.type);
  constexpr size_t kChunkBytes = 8u << 20;
  std::vector<std::byte> buf;
  if (!t.source) {
    buf.resize(t.values.size() * ds);
    for (size_t i = 0; i < t.values.size(); ++i)
      store_element(buf.data() + i * ds, t.type, t.values[i]);
    out.write(buf.data(), buf.size());
    return;
  }
  const TensorView& src = *t.source;
  const size_t ss = dtype_size(src.dtype);
  const int64_t numel = t.numel();
  if (t.permute_heads == 0) {
    const size_t chunk = std::max<size_t>(1, kChunkBytes / ds);
    buf.resize(std::min<size_t>(chunk, static_cast<size_t>(numel)) * ds);
    for (int64_t i = 0; i < numel; i += static_cast<int64_t>(chunk)) {
      const size_t k = static_cast<size_t>(std::min<int64_t>(chunk, numel - i));
      convert(src.data + i * ss, src.dtype, buf.data(), t.type, k);
      out.write(buf.data(), k * ds);
    }
    return;
  }
  const int64_t rows = t.shape[0];
  const int64_t cols = numel / rows;
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / (static_cast<size_t>(cols) * ds)));
  buf.resize(static_cast<size_t>(std::min(rows, rows_per_chunk) * cols) * ds);
  for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
    const int64_t r1 = std::min(rows, r0 + rows_per_chunk);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t sr = gguf_permuted_source_row(r, t.permute_heads, rows);
      convert(src.data + static_cast<size_t>(sr * cols) * ss, src.dtype,
              buf.data() + static_cast<size_t>((r - r0) * cols) * ds, t.type,
              static_cast<size_t>(cols));
    }
    out.write(buf.data(), static_cast<size_t>((r1 - r0) * cols) * ds);
  }
}

std::string gguf_tensor_name(const std::string& hf, int64_t& layer) {
  layer = -1;
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string prefix = "model.layers.";
  if (hf.starts_with(prefix)) {
    const size_t dot = hf.find('.', prefix.size());
    layer = std::stoll(hf.substr(prefix.size(), dot - prefix.size()));
    const std::string rest = hf.substr(dot + 1);
    static const std::pair<const char*, const char*> kMap[] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.qkv_proj.weight", "attn_qkv.weight"},  // Phi-3's fused q, k, v
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        // Gemma's (export.cc names its post_attention_layernorm apart).
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
        {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"mlp.gate_up_proj.weight", "ffn_up.weight"},  // Phi-3: gate rows, then up rows
    };
    for (const auto& [from, to] : kMap)
      if (rest == from) return "blk." + std::to_string(layer) + "." + to;
  }
  throw Error("gguf: no GGUF name for tensor '" + hf + "'");
}

}  // namespace gguf_internal
}  // namespace blend
