// The Llama-family forward pass, written once (issue 24): which operation follows which, and
// which activation each reads and writes. Every real backend executes these templates over its
// own operations (`Ops`), so a backend supplies kernels, not a second copy of the model:
//
//   embed()                          token ids -> residual stream x (or hidden states handed in)
//   per layer:
//     norm(layer, kAttention)        RMSNorm x -> xn
//     project(layer, kQkv)           xn -> qkv, the fused Q/K/V projection (+ its bias if any)
//     qk_norm(layer)                 RMSNorm over each head of Q and K, in place, where the
//                                    model has those norms (Qwen3; nothing otherwise)
//     rope_write_kv(layer)           RoPE on Q and K (the config's variant); K, V into KV pages
//     attention(layer)               paged attention over the cached context (GQA, sliding
//                                    window) -> attn
//     project(layer, kO)             attn -> x, added to the residual
//     norm(layer, kFfn)              RMSNorm x -> xn
//     project(layer, kGateUp)        xn -> gate|up, fused
//     swiglu()                       silu(gate) * up -> act
//     project(layer, kDown)          act -> x, added to the residual
//   head()                           final RMSNorm and lm_head, for the rows that sample only
//                                    (and every row of a chunk scoring its prompt: all_logits)
//
// `layer` indexes the model's chain of blocks (BlockLLM §4.2): a backend serving several models
// resolves each row's block for that layer, so a chain is data the ops look up, not a loop of
// their own. NanoFlow's pipeline (§4.3) runs the same pass cut at its attentions
// (llama_gemm_phase), overlapping one nano-batch's attention with the other's GEMM phase.
#pragma once

#include <cstdint>

namespace blend::llama {

enum class Norm { kAttention, kFfn };
enum class Projection { kQkv, kO, kGateUp, kDown };

// What a backend's ops provide (the list at the top of this file).
template <class Ops>
concept ForwardOps = requires(Ops& ops, int64_t layer, Norm norm, Projection projection) {
  ops.embed();
  ops.norm(layer, norm);
  ops.project(layer, projection);
  ops.qk_norm(layer);
  ops.rope_write_kv(layer);
  ops.attention(layer);
  ops.swiglu();
  ops.head();
};

// A layer up to its attention: the norm, the fused QKV projection, the heads' norms, RoPE and
// the KV write.
template <ForwardOps Ops>
void before_attention(Ops& ops, int64_t layer) {
  ops.norm(layer, Norm::kAttention);
  ops.project(layer, Projection::kQkv);
  ops.qk_norm(layer);
  ops.rope_write_kv(layer);
}

// A layer after its attention: the output projection and the gated MLP, both residual.
template <ForwardOps Ops>
void after_attention(Ops& ops, int64_t layer) {
  ops.project(layer, Projection::kO);
  ops.norm(layer, Norm::kFfn);
  ops.project(layer, Projection::kGateUp);
  ops.swiglu();
  ops.project(layer, Projection::kDown);
}

// Layers [first, last) between the embedding (or the states a caller hands in, which the ops
// take instead) and the head.
template <ForwardOps Ops>
void forward(Ops& ops, int64_t first, int64_t last) {
  ops.embed();
  for (int64_t layer = first; layer < last; ++layer) {
    before_attention(ops, layer);
    ops.attention(layer);
    after_attention(ops, layer);
  }
  ops.head();
}

// The pass of a `layers`-layer model cut at its attentions: phase p (0 ..= layers) is all that
// runs between attention p - 1 and attention p, the embedding first and the head last.
// forward(ops, 0, layers) equals phase 0, attention 0, phase 1, ..., attention L - 1, phase L.
template <ForwardOps Ops>
void gemm_phase(Ops& ops, int64_t phase, int64_t layers) {
  if (phase == 0)
    ops.embed();
  else
    after_attention(ops, phase - 1);
  if (phase < layers)
    before_attention(ops, phase);
  else
    ops.head();
}

}  // namespace blend::llama
