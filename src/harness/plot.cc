#include "harness/plot.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "engine/engine.h"

namespace blend {
namespace {

// Single quotes end a gnuplot string: drop them from text we did not write.
std::string gnuplot_text(std::string s) {
  std::replace(s.begin(), s.end(), '\'', '"');
  return s;
}

// Runs `script` through gnuplot; the PNG must exist afterwards.
void run_gnuplot(const std::filesystem::path& png, const std::string& script) {
  std::error_code ec;
  std::filesystem::remove(png, ec);
  FILE* pipe = ::popen("gnuplot 2>&1", "w");
  if (!pipe) throw Error("cannot run gnuplot for " + png.string());
  std::fwrite(script.data(), 1, script.size(), pipe);
  const int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) == 127)
    throw Error("cannot draw " + png.string() +
                ": gnuplot is not installed (Debian: gnuplot-nox; scripts/setup.sh installs it)");
  if (WEXITSTATUS(status) != 0 || !std::filesystem::exists(png))
    throw Error("gnuplot failed to draw " + png.string() + " (its messages are above)");
}

std::filesystem::path data_path(const std::filesystem::path& png) {
  std::filesystem::path dat = png;
  dat.replace_extension(".dat");
  return dat;
}

std::ofstream open_data(const std::filesystem::path& path) {
  std::ofstream out(path);
  if (!out) throw Error("cannot write " + path.string());
  return out;
}

}  // namespace

RunTimeline::RunTimeline(Engine& engine) {
  engine.add_step_observer([this, &engine](const ForwardBatch& batch, double started, bool) {
    const EngineStats s = engine.stats();
    steps_.push_back({started, batch.num_tokens(),
                      s.kv_capacity_bytes > 0 ? static_cast<double>(s.kv_used_bytes) /
                                                    static_cast<double>(s.kv_capacity_bytes)
                                              : 0.0});
  });
}

void write_run_plot(const std::filesystem::path& png, const std::string& title,
                    const RunTimeline& timeline, double end_seconds) {
  const auto& steps = timeline.steps();
  if (steps.empty()) throw Error("nothing to plot in " + png.string() + ": the run took no step");
  // Tokens per second in bins of about a hundredth of the run (five steps at least), each
  // step's tokens spread over its time (its start to the next step's), so a long step shows as
  // a low rate, not as one spike and a gap; KV use: the last step begun in the bin.
  const double t0 = steps.front().started;
  const double span = std::max(end_seconds - t0, 1e-3);
  const int bins = static_cast<int>(std::clamp<size_t>(steps.size() / 5, 1, 100));
  const double width = span / bins;
  std::vector<double> tokens(static_cast<size_t>(bins), 0), kv(static_cast<size_t>(bins), -1);
  auto bin_of = [&](double t) {
    return static_cast<size_t>(
        std::clamp(static_cast<int>(std::floor((t - t0) / width)), 0, bins - 1));
  };
  for (size_t k = 0; k < steps.size(); ++k) {
    const double a = steps[k].started;
    const double b = std::max(a, k + 1 < steps.size() ? steps[k + 1].started : end_seconds);
    const double n = static_cast<double>(steps[k].tokens);
    if (b - a <= 0) {
      tokens[bin_of(a)] += n;
    } else {
      for (size_t bin = bin_of(a); bin <= bin_of(b) && bin < tokens.size(); ++bin) {
        const double lo = std::max(a, t0 + static_cast<double>(bin) * width);
        const double hi = std::min(b, t0 + static_cast<double>(bin + 1) * width);
        if (hi > lo) tokens[bin] += n * (hi - lo) / (b - a);
      }
    }
    kv[bin_of(a)] = steps[k].kv_used;
  }
  const std::filesystem::path dat = data_path(png);
  {
    std::ofstream out = open_data(dat);
    out << "# seconds tokens_per_s kv_used_percent\n";
    double last_kv = 0;
    for (int b = 0; b < bins; ++b) {
      if (kv[static_cast<size_t>(b)] >= 0) last_kv = kv[static_cast<size_t>(b)];
      out << (b + 0.5) * width << ' ' << tokens[static_cast<size_t>(b)] / width << ' '
          << 100 * last_kv << '\n';
    }
  }
  run_gnuplot(png,
              "set terminal pngcairo size 1000,450 noenhanced\n"
              "set output '" +
                  gnuplot_text(png.string()) +
                  "'\n"
                  "set title '" +
                  gnuplot_text(title) +
                  "'\n"
                  "set xlabel 'seconds'\nset ylabel 'tokens/s (prompt + output)'\n"
                  "set y2label 'KV cache used (%)'\nset y2range [0:100]\nset ytics nomirror\n"
                  "set y2tics\nset yrange [0:*]\nset key bottom right\nset grid\n"
                  "plot '" +
                  gnuplot_text(dat.string()) +
                  "' using 1:2 with steps lw 2 "
                  "title 'throughput', '' using 1:3 axes x1y2 with lines lw 2 title 'KV used'\n");
}

void write_cdf_plot(const std::filesystem::path& png, const std::string& title,
                    const std::string& xlabel, const std::vector<CdfSeries>& series) {
  std::string plot;
  const std::filesystem::path dat = data_path(png);
  {
    std::ofstream out = open_data(dat);
    int index = 0;
    for (const CdfSeries& s : series) {
      if (s.values.empty()) continue;
      std::vector<double> v = s.values;
      std::sort(v.begin(), v.end());
      out << "# " << s.label << "\n";
      for (size_t i = 0; i < v.size(); ++i)
        out << v[i] << ' ' << static_cast<double>(i + 1) / static_cast<double>(v.size()) << '\n';
      out << "\n\n";  // gnuplot's next index
      plot += std::string(plot.empty() ? "plot " : ", ") + "'" + gnuplot_text(dat.string()) +
              "' index " + std::to_string(index++) + " using 1:2 with steps lw 2 title '" +
              gnuplot_text(s.label) + "'";
    }
  }
  if (plot.empty()) throw Error("nothing to plot in " + png.string() + ": no values");
  run_gnuplot(png,
              "set terminal pngcairo size 900,500 noenhanced\n"
              "set output '" +
                  gnuplot_text(png.string()) +
                  "'\n"
                  "set title '" +
                  gnuplot_text(title) +
                  "'\n"
                  "set xlabel '" +
                  gnuplot_text(xlabel) +
                  "'\nset ylabel 'fraction of requests'\n"
                  "set yrange [0:1]\nset logscale x\nset key bottom right\nset grid\n" +
                  plot + "\n");
}

}  // namespace blend
