#include "harness/synth.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "harness/traces.h"
#include "plan/planner.h"

namespace blend::workload {
namespace {

constexpr int kSystemPromptTokens = 32;  // assumed (A.3 adds one per source; length unstated)

// getline without a trailing CR (some traces have CRLF line ends).
bool read_line(std::istream& in, std::string& line) {
  if (!std::getline(in, line)) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

// Columns `p_column` and `d_column` of a CSV with a header line.
std::vector<LengthSample> read_csv(const std::filesystem::path& path, const std::string& p_column,
                                   const std::string& d_column) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read trace " + path.string() + ": " + missing_traces_hint());
  std::string line;
  read_line(in, line);
  std::vector<std::string> header;
  {
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) header.push_back(cell);
  }
  auto column = [&](const std::string& name) {
    auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) throw Error(path.string() + ": no column " + name);
    return static_cast<size_t>(it - header.begin());
  };
  const size_t pc = column(p_column), dc = column(d_column);
  std::vector<LengthSample> out;
  while (read_line(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    if (cells.size() <= std::max(pc, dc)) continue;
    LengthSample s;
    s.prompt_tokens = std::max<int64_t>(1, std::atoll(cells[pc].c_str()));
    s.output_tokens = std::max<int64_t>(1, std::atoll(cells[dc].c_str()));
    out.push_back(s);
  }
  if (out.empty()) throw Error(path.string() + ": no rows");
  return out;
}

std::vector<LengthSample> read_mmlu(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read trace " + path.string() + ": " + missing_traces_hint());
  std::string line;
  read_line(in, line);  // subject,question_index,zero_shot,five_shot,shared_prefix,output
  std::unordered_map<std::string, int32_t> subjects;
  std::vector<LengthSample> out;
  while (read_line(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    if (cells.size() < 6) continue;
    LengthSample s;
    s.group = subjects.emplace(cells[0], static_cast<int32_t>(subjects.size())).first->second;
    s.prompt_tokens = std::max<int64_t>(1, std::atoll(cells[3].c_str()));
    s.shared_prefix_tokens = std::min<int64_t>(s.prompt_tokens - 1, std::atoll(cells[4].c_str()));
    s.output_tokens = std::max<int64_t>(1, std::atoll(cells[5].c_str()));
    out.push_back(s);
  }
  if (out.empty()) throw Error(path.string() + ": no rows");
  return out;
}

std::vector<plan::TokenId> seeded_tokens(uint64_t seed, int64_t count) {
  std::mt19937_64 rng(seed);
  std::vector<plan::TokenId> t(static_cast<size_t>(count));
  for (plan::TokenId& x : t) x = static_cast<plan::TokenId>(1000 + rng() % 119000);
  return t;
}

struct Means {
  double compute = 0, memory = 0, prompt = 0, saved = 0;
};

Means means_of(const Source& s, const CostModel& cost) {
  Means m;
  for (const LengthSample& x : s.samples) {
    const double p = static_cast<double>(x.prompt_tokens + kSystemPromptTokens);
    const double d = static_cast<double>(x.output_tokens);
    m.compute += cost.request_compute_seconds(p, d);
    m.memory += cost.request_memory_seconds(p, d);
    m.prompt += p;
    m.saved += static_cast<double>(kSystemPromptTokens + x.shared_prefix_tokens);
  }
  const double n = static_cast<double>(s.samples.size());
  m.compute /= n;
  m.memory /= n;
  m.prompt /= n;
  m.saved /= n;
  return m;
}

double det3(const double a[3][3]) {
  return a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) -
         a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0]) +
         a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
}

// Fractions f of each source (A.3): sharing sum f (saved - Y p) = 0, density
// sum f ((1 - Y) comp - X mem) = 0, and sum f = 1 (rows scaled to comparable magnitudes).
void solve_mix(const SynthOptions& o, const Means m[3], double* f) {
  double a[3][3];
  const double b[3] = {0, 0, 1};
  for (int k = 0; k < 3; ++k) {
    a[0][k] = (m[k].saved - o.sharing * m[k].prompt) / m[0].prompt;
    a[1][k] = ((1 - o.sharing) * m[k].compute - o.density * m[k].memory) / m[0].compute;
    a[2][k] = 1;
  }
  const double d = det3(a);
  if (std::abs(d) < 1e-15) throw Error("workload synth: degenerate source mix");
  for (int k = 0; k < 3; ++k) {
    double ak[3][3];
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) ak[i][j] = j == k ? b[i] : a[i][j];
    f[k] = det3(ak) / d;
  }
}

}  // namespace

Source load_source(const std::string& name, const std::filesystem::path& traces_dir) {
  Source s;
  s.name = name;
  if (name == "azure-conv") {
    s.samples = read_csv(traces_dir / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                         "ContextTokens", "GeneratedTokens");
  } else if (name == "azure-code") {
    s.samples = read_csv(traces_dir / "azure_llm_2023/AzureLLMInferenceTrace_code.csv",
                         "ContextTokens", "GeneratedTokens");
  } else if (name == "sharegpt") {
    s.samples = read_csv(
        traces_dir / "sharegpt_llama2_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        "num_prefill_tokens", "num_decode_tokens");
  } else if (name == "arxiv") {
    s.samples = read_csv(traces_dir /
                             "arxiv_summarization_llama2_lengths/"
                             "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                         "num_prefill_tokens", "num_decode_tokens");
  } else if (name == "bwb") {
    s.samples =
        read_csv(traces_dir / "bwb_llama2_lengths/bwb_stats_llama2_tokenizer_filtered_v2.csv",
                 "num_prefill_tokens", "num_decode_tokens");
  } else if (name == "mmlu") {
    s.samples = read_mmlu(traces_dir / "mmlu/mmlu_test_prompt_lengths_llama2.csv");
  } else if (name == "openvid") {  // assumed distribution, see synth.h
    std::mt19937_64 rng(0x0e17);
    for (int i = 0; i < 10000; ++i) {
      LengthSample x;
      x.prompt_tokens = 20 + static_cast<int64_t>(rng() % 181);
      x.output_tokens = 256 * (16 + static_cast<int64_t>(rng() % 94));
      s.samples.push_back(x);
    }
  } else {
    throw Error("unknown workload source \"" + name +
                "\" (azure-conv, azure-code, sharegpt, arxiv, bwb, openvid, mmlu)");
  }
  return s;
}

std::vector<plan::PlanRequest> draw(const Source& source, int64_t count, uint64_t seed) {
  const uint64_t source_seed = std::hash<std::string>{}(source.name);
  const std::vector<plan::TokenId> system = seeded_tokens(source_seed, kSystemPromptTokens);
  std::unordered_map<int32_t, std::vector<plan::TokenId>> prefixes;  // mmlu subject prefixes
  std::mt19937_64 rng(seed ^ source_seed);
  std::vector<plan::PlanRequest> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const LengthSample& x = source.samples[rng() % source.samples.size()];
    plan::PlanRequest& r = out[static_cast<size_t>(i)];
    r.id = source.name + "-" + std::to_string(i);
    r.prompt = system;
    if (x.shared_prefix_tokens > 0) {
      auto it = prefixes.find(x.group);
      if (it == prefixes.end())
        it = prefixes
                 .emplace(x.group,
                          seeded_tokens(source_seed + 7919u * static_cast<uint64_t>(x.group + 1),
                                        x.shared_prefix_tokens))
                 .first;
      r.prompt.insert(r.prompt.end(), it->second.begin(), it->second.end());
    }
    while (static_cast<int64_t>(r.prompt.size()) < x.prompt_tokens + kSystemPromptTokens)
      r.prompt.push_back(static_cast<plan::TokenId>(1000 + rng() % 119000));
    r.output_tokens = static_cast<double>(x.output_tokens);
    r.output_known = true;
  }
  return out;
}

void measure(const std::vector<plan::PlanRequest>& requests, const CostModel& cost, double* density,
             double* sharing) {
  const plan::PrefixTree tree(requests);
  const std::vector<plan::DemandStats> stats = plan::annotate_tree(tree, cost);
  *density = stats[plan::PrefixTree::kRoot].density();
  *sharing = tree.optimal_sharing_ratio();
}

SynthResult synthesize(const SynthOptions& o, const Source& compute, const Source& video,
                       const Source& mmlu, const CostModel& cost) {
  if (o.requests <= 0) throw Error("--requests must be positive");
  if (!(o.sharing >= 0 && o.sharing < 1)) throw Error("--sharing must be in [0, 1)");
  if (!(o.density > 0)) throw Error("--density must be positive");
  const Source* source_list[3] = {&compute, &video, &mmlu};
  Means m[3] = {means_of(compute, cost), means_of(video, cost), means_of(mmlu, cost)};
  SynthResult r;
  std::vector<plan::PlanRequest> parts[3];
  // Solve with the sources' means, draw, then re-solve with the means of what was drawn: a
  // few dozen long video requests carry most of the memory time, so their sample mean matters.
  // Draws are prefix-stable (the first k requests of a source do not depend on the count).
  for (int round = 0; round < 4; ++round) {
    double f[3] = {0, 0, 0};
    solve_mix(o, m, f);
    if (f[0] < -1e-9 || f[1] < -1e-9 || f[2] < -1e-9) {
      std::ostringstream msg;
      msg << "density " << o.density << " with sharing " << o.sharing << " is out of reach of "
          << compute.name << " + openvid + mmlu (mix " << f[0] << ", " << f[1] << ", " << f[2]
          << ")";
      throw Error(msg.str());
    }
    r.compute_requests = std::llround(std::max(0.0, f[0]) * static_cast<double>(o.requests));
    r.video_requests = std::llround(std::max(0.0, f[1]) * static_cast<double>(o.requests));
    r.mmlu_requests = std::max<int64_t>(0, o.requests - r.compute_requests - r.video_requests);
    const int64_t counts[3] = {r.compute_requests, r.video_requests, r.mmlu_requests};
    for (int k = 0; k < 3; ++k) {
      parts[k] = draw(*source_list[k], counts[k], o.seed);
      if (parts[k].empty()) continue;
      Means drawn;
      for (const plan::PlanRequest& q : parts[k]) {
        const double p = static_cast<double>(q.prompt.size());
        drawn.compute += cost.request_compute_seconds(p, q.output_tokens);
        drawn.memory += cost.request_memory_seconds(p, q.output_tokens);
        drawn.prompt += p;
      }
      const double n = static_cast<double>(parts[k].size());
      m[k].compute = drawn.compute / n;
      m[k].memory = drawn.memory / n;
      m[k].prompt = drawn.prompt / n;
      // Sources share no tokens with each other, so each part's own trie gives its savings
      // (first occurrences of system prompts and subject prefixes included).
      const plan::PrefixTree tree(parts[k]);
      m[k].saved =
          static_cast<double>(tree.total_prompt_tokens() - tree.unique_prompt_tokens()) / n;
    }
  }
  for (int k = 0; k < 3; ++k)
    for (plan::PlanRequest& req : parts[k]) {
      r.requests.push_back(std::move(req));
      r.source_of.push_back(source_list[k]->name);
    }
  // Arrival order: shuffled, so fcfs is not accidentally DFS.
  std::vector<size_t> perm(r.requests.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  std::mt19937_64 rng(o.seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<plan::PlanRequest> shuffled;
  std::vector<std::string> sources;
  shuffled.reserve(perm.size());
  for (size_t i : perm) {
    shuffled.push_back(std::move(r.requests[i]));
    sources.push_back(r.source_of[i]);
  }
  r.requests = std::move(shuffled);
  r.source_of = std::move(sources);
  measure(r.requests, cost, &r.density, &r.sharing);
  return r;
}

}  // namespace blend::workload
