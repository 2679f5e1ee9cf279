// Stitching blocks between models of different widths (BlockLLM §4.4). When a block of one model
// is equivalent to a block of a model with another embedding size, a request cannot be routed
// from one to the other directly: its residual stream has the wrong width. A stitching block is a
// linear map from the head model's stream to the tail model's, trained while both models stay
// frozen. To serve every stitching point between the same two models with one block, its input
// carries the point's position as one more dimension (the sum of the head block's and the tail
// block's layer indices in their own models), and training starts at the shallowest point and
// moves deeper.
//
// What is built here: least squares on calibration states initialises the block (the issue
// allows it), then Adam on the tail model's own reading of the stitched stream: the KL divergence
// between the tail's logit lens (final norm and lm_head) on its true stream and on the stitched
// one, at each point, stage by stage from shallow to deep (each stage keeps the shallower points
// in its batch, so the one block keeps serving them). The paper fine-tunes through the models'
// outputs; that needs gradients through the tail's layers, which blend does not compute.
// Evaluation runs the stitched chain for real (head layers, stitch, tail layers, tail head) and
// compares its next-token distributions with the tail model's own (Table 3's output cosine, top-
// token agreement, KL).
//
// Serving a stitched chain in the engine is not built: the engine's chains share one width and
// one KV layout (backend/cpu/blocks.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/types.h"

namespace blend {

class TensorStore;

// The head model's stream after its layer `head_layer` enters the tail model before its layer
// `tail_layer` (the tail's layers tail_layer.. run on it).
struct StitchPoint {
  int64_t head_layer = 0;
  int64_t tail_layer = 1;
  // The stitch's extra input dimension (§4.4): the head block's and the tail block's positions
  // in their own models, summed.
  double position() const { return static_cast<double>(head_layer + tail_layer); }
};

// `count` points at evenly spaced depths of the head (never after its last layer), each tail layer
// at the same fraction of the tail's depth: head layer i maps to tail layer round((i + 1) *
// tail_layers / head_layers). Sorted shallow to deep, without repeats. Throws blend::Error for
// count < 1 or a model of fewer than 2 layers.
std::vector<StitchPoint> proportional_stitch_points(int64_t head_layers, int64_t tail_layers,
                                                    int64_t count);

// y = W [x, position, 1]: a Linear layer with bias whose input has one more dimension.
struct StitchBlock {
  int64_t in = 0, out = 0;
  std::vector<float> weight;  // out x (in + 2), row-major

  // rows = x.size() / in rows of x, written into y (rows x out).
  void apply(std::span<const float> x, double position, std::span<float> y) const;
  // A safetensors file: tensor "stitch.weight" (f32, [out, in + 2]).
  void save(const std::filesystem::path& path) const;
  static StitchBlock load(const std::filesystem::path& path);
};

struct StitchOptions {
  std::vector<StitchPoint> points;  // at least one, each inside both models
  int64_t steps_per_stage = 40;     // Adam steps at each point (0: least squares only)
  // Adam's step size, relative to the RMS of the least-squares weights.
  double learning_rate = 1e-3;
  // Rows (positions) of each trained point per step, drawn at random from `seed`: the lens runs
  // over the whole vocabulary for each, so the step's cost grows with them.
  int64_t rows_per_step = 128;
  uint64_t seed = 1;
  // Ridge term of the least squares, relative to the mean squared input: keeps the fit defined
  // when states are collinear (a narrow model's stream spans few directions).
  double ridge = 1e-4;
};

// The training's progress: the mean lens KL over every point trained so far (on the first 512
// positions at most), before and after each stage. A stage whose steps did not lower it is undone
// (kept false, kl_after = kl_before).
struct StitchStage {
  StitchPoint point;
  double kl_before = 0, kl_after = 0;
  bool kept = true;
};

// The two models of a stitch, each in its own cpu backend (one model each; both with the same
// vocabulary and tokens), with the tail's checkpoint for its head weights.
struct StitchModels {
  CpuBackend* head = nullptr;
  CpuBackend* tail = nullptr;
  const TensorStore* tail_weights = nullptr;
  int64_t page_size = 16;
};

// Trains a stitching block from `head` to `tail` on `prompts` (token ids; the backends need KV
// pages for all of them at once: stitch_pages). Appends the stages to `stages` when not null.
// Throws blend::Error on a bad point, option or prompt set.
StitchBlock train_stitch(const StitchModels& models,
                         const std::vector<std::vector<TokenId>>& prompts,
                         const StitchOptions& options, std::vector<StitchStage>* stages = nullptr);

// The stitched chain against the tail model, over every position of `prompts`.
struct StitchQuality {
  StitchPoint point;
  double cosine = 0;     // of the next-token probabilities (Table 3: LM head cosine similarity)
  double agreement = 0;  // share of positions with the same top token
  double kl = 0;         // KL(tail || stitched), nats
  int64_t positions = 0;
};
// Several blocks and points at once: the tail's own run and each head depth are computed once.
struct StitchCase {
  const StitchBlock* block = nullptr;
  StitchPoint point;
};
std::vector<StitchQuality> evaluate_stitches(const StitchModels& models,
                                             std::span<const StitchCase> cases,
                                             const std::vector<std::vector<TokenId>>& prompts);
StitchQuality evaluate_stitch(const StitchModels& models, const StitchBlock& stitch,
                              const StitchPoint& point,
                              const std::vector<std::vector<TokenId>>& prompts);

// KV pages each backend needs for `prompts` at once.
int64_t stitch_pages(const std::vector<std::vector<TokenId>>& prompts, int64_t page_size);

}  // namespace blend
