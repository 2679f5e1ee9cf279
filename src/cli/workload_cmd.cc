// blend workload synth — Batch API JSONL workloads with a target root density and prefix
// sharing ratio (BlendServe App. A.3; sources and assumptions in harness/synth.h).
#include <cstdio>
#include <fstream>
#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "cost/cost_model.h"
#include "harness/synth.h"
#include "harness/traces.h"

namespace blend::cli {
namespace {

struct SynthArgs {
  workload::SynthOptions options;
  std::string out;
  std::string traces = workload::default_traces_dir().string();
  std::string model_shape = "llama-3-8b";
  std::string hardware = "a100-80g";
  bool calibrate = false;
};

// BlendServe Table 4 (sharing, density) for Llama-3-8B on A100, where the paper lists a trace.
const char* paper_reference(const std::string& source) {
  if (source == "sharegpt") return "0.02 / 3.12 (ShareGPT)";
  if (source == "azure-conv" || source == "azure-code") return "0.01 / 33.2 (Azure-Trace)";
  if (source == "openvid") return "0.00 / 0.05 (OpenVid)";
  if (source == "mmlu") return "0.86 / 54.91 (MMLU)";
  return "-";
}

void run_synth(const SynthArgs& a) {
  const CostModel cost(*find_model_shape_preset(a.model_shape), resolve_hardware(a.hardware));
  const workload::Source compute = workload::load_source(a.options.compute_source, a.traces);
  const workload::Source video = workload::load_source("openvid", a.traces);
  const workload::Source mmlu = workload::load_source("mmlu", a.traces);
  if (a.calibrate) {
    std::fprintf(stderr, "%-12s %-22s %s\n", "source", "ours: sharing / density", "paper Table 4");
    for (const workload::Source* s : {&compute, &video, &mmlu}) {
      double density = 0, sharing = 0;
      workload::measure(workload::draw(*s, 4000, a.options.seed), cost, &density, &sharing);
      std::fprintf(stderr, "%-12s %.2f / %-15.2f %s\n", s->name.c_str(), sharing, density,
                   paper_reference(s->name));
    }
  }
  const workload::SynthResult r = workload::synthesize(a.options, compute, video, mmlu, cost);
  std::ofstream out(a.out);
  if (!out) throw Error("cannot write " + a.out);
  std::string line;
  for (size_t i = 0; i < r.requests.size(); ++i) {
    const plan::PlanRequest& q = r.requests[i];
    line = "{\"custom_id\":\"" + q.id +
           "\",\"method\":\"POST\",\"url\":\"/v1/completions\","
           "\"body\":{\"prompt\":[";
    for (size_t t = 0; t < q.prompt.size(); ++t) {
      if (t) line += ',';
      line += std::to_string(q.prompt[t]);
    }
    line += "],\"max_tokens\":" + std::to_string(static_cast<int64_t>(q.output_tokens)) +
            ",\"ignore_eos\":true}}\n";
    out << line;
  }
  if (!out) throw Error("cannot write " + a.out);
  std::fprintf(stderr,
               "blend workload synth: %zu requests (%lld %s, %lld openvid, %lld mmlu); density "
               "%.3f (target %.3f), sharing %.3f (target %.3f) for %s on %s\n",
               r.requests.size(), static_cast<long long>(r.compute_requests),
               a.options.compute_source.c_str(), static_cast<long long>(r.video_requests),
               static_cast<long long>(r.mmlu_requests), r.density, a.options.density, r.sharing,
               a.options.sharing, a.model_shape.c_str(), a.hardware.c_str());
}

}  // namespace

void register_workload_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("workload", "Synthetic workloads (BlendServe App. A.3)");
  cmd->require_subcommand(1);
  auto a = std::make_shared<SynthArgs>();
  CLI::App* synth = cmd->add_subcommand(
      "synth", "Mix a compute-heavy trace, openvid-like and mmlu-like requests to a target");
  synth->add_option("--density", a->options.density, "Target root compute density")->required();
  synth->add_option("--sharing", a->options.sharing, "Target prefix sharing ratio")->required();
  synth->add_option("--requests", a->options.requests, "Number of requests");
  synth->add_option("--seed", a->options.seed, "Random seed");
  synth->add_option("--out", a->out, "Batch API JSONL to write")->required();
  synth->add_option("--compute-source", a->options.compute_source,
                    "azure-conv, azure-code, sharegpt, arxiv or bwb");
  synth->add_option("--traces", a->traces, "Trace folder (default: the repository's data/traces)");
  synth->add_option("--model-shape", a->model_shape, "Model shape the density refers to");
  synth->add_option("--hardware", a->hardware, "Hardware preset or profile the density refers to");
  synth->add_flag("--calibrate", a->calibrate,
                  "Print each source's sharing / density beside BlendServe Table 4");
  synth->callback([a] { run_synth(*a); });
}

}  // namespace blend::cli
