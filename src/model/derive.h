// `blend model derive`: a fine-tuned tenant made from a base model folder, for tests and
// benchmarks of serving many models at once (BlockLLM). A full fine-tune whose listed layers
// are perturbed and every other tensor is bit-identical to the base, so the models share
// exactly the blocks a real partial fine-tune would.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace blend {

struct DeriveOptions {
  uint64_t seed = 1;
  // Layers whose tensors (attention, FFN and their norms) change; the embedding, final norm and
  // lm_head stay the base's.
  std::vector<int64_t> layers;
  // How large the change is: each element moves by scale x a fresh weight's draw (1: as large
  // as a weight; a real fine-tune moves far less, which is what keeps blocks equivalent, §4.1).
  double scale = 1;
};

// Writes OUT as BASE with the listed layers perturbed: each element w becomes w + scale d, d drawn
// as `blend model init` draws a fresh weight (a pure function of seed, tensor name and index), in
// the base's dtype. The other files of BASE (config, tokenizer, chat template) are copied.
// Throws blend::Error for a layer outside the model, no layer, a scale that is not positive and
// finite, or OUT equal to BASE.
void derive_full_finetune(const std::filesystem::path& base, const std::filesystem::path& out,
                          const DeriveOptions& options);

// Writes OUT as a model of hidden size `hidden` (greater than BASE's) that computes what BASE
// computes: BASE's residual stream x becomes Q x, Q a random [hidden x base hidden] matrix with
// orthonormal columns drawn from `seed`. The embedding and the projections writing into the
// stream (o_proj, down_proj) are multiplied by Q; the projections reading a normed stream
// (q/k/v, gate/up, lm_head) by diag(g) Q^T, g the base's norm weight before them; the norm weights
// become sqrt(base hidden / hidden), which undoes the RMS's change of width. Heads, head_dim and
// the FFN width stay the base's; the lm_head is written untied. In f32 the output equals BASE's up
// to rounding (and the norms' epsilon); in bf16 up to bf16 rounding of the new weights. For tests
// of stitching blocks between models of different widths (BlockLLM §4.4): the exact stitch from
// BASE to OUT is Q. Throws blend::Error for a width not above BASE's, or OUT equal to BASE.
void derive_widened(const std::filesystem::path& base, const std::filesystem::path& out,
                    int64_t hidden, uint64_t seed);

}  // namespace blend
