// The cpu backend's model blocks (BlockLLM §4.2-§4.3) and how models share them. A model is a
// chain of blocks cut at architectural boundaries: the embedding, each layer's attention (its
// norm, Q/K/V and output projections) and FFN (its norm, gate/up and down projections), and the
// head (final norm and lm_head). BlockLoader builds each block, and each packed linear layer,
// once per content: blocks whose tensors are byte-identical across models are loaded once and
// shared. Private to backend/cpu.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/safetensors.h"

namespace blend::cpu {

struct Embedding {
  DType dtype = DType::kF32;  // kBF16 for bf16 checkpoints, a block type as stored, else f32
  std::vector<std::byte> rows;
};

// A LoRA adapter's change to one (possibly fused) linear layer: y += scale * (x A^T) B^T for
// each adapted part, as two GEMMs: `a` stacks the parts' A factors ([R, k], R = rank x parts)
// and `b` holds scale * B of each part in its rows of the fused output and its rank columns
// ([n, R], zero elsewhere).
struct LoraDelta {
  std::unique_ptr<Linear> a, b;
};

// A block's linear layers are shared with every block holding the same tensors: an attention
// block with a LoRA adapter is its own block (BlockLLM §4.3) but computes its base projection
// with the base block's packed weights, over the rows of both (one base GEMM for all tenants of
// a base, then each adapter's delta on its own rows: S-LoRA's split of the work).
struct AttentionBlock {
  std::shared_ptr<const std::vector<float>> norm;
  std::shared_ptr<const std::vector<float>> q_norm, k_norm;  // per head (Qwen3), or null
  std::shared_ptr<const std::vector<float>> post_norm;       // of the output (Gemma), or null
  std::shared_ptr<Linear> qkv, o;
  std::unique_ptr<LoraDelta> qkv_lora, o_lora;  // null without an adapter
};
struct FfnBlock {
  std::shared_ptr<const std::vector<float>> norm;
  std::shared_ptr<const std::vector<float>> post_norm;  // of the output (Gemma), or null
  std::shared_ptr<Linear> gate_up, down;
  std::unique_ptr<LoraDelta> gate_up_lora, down_lora;
};
struct HeadBlock {
  std::shared_ptr<const std::vector<float>> norm;
  std::shared_ptr<Linear> lm_head;
};

// One model: its blocks in order. attention and ffn may hold fewer blocks than the model has
// layers (Backend::add_chain): rows of such a chain skip the layers past them.
struct Chain {
  Embedding* embed = nullptr;
  std::vector<AttentionBlock*> attention;
  std::vector<FfnBlock*> ffn;
  HeadBlock* head = nullptr;
};

// Every block the backend holds, each once, and one chain per model pointing into them.
struct BlockSet {
  std::vector<std::unique_ptr<Embedding>> embeddings;
  std::vector<std::unique_ptr<AttentionBlock>> attentions;
  std::vector<std::unique_ptr<FfnBlock>> ffns;
  std::vector<std::unique_ptr<HeadBlock>> heads;
  std::vector<Chain> chains;
  WeightStats stats;
};

// Loads models into a BlockSet. Every tensor gets a content id (byte-identical tensors one id:
// hashed, then compared byte by byte, never trusted to the hash); a block or linear layer is
// named by its kind and its tensors' ids, and one already built under that name is reused.
// Without `share` (one model, or Tenancy::kParameterSharing) nothing is hashed: only the very
// same tensors (a LoRA adapter's base store, loaded once) are one. With `per_model`, not even
// those: each load() names its tensors afresh (Tenancy::kPerModel).
class BlockLoader {
 public:
  // `blocks` and `gemm` must outlive the loader; file_dtype is the checkpoints' element type.
  BlockLoader(BlockSet& blocks, GemmContext& gemm, const ModelConfig& config, DType file_dtype,
              bool share, bool per_model = false)
      : blocks_(blocks),
        gemm_(gemm),
        config_(config),
        file_dtype_(file_dtype),
        share_(share && !per_model),
        per_model_(per_model) {}

  // The chain of the model in `store` (with `adapter`'s LoRA deltas when not null), its new
  // blocks added to the set. The caller appends it to blocks.chains.
  Chain load(const TensorStore& store, const LoraAdapter* adapter);

 private:
  enum class Kind : int64_t {
    kEmbedding = -1,
    kAttention = -2,
    kFfn = -3,
    kHead = -4,
    kQkv = -5,
    kO = -6,
    kGateUp = -7,
    kDown = -8,
    kLmHead = -9,
    kLora = -10
  };
  using Key = std::vector<int64_t>;

  int64_t id(const TensorView* t);
  Key key(Kind kind, const std::vector<const TensorView*>& tensors);
  template <typename Block, typename Make>
  Block* shared(std::vector<std::unique_ptr<Block>>& owned, Kind kind,
                const std::vector<const TensorView*>& tensors, const Key& extra, Make make);
  std::shared_ptr<Linear> linear(Kind kind, const std::vector<const TensorView*>& parts,
                                 const std::vector<const TensorView*>& bias = {});
  std::shared_ptr<const std::vector<float>> load_norm(const TensorView& norm);
  Key lora_key(const std::vector<LoraAdapter::Factors>& first,
               const std::vector<LoraAdapter::Factors>& second, const LoraAdapter* adapter);
  std::unique_ptr<LoraDelta> lora(const std::vector<LoraAdapter::Factors>& factors,
                                  const std::vector<const TensorView*>& weights,
                                  const LoraAdapter* adapter);
  std::unique_ptr<Embedding> make_embedding(const TensorView& embed) const;

  BlockSet& blocks_;
  GemmContext& gemm_;
  const ModelConfig& config_;
  DType file_dtype_;
  bool share_;
  bool per_model_;
  int64_t next_id_ = 0;
  std::unordered_map<const TensorView*, int64_t> id_of_view_;
  std::unordered_multimap<uint64_t, std::pair<const TensorView*, int64_t>> id_of_hash_;
  std::map<Key, void*> built_;
  std::map<Key, std::shared_ptr<Linear>> linears_;
  std::map<int64_t, std::shared_ptr<const std::vector<float>>> norms_;
};

}  // namespace blend::cpu
