#include "backend/cpu/blocks.h"

#include <bit>
#include <cstring>
#include <string>

#include "core/error.h"
#include "model/weights.h"

namespace blend::cpu {
namespace {

std::vector<float> load_vector(const TensorView& t) {
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.at(i);
  return v;
}

uint64_t content_hash(const TensorView& t) {
  uint64_t h = 0x243f6a8885a308d3ull;
  auto mix = [&h](uint64_t w) {
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  };
  mix(static_cast<uint64_t>(t.dtype));
  for (int64_t d : t.shape) mix(static_cast<uint64_t>(d));
  size_t i = 0;
  for (; i + 8 <= t.nbytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, t.data + i, 8);
    mix(w);
  }
  for (; i < t.nbytes; ++i) mix(static_cast<uint64_t>(t.data[i]));
  return h;
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes &&
         std::memcmp(a.data, b.data, a.nbytes) == 0;
}

}  // namespace

Chain BlockLoader::load(const TensorStore& store, const LoraAdapter* adapter) {
  if (per_model_) id_of_view_.clear();  // this model's tensors get ids no other model holds
  const ModelConfig& config = config_;
  const LlamaTensors tensors = bind_llama_tensors(config, store);
  Chain chain;
  const TensorView* embed = tensors.embedding;
  chain.embed = shared(blocks_.embeddings, Kind::kEmbedding, {embed}, {}, [&] {
    blocks_.stats.bytes += static_cast<int64_t>(embed->nbytes);
    return make_embedding(*embed);
  });
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const LlamaLayerTensors& layer = tensors.layers[static_cast<size_t>(i)];
    auto factors = [&](std::initializer_list<LoraModule> modules) {
      std::vector<LoraAdapter::Factors> f;
      for (LoraModule m : modules)
        f.push_back(adapter ? adapter->factors(i, m) : LoraAdapter::Factors{});
      return f;
    };
    const std::vector<const TensorView*>& qkv = layer.qkv;
    const std::vector<const TensorView*>& bias = layer.qkv_bias;
    const TensorView* norm = layer.attention_norm;
    const TensorView* o = layer.o;
    std::vector<const TensorView*> parts{norm, o};
    parts.insert(parts.end(), qkv.begin(), qkv.end());
    parts.insert(parts.end(), bias.begin(), bias.end());
    if (layer.q_norm) parts.insert(parts.end(), {layer.q_norm, layer.k_norm});
    if (layer.post_attention_norm) parts.push_back(layer.post_attention_norm);
    const auto qkv_factors = factors({LoraModule::kQ, LoraModule::kK, LoraModule::kV});
    const auto o_factors = factors({LoraModule::kO});
    chain.attention.push_back(shared(blocks_.attentions, Kind::kAttention, parts,
                                     lora_key(qkv_factors, o_factors, adapter), [&] {
                                       auto block = std::make_unique<AttentionBlock>();
                                       block->norm = load_norm(*norm);
                                       if (layer.q_norm) {
                                         block->q_norm = load_norm(*layer.q_norm);
                                         block->k_norm = load_norm(*layer.k_norm);
                                       }
                                       if (layer.post_attention_norm)
                                         block->post_norm = load_norm(*layer.post_attention_norm);
                                       block->qkv = linear(Kind::kQkv, qkv, bias);
                                       block->o = linear(Kind::kO, {o});
                                       block->qkv_lora = lora(qkv_factors, qkv, adapter);
                                       block->o_lora = lora(o_factors, {o}, adapter);
                                       return block;
                                     }));
    const TensorView* mlp_norm = layer.ffn_norm;
    const std::vector<const TensorView*>& gate_up = layer.gate_up;
    const TensorView* down = layer.down;
    const auto gate_up_factors = factors({LoraModule::kGate, LoraModule::kUp});
    const auto down_factors = factors({LoraModule::kDown});
    std::vector<const TensorView*> ffn_parts{mlp_norm};
    ffn_parts.insert(ffn_parts.end(), gate_up.begin(), gate_up.end());
    ffn_parts.push_back(down);
    if (layer.post_ffn_norm) ffn_parts.push_back(layer.post_ffn_norm);
    chain.ffn.push_back(shared(blocks_.ffns, Kind::kFfn, ffn_parts,
                               lora_key(gate_up_factors, down_factors, adapter), [&] {
                                 auto block = std::make_unique<FfnBlock>();
                                 block->norm = load_norm(*mlp_norm);
                                 if (layer.post_ffn_norm)
                                   block->post_norm = load_norm(*layer.post_ffn_norm);
                                 block->gate_up = linear(Kind::kGateUp, gate_up);
                                 block->down = linear(Kind::kDown, {down});
                                 block->gate_up_lora = lora(gate_up_factors, gate_up, adapter);
                                 block->down_lora = lora(down_factors, {down}, adapter);
                                 return block;
                               }));
  }
  const TensorView* norm = tensors.final_norm;
  const TensorView* lm_head = tensors.lm_head;
  chain.head = shared(blocks_.heads, Kind::kHead, {norm, lm_head}, {}, [&] {
    auto block = std::make_unique<HeadBlock>();
    block->norm = load_norm(*norm);
    block->lm_head = linear(Kind::kLmHead, {lm_head});
    return block;
  });
  return chain;
}

// The content id of tensor `t` (see the class comment).
int64_t BlockLoader::id(const TensorView* t) {
  if (auto it = id_of_view_.find(t); it != id_of_view_.end()) return it->second;
  int64_t id = -1;
  if (share_) {
    const uint64_t hash = content_hash(*t);
    auto [first, last] = id_of_hash_.equal_range(hash);
    for (auto it = first; it != last && id < 0; ++it)
      if (same_bytes(*it->second.first, *t)) id = it->second.second;
    if (id < 0) id_of_hash_.emplace(hash, std::pair{t, next_id_});
  }
  if (id < 0) id = next_id_++;
  id_of_view_.emplace(t, id);
  return id;
}
BlockLoader::Key BlockLoader::key(Kind kind, const std::vector<const TensorView*>& tensors) {
  Key k{static_cast<int64_t>(kind)};
  for (const TensorView* t : tensors) k.push_back(id(t));
  return k;
}

// The block of `kind` made of `tensors` (and the LoRA factors `extra` names): the existing one
// with that content, or a new one from make().
template <typename Block, typename Make>
Block* BlockLoader::shared(std::vector<std::unique_ptr<Block>>& owned, Kind kind,
                           const std::vector<const TensorView*>& tensors, const Key& extra,
                           Make make) {
  for (const TensorView* t : tensors)
    blocks_.stats.unshared_bytes += static_cast<int64_t>(t->nbytes);
  ++blocks_.stats.blocks;
  Key k = key(kind, tensors);
  k.insert(k.end(), extra.begin(), extra.end());
  if (auto it = built_.find(k); it != built_.end()) return static_cast<Block*>(it->second);
  owned.push_back(make());
  ++blocks_.stats.unique_blocks;
  built_.emplace(std::move(k), owned.back().get());
  return owned.back().get();
}

// A packed linear layer over `parts` (and `bias`), shared by every block holding them.
std::shared_ptr<Linear> BlockLoader::linear(Kind kind, const std::vector<const TensorView*>& parts,
                                            const std::vector<const TensorView*>& bias) {
  Key k = key(kind, parts);
  for (const TensorView* t : bias) k.push_back(id(t));
  auto& slot = linears_[k];
  if (!slot) {
    slot = std::make_shared<Linear>(gemm_, parts, bias);
    for (const auto* list : {&parts, &bias})
      for (const TensorView* t : *list) blocks_.stats.bytes += static_cast<int64_t>(t->nbytes);
  }
  return slot;
}

// A norm's weights in f32, shared by every block holding the same tensor. Gemma's norms scale
// by (1 + w), computed here once in f32 as transformers' Gemma RMSNorm computes it.
std::shared_ptr<const std::vector<float>> BlockLoader::load_norm(const TensorView& norm) {
  auto& slot = norms_[id(&norm)];
  if (!slot) {
    std::vector<float> w = load_vector(norm);
    if (config_.gemma.enabled)
      for (float& v : w) v = 1.0f + v;
    slot = std::make_shared<const std::vector<float>>(std::move(w));
    blocks_.stats.bytes += static_cast<int64_t>(norm.nbytes);
  }
  return slot;
}

// What names an adapter's part of a block: its factors' ids and its scale.
BlockLoader::Key BlockLoader::lora_key(const std::vector<LoraAdapter::Factors>& first,
                                       const std::vector<LoraAdapter::Factors>& second,
                                       const LoraAdapter* adapter) {
  Key k;
  for (const auto* list : {&first, &second})
    for (const LoraAdapter::Factors& f : *list) {
      if (!f) continue;
      if (k.empty()) {
        k.push_back(static_cast<int64_t>(Kind::kLora));
        k.push_back(std::bit_cast<int64_t>(adapter->scale()));
      }
      k.push_back(id(f.a));
      k.push_back(id(f.b));
    }
  return k;
}

// The delta of the adapted parts among `factors` (one per part of `weights`, the fused
// layer's parts in order), or null when none is adapted.
std::unique_ptr<LoraDelta> BlockLoader::lora(const std::vector<LoraAdapter::Factors>& factors,
                                             const std::vector<const TensorView*>& weights,
                                             const LoraAdapter* adapter) {
  std::vector<const TensorView*> a;
  for (const LoraAdapter::Factors& f : factors)
    if (f) a.push_back(f.a);
  if (a.empty()) return nullptr;
  for (const TensorView* w : weights)
    if (is_block_type(w->dtype))
      throw Error("cpu backend: a LoRA adapter on '" + w->name + "', a " +
                  std::string(dtype_name(w->dtype)) +
                  " matrix: adapters on quantized weights are not checked yet");
  const int64_t rank = adapter->rank(), cols = rank * static_cast<int64_t>(a.size());
  int64_t n = 0;
  for (const TensorView* w : weights) n += w->shape[0];
  // scale * B of each adapted part, placed at its part's rows and its rank columns.
  std::vector<float> b(static_cast<size_t>(n * cols), 0.0f);
  int64_t row = 0, col = 0;
  for (size_t p = 0; p < factors.size(); ++p) {
    if (const TensorView* fb = factors[p].b) {
      for (int64_t i = 0; i < fb->shape[0]; ++i)
        for (int64_t j = 0; j < rank; ++j)
          b[static_cast<size_t>((row + i) * cols + col + j)] =
              static_cast<float>(adapter->scale() * fb->at(i * rank + j));
      col += rank;
      blocks_.stats.bytes += static_cast<int64_t>(factors[p].a->nbytes + fb->nbytes);
    }
    row += weights[p]->shape[0];
  }
  TensorView view;
  view.name = "lora_B";
  view.dtype = DType::kF32;
  view.shape = {n, cols};
  view.data = reinterpret_cast<const std::byte*>(b.data());
  view.nbytes = b.size() * sizeof(float);
  auto delta = std::make_unique<LoraDelta>();
  delta->a = std::make_unique<Linear>(gemm_, a);
  delta->b = std::make_unique<Linear>(gemm_, std::vector<const TensorView*>{&view});
  return delta;
}

// The embedding rows stay exact: bf16 and block types as stored (a Q8_0 or Q6_K row is
// dequantized when a token looks it up: Llama 3's 128K x 2048 table is 278 MB as Q8_0, 1 GB as
// f32), f16 widened to f32.
std::unique_ptr<Embedding> BlockLoader::make_embedding(const TensorView& embed) const {
  auto e = std::make_unique<Embedding>();
  if (is_block_type(embed.dtype)) {
    e->dtype = embed.dtype;
    e->rows.assign(embed.data, embed.data + embed.nbytes);
    return e;
  }
  e->dtype = file_dtype_ == DType::kBF16 ? DType::kBF16 : DType::kF32;
  e->rows.resize(embed.numel() * dtype_size(e->dtype));
  if (embed.dtype == e->dtype) {
    std::memcpy(e->rows.data(), embed.data, e->rows.size());
  } else {
    auto* out = reinterpret_cast<float*>(e->rows.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < embed.numel(); ++i) out[i] = embed.at(i);
  }
  return e;
}

}  // namespace blend::cpu
