#include "backend/llama_forward.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace blend {
namespace {

// Records the operations a pass asks for, as "op:layer".
struct RecordingOps {
  std::vector<std::string> ops;
  void add(const std::string& op, int64_t layer = -1) {
    ops.push_back(layer < 0 ? op : op + ":" + std::to_string(layer));
  }
  void embed() { add("embed"); }
  void norm(int64_t layer, llama::Norm which) {
    add(which == llama::Norm::kAttention ? "attention_norm" : "ffn_norm", layer);
  }
  void project(int64_t layer, llama::Projection which) {
    const char* names[] = {"qkv", "o", "gate_up", "down"};
    add(names[static_cast<int>(which)], layer);
  }
  void qk_norm(int64_t layer) { add("qk_norm", layer); }
  void rope_write_kv(int64_t layer) { add("rope_kv", layer); }
  void attention(int64_t layer) { add("attention", layer); }
  void swiglu() { add("swiglu"); }
  void head() { add("head"); }
};

TEST(LlamaForward, OneLayerRunsTheLlamaSequence) {
  RecordingOps ops;
  llama::forward(ops, 0, 1);
  const std::vector<std::string> expected{"embed",     "attention_norm:0", "qkv:0",  "qk_norm:0",
                                          "rope_kv:0", "attention:0",      "o:0",    "ffn_norm:0",
                                          "gate_up:0", "swiglu",           "down:0", "head"};
  EXPECT_EQ(ops.ops, expected);
}

TEST(LlamaForward, ALayerRangeRunsOnlyThoseLayers) {
  RecordingOps ops;
  llama::forward(ops, 2, 4);
  ASSERT_EQ(ops.ops.size(), 2u + 2 * 10);
  EXPECT_EQ(ops.ops[1], "attention_norm:2");
  EXPECT_EQ(ops.ops[ops.ops.size() - 2], "down:3");
}

// The nano-batch pipeline (backend/cuda/nano_pipeline.cc) runs the pass as GEMM phases and
// attentions; the two must be the same pass, op for op.
TEST(LlamaForward, GemmPhasesAndAttentionsAreTheWholePass) {
  for (int64_t layers : {1, 2, 5}) {
    RecordingOps whole, phased;
    llama::forward(whole, 0, layers);
    for (int64_t phase = 0; phase <= layers; ++phase) {
      llama::gemm_phase(phased, phase, layers);
      if (phase < layers) phased.attention(phase);
    }
    EXPECT_EQ(phased.ops, whole.ops) << layers << " layers";
  }
}

TEST(LlamaForward, AGemmPhaseHoldsNoAttention) {
  RecordingOps ops;
  llama::gemm_phase(ops, 1, 3);
  for (const std::string& op : ops.ops) EXPECT_EQ(op.find("attention:"), std::string::npos) << op;
  EXPECT_EQ(ops.ops.front(), "o:0");
  EXPECT_EQ(ops.ops.back(), "rope_kv:1");
}

}  // namespace
}  // namespace blend
