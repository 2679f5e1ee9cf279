// Synthetic offline-batch workloads after BlendServe App. A.3: a compute-heavy source (real
// length distributions from the repository's data/traces), a memory-heavy video-generation-like
// source and MMLU-like 5-shot requests with long per-subject shared prefixes, mixed so that the
// batch's root density and prefix sharing ratio hit a target. Every source carries its own
// system prompt (A.3: "a unique system prompt ahead of prompts"); prompt text is random token
// ids of the trace's lengths; output lengths are known (max_tokens with ignore_eos).
//
// Assumed where no data exists here (documented in docs/BENCHMARKS.md, "Planner"):
//  - system prompt: 32 tokens per source;
//  - openvid: prompt uniform in [20, 200] tokens, output 256 x frames, frames uniform in
//    [16, 109] (mean 16,000 tokens, A.3's normalised mean);
//  - mmlu: output 1 token (the trace's output_tokens column).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "plan/prefix_tree.h"

namespace blend::workload {

// One request of a source before tokens are drawn.
struct LengthSample {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t shared_prefix_tokens = 0;  // mmlu: the subject's 5-shot prefix
  int32_t group = 0;                 // mmlu: subject index (requests sharing that prefix)
};

struct Source {
  std::string name;  // azure-conv, azure-code, sharegpt, arxiv, bwb, openvid, mmlu
  std::vector<LengthSample> samples;
};

// Loads a source by name from `traces_dir` (openvid is synthesised). Throws blend::Error.
Source load_source(const std::string& name, const std::filesystem::path& traces_dir);

struct SynthOptions {
  double density = 1.0;  // target root density (with sharing)
  double sharing = 0.1;  // target prefix sharing ratio s_o
  int64_t requests = 40000;
  uint64_t seed = 0;
  std::string compute_source = "azure-conv";
};

struct SynthResult {
  std::vector<plan::PlanRequest> requests;  // shuffled, output lengths known
  std::vector<std::string> source_of;       // per request
  int64_t compute_requests = 0, video_requests = 0, mmlu_requests = 0;
  double density = 0, sharing = 0;  // measured on the generated batch
};

// Solves the mix (A.3) and draws the requests; throws blend::Error when no non-negative mix of
// the three sources reaches the target.
SynthResult synthesize(const SynthOptions& options, const Source& compute, const Source& video,
                       const Source& mmlu, const CostModel& cost);

// Root density and s_o of a batch (the numbers Table 4 reports per trace).
void measure(const std::vector<plan::PlanRequest>& requests, const CostModel& cost, double* density,
             double* sharing);

// Draws `count` requests of one source (for per-source calibration).
std::vector<plan::PlanRequest> draw(const Source& source, int64_t count, uint64_t seed);

}  // namespace blend::workload
