// PNG plots of a run, drawn by gnuplot (Debian's gnuplot-nox; scripts/setup.sh installs it):
// what `blend batch --plot` and `blend bench serve --plot` write for people who would rather look
// than read (issue 25), as bench/blendserve_experiments.sh does for the simulator's figures.
//
// RunTimeline records, through Engine::add_step_observer, each step's start, its tokens and the
// KV cache's use after it; write_run_plot draws throughput (tokens/s, in bins of about a
// hundredth of the run) and KV use (% of capacity) over time. write_cdf_plot draws empirical
// CDFs of several series (latencies per request class and policy). Both throw blend::Error
// naming the file when gnuplot is missing or fails; the data files are written next to the PNG
// (FILE.png -> FILE.dat), so a plot can be redrawn or read as numbers.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace blend {

class Engine;

class RunTimeline {
 public:
  // The engine keeps a pointer to the timeline: it must not step once the timeline is gone.
  explicit RunTimeline(Engine& engine);
  RunTimeline(const RunTimeline&) = delete;
  RunTimeline& operator=(const RunTimeline&) = delete;

  struct Step {
    double started = 0;  // engine clock, seconds
    int64_t tokens = 0;  // prefill + decode tokens the step computed
    double kv_used = 0;  // fraction of the KV capacity held by requests after it
  };
  const std::vector<Step>& steps() const { return steps_; }

 private:
  std::vector<Step> steps_;
};

// Throughput and KV use over the run; `end_seconds` on the engine's clock closes the last step.
void write_run_plot(const std::filesystem::path& png, const std::string& title,
                    const RunTimeline& timeline, double end_seconds);

struct CdfSeries {
  std::string label;
  std::vector<double> values;
};
void write_cdf_plot(const std::filesystem::path& png, const std::string& title,
                    const std::string& xlabel, const std::vector<CdfSeries>& series);

}  // namespace blend
