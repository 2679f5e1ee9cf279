// Block equivalence between related models (BlockLLM §4.1): how alike two models' blocks at the
// same place in the chain are, measured on what they do to the model's output. For block j of
// model a and its counterpart in model b, both run on the same input (a's chain up to j) and
// the residual stream after each is projected to vocabulary probabilities with a's final norm
// and lm_head (the logit lens); the similarity is the cosine of the two probability vectors,
// averaged over every position of a calibration prompt set. Identical blocks give 1, and a block
// pair at or above a threshold (BlockLLM: 0.98) may stand in for each other (§5.3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/types.h"

namespace blend {

struct BlockSimilarity {
  int64_t layer = 0;
  LayerBlock block = LayerBlock::kAttention;
  double similarity = 1;
  bool identical = false;  // the same block in memory (byte-identical weights): not measured
};

// The similarity of model b's block (layer, block) to model a's, measured on `prompts` (token
// ids, each at least one token) position by position. Needs KV pages for two sequences per
// prompt: backend.num_pages() >= 2 * sum of ceil(len / page_size) over the prompts. Throws
// blend::Error otherwise, or for an empty prompt set.
double block_similarity(CpuBackend& backend, int64_t page_size, ModelId a, ModelId b, int64_t layer,
                        LayerBlock block, const std::vector<std::vector<TokenId>>& prompts);

// How far model (or chain) `other`'s next-token distributions are from `original`'s, position by
// position over `prompts` (teacher-forced: both read the prompt's tokens): the share of positions
// whose most likely token is the same (what greedy decoding would agree on) and the mean
// KL(original || other) in nats. What adaptive serving (blocks/adaptive.h) costs in accuracy.
struct ChainDivergence {
  double agreement = 0;  // in [0, 1]
  double kl = 0;         // nats
  int64_t positions = 0;
};
ChainDivergence chain_divergence(CpuBackend& backend, int64_t page_size, ModelId original,
                                 ModelId other, const std::vector<std::vector<TokenId>>& prompts);

// Every attention and FFN block of b against a's, layer by layer: identical blocks reported as
// such without running them, the others measured with block_similarity.
std::vector<BlockSimilarity> compare_blocks(CpuBackend& backend, int64_t page_size, ModelId a,
                                            ModelId b,
                                            const std::vector<std::vector<TokenId>>& prompts);

// KV pages block_similarity needs for `prompts`.
int64_t similarity_pages(const std::vector<std::vector<TokenId>>& prompts, int64_t page_size);

// Cosine similarity of softmax(x) and softmax(y) over n logits (exponentials in float, sums in
// double); `scratch` holds n floats.
double probability_cosine(const float* x, const float* y, int64_t n, float* scratch);

// Whether two rows of n logits have the same top token (the first maximum, as greedy sampling
// picks it), and KL(softmax(lp) || softmax(lq)) in nats.
struct TopTokenAndKl {
  bool same_top = false;
  double kl = 0;
};
TopTokenAndKl top_token_and_kl(const float* lp, const float* lq, int64_t n);

const char* layer_block_name(LayerBlock block);  // "attention" | "ffn"

// A small built-in calibration set: varied English prose, code and dialogue (used when the user
// gives none).
std::vector<std::string> default_calibration_prompts();

}  // namespace blend
