// Admission streams: what the scheduler pulls requests from. Every policy admits against the
// same KV memory budget, reserving (p + d/2) x H_kv x L x 4 bytes per running request (the
// average footprint of BlendServe §4.2) and releasing it when the scheduler reports the request
// finished, so early finishers make room for more (§5.4).
//
// DualScanner (BlendServe §5.3, Alg. 3) walks the plan's groups from both ends: the left
// cursor on compute-intensive groups, the right on memory-intensive ones. Before each
// admission the memory M is repartitioned so the blend hits the root density, with rho(L) and
// rho(R) taken over the next `window` requests of each cursor (within its group):
//   M_L + M_R = M,  M_L rho(L) + M_R rho(R) = M rho(rt)
// and each side's decode population N = M_side / ((p + d/2) H_kv L 4) and chunked-prefill
// budget C = N p / d follow from its group's mean lengths. When rho(rt) lies outside
// [rho(R), rho(L)] all memory goes to the side nearer to it and the partition says so.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cost/cost_model.h"
#include "plan/planner.h"

namespace blend::plan {

enum class Side { kLeft, kRight };

class AdmissionStream {
 public:
  virtual ~AdmissionStream() = default;
  // The next request to start, or nullopt when none fits in memory now (or none is left).
  virtual std::optional<int32_t> next() = 0;
  // The scheduler reports a started request finished; its reservation is freed.
  virtual void on_finished(int32_t request) = 0;
  virtual bool exhausted() const = 0;  // every request has been handed out
  // A started request has produced `generated_tokens` so far.
  virtual void on_progress(int32_t /*request*/, double /*generated_tokens*/) {}
  // The engine is about to run step `step` (counted from any origin, increasing).
  virtual void on_step(int64_t /*step*/) {}
  // The token budget the stream wants for the coming step, if it paces steps.
  virtual std::optional<int32_t> step_token_budget() const { return std::nullopt; }
};

// Reservation of one request in bytes on one device.
double kv_reservation_bytes(const CostModel& cost, const PlanRequest& request);

struct MemoryPartition {
  double rho_root = 0, rho_left = 0, rho_right = 0;
  double memory_left = 0, memory_right = 0;                  // bytes (M_L, M_R)
  double requests_left = 0, requests_right = 0;              // N_L, N_R
  double prefill_budget_left = 0, prefill_budget_right = 0;  // C_L, C_R tokens
  std::string note;  // why all memory went to one side, when it did
};

// Alg. 3 for given densities and mean lengths; kv_bytes_per_token = H_kv L 4 (per device).
MemoryPartition partition_memory(double memory_bytes, double rho_root, double rho_left,
                                 double rho_right, double prompt_left, double output_left,
                                 double prompt_right, double output_right,
                                 double kv_bytes_per_token);

// Capacity pacing (ours, not in the paper; docs/BENCHMARKS.md shows why). Alg. 3 splits memory
// by density as if every request held its average footprint (p + d/2) at every step. KV
// capacity also binds in time. A request holds (p d + d^2/2) token-steps of KV over its life,
// and no step holds more than M, so the remaining work needs at least
// N = (remaining token-steps) / M steps. Pacing follows from that:
//  - Step budget. b = M D / (token-steps) spreads the remaining dense tokens D over those
//    steps, rounded down to a multiple of 128 (A.2). It is at most the engine's budget, and at
//    most D / (longest remaining output) rounded up to a multiple of 128: that request needs
//    one step per token anyway, and the dense tokens should not outlast it. It is at least a
//    token for every running request; on an engine that runs a step's parts one after another
//    (PacingOptions::sequential_steps, blend's real engines) also every admitted prompt's unique
//    tokens, which a step there prices the same whenever it runs them.
//  - Memory-intensive side (rho(r) below the root density). M_R = (its token-steps) b / D is
//    the average footprint that ends it with the rest. A request of output d and average
//    footprint f = p + d/2 gets the end spacing d f / M_R: if M_R held N = M_R / f requests
//    like it with evenly spread ends, one would end every d / N steps. Requests go longest
//    first (the critical path), from a length-ordered set, but two requests' projected ends
//    must lie at least the smaller of their spacings apart (a short request's end matters
//    little to a long one's footprint). Requests that start together grow together and end
//    together, and their KV swings between their prompts and their peak every wave
//    (docs/BENCHMARKS.md). The projected peak of their real footprints (p + tokens generated,
//    growing a token a step: NanoFlow §4.4's projection) must leave half of what the other
//    side needs at b; that peak, not M_R, bounds how many run. When the longest does not fit,
//    a shorter one among the 64 looked at may: one that ends before the others peak fills the
//    gap. A request that needs as many steps as the run has left (d b >= D) has no slack and
//    does not wait for a free end.
//  - Compute-intensive side. It takes b new prompt tokens a step, less the running decodes, in
//    whatever room the other side leaves for as long as each request runs.
//  - Estimated lengths. The token-steps above count an estimated length d with spread sigma
//    (PlanRequest::output_spread, from the sampling pass) as d + kSpreadHeadroom sigma. Paced on
//    the means, b came out too high: the memory-intensive side got its memory early, and the
//    compute left over ran in a compute-bound end (debug trace, docs/BENCHMARKS.md). The
//    headroom is tuned on a set apart from the reported traces (session 34): Table 2's four
//    mixes at seeds 2 and 3, 20K requests, hidden lengths, 1% sampling, a100-80g; of 0, 0.5, 1,
//    1.5 and 2 sigma, a full sigma was best or within 0.2% of the best on 7 of the 8 workloads
//    (0.5 had been chosen on Table 2's own traces). Known lengths have no spread and are not
//    touched.
inline constexpr double kSpreadHeadroom = 1.0;

struct PacingOptions {
  bool enabled = true;
  // With pacing off: whether each side also admits no faster than Alg. 3's chunked-prefill
  // budget, C prompt tokens a step (`blend@alg3`, as published: C = N p / d is the rate at which
  // a side's N requests of output d end, so it keeps N running with their ends spread). A side
  // banks at most two steps' budget and may overdraw it by one request (a prompt longer than C
  // waits p / C steps after it); with nothing running at all a request always goes, so an idle
  // engine is never kept waiting. Without it only the M_L / M_R reservations admit
  // (`--no-capacity-pacing`), and a side fills its memory at once.
  bool prefill_budgets = false;
  int32_t max_step_tokens = 2048;  // the engine's own budget: b never exceeds it
  int32_t granularity = 128;       // b is a multiple of this (A.2)
  // The ablation of pacing's rules (`blend simulate --pacing-without`): each switch drops one.
  bool step_budget = true;  // off: b is the engine's budget, whatever KV capacity allows
  bool end_spacing = true;  // off: a memory-intensive request's end need not lie apart from others'
  bool left_floor = true;   // off: the memory-intensive side's peak may take the whole memory
  // Whether the engine runs a step's compute and memory parts one after another (blend's real
  // engines; `blend simulate POLICY@sequential`) rather than overlapped (NanoFlow): then a step's
  // budget also covers every admitted prompt, which deferring would only delay (admission.cc).
  bool sequential_steps = false;
};

struct Pacing {
  int32_t step_tokens = 0;         // b
  double memory_right = 0;         // M_R, bytes
  double memory_left_floor = 0;    // what the compute-intensive side needs at this budget
  double right_end_spacing = 0;    // end spacing of the longest waiting memory-intensive request
  double remaining_dense = 0;      // D
  double remaining_occupancy = 0;  // token-steps x KV bytes per token
};

// The handed-out requests' work that a step budget must cover, kept as requests are handed
// out, begin to decode and finish (the dual scanner and PacedWork): how many have produced a
// token, and the unique prompt tokens of those that have not.
struct AdmittedWork {
  int64_t decoding = 0;
  double pending_prompt_tokens = 0;

  void handed_out(double unique_prompt) { pending_prompt_tokens += unique_prompt; }
  void began_decoding(double unique_prompt) {
    pending_prompt_tokens = std::max(0.0, pending_prompt_tokens - unique_prompt);
    ++decoding;
  }
  void finished(bool decoded, double unique_prompt) {
    if (decoded)
      --decoding;
    else
      pending_prompt_tokens = std::max(0.0, pending_prompt_tokens - unique_prompt);
  }
  // On a sequential engine every admitted prompt runs at once: a decode token for each request
  // that decodes and every pending prompt token.
  double sequential_tokens() const { return static_cast<double>(decoding) + pending_prompt_tokens; }
};

// Capacity pacing's step budget b (PacingOptions::step_budget above) from the work left: KV
// capacity in tokens x dense tokens / token-steps, rounded down to the granularity; at most the
// dense tokens over the longest remaining output, rounded up; at least `floor` (the admitted
// work); within [granularity, max_step_tokens]. Its inputs depend on which requests are left,
// not on their order, so any admission order can run with it (PacedWork).
struct WorkLeft {
  double dense = 0;      // tokens still to compute: unique prompt tokens and outputs
  double occupancy = 0;  // KV token-steps still to hold
  double longest = 0;    // the longest remaining output, in tokens
};
double paced_step_tokens(double capacity_tokens, const WorkLeft& work, double floor,
                         const PacingOptions& options);

// The work a baseline's admission order leaves, for capacity pacing's step budget alone (issue
// 27: a baseline gets the budget rule wherever it does not depend on blend's order; the sides,
// end spacing and floor do). The same accounting as the dual scanner's, without its sides.
class PacedWork {
 public:
  // `capacity_bytes`: the KV memory (per device) the budget spreads the work over.
  // `engine_queues`: the stream hands out more than runs (fcfs), so a request counts as running
  // only once it decodes.
  PacedWork(const Plan& plan, const std::vector<PlanRequest>& requests, const CostModel& cost,
            double capacity_bytes, PacingOptions options, bool engine_queues);
  void started(int32_t request);
  void progressed(int32_t request, double generated_tokens);
  void finished(int32_t request);
  void on_step(int64_t step);  // re-paces once per step
  int32_t step_tokens() const;

 private:
  double unique_prompt_tokens(size_t i) const { return dense_[i] - output_[i]; }
  double admitted_floor() const;

  PacingOptions options_;
  double capacity_tokens_;
  bool engine_queues_;
  std::vector<double> prompt_, output_, occupancy_output_, dense_, generated_;
  std::vector<int32_t> running_, slot_;
  std::multiset<double> waiting_outputs_;
  WorkLeft waiting_;
  AdmittedWork admitted_;
  int64_t step_ = -1;
  double budget_ = 0;
};

// dfs / random: the plan's order, admitted while the reservations fit (fcfs: the input order
// with no memory limit, so the engine's own scheduler admits, as in `blend batch --policy fcfs`).
// With `pacing` set, each step's token budget follows capacity pacing's rule over the work left
// (PacedWork; `blend simulate --baselines-paced`); otherwise the engine's own.
class OrderedStream : public AdmissionStream {
 public:
  OrderedStream(const Plan& plan, const std::vector<PlanRequest>& requests, const CostModel& cost,
                double kv_memory_bytes, std::optional<PacingOptions> pacing = std::nullopt,
                double pacing_memory_bytes = 0);
  std::optional<int32_t> next() override;
  void on_finished(int32_t request) override;
  bool exhausted() const override { return cursor_ >= order_.size(); }
  void on_progress(int32_t request, double generated_tokens) override;
  void on_step(int64_t step) override;
  std::optional<int32_t> step_token_budget() const override;

 private:
  std::vector<int32_t> order_;
  std::vector<double> reservation_;
  size_t cursor_ = 0;
  double capacity_, used_ = 0;
  int64_t running_ = 0;
  std::optional<PacedWork> paced_;
};

class DualScanner : public AdmissionStream {
 public:
  // `window`: how many upcoming requests on each side stand for the node a cursor is at
  // (128: A.2's batch granularity).
  DualScanner(const Plan& plan, const std::vector<PlanRequest>& requests, const CostModel& cost,
              double kv_memory_bytes, size_t window = 128, PacingOptions pacing = {});
  std::optional<int32_t> next() override;
  void on_finished(int32_t request) override;
  bool exhausted() const override { return taken_ >= total_; }
  void on_step(int64_t step) override;
  std::optional<int32_t> step_token_budget() const override;
  const Pacing& pacing() const { return pacing_; }
  // Whether a request counts as memory-intensive (rho(r) below the root density).
  bool memory_intensive(int32_t request) const {
    return memory_intensive_[static_cast<size_t>(request)] != 0;
  }

  // §5.4: a running request has produced `generated_tokens`. Once that passes its estimate its
  // reservation grows to its real footprint (p + generated) and it is charged to the memory-
  // intensive side M_R, whatever side admitted it; further admissions see the smaller room.
  void on_progress(int32_t request, double generated_tokens) override;
  double reserved_bytes(Side side) const { return used_[side == Side::kLeft ? 0 : 1]; }

  // Which side handed out the last request from next().
  Side last_side() const { return last_side_; }
  const MemoryPartition& partition() const { return partition_; }
  // The partition at each change of the groups under the cursors (for explain output).
  const std::vector<MemoryPartition>& partition_history() const { return history_; }

 private:
  void repartition();
  void repace();
  std::optional<int32_t> next_paced();
  // Marks position `pos` of order_ handed out and moves the cursors past taken positions.
  void take_position(size_t pos);
  // Adds (sign +1) or removes (-1) request i's dense tokens and token-steps from waiting_.
  void add_waiting(size_t i, double sign);
  // The running memory-intensive requests' (remaining steps, tokens now), sorted, with suffix
  // sums of tokens; recomputed once per step or change.
  void project_right() const;
  // Projected peak KV bytes of the running memory-intensive requests plus request `candidate`
  // started now.
  double right_peak_with(size_t candidate) const;
  // KV bytes the running memory-intensive requests will hold `steps` steps from now.
  double right_footprint_after(double steps) const;
  // Steps that must lie between request i's projected end and another's (memory-intensive).
  double end_spacing(size_t i) const;
  // When a running memory-intensive request is projected to end too close to `end` (the
  // smaller of their spacings apart), the step a candidate must end before; else nullopt.
  std::optional<double> end_too_close(double end, double spacing) const;
  // Average footprint of a compute-intensive request: unique prompt + d/2 tokens.
  double left_reservation(size_t request) const;
  // Prompt tokens request i computes: those its group does not share, (1 - s_group) p.
  double unique_prompt_tokens(size_t i) const { return dense_tokens_[i] - estimated_output_[i]; }
  // The least step budget the handed-out requests need, in tokens (see admission.cc).
  double admitted_work_floor() const;

  const Plan& plan_;
  const CostModel& cost_;
  double prefill_credit_[2] = {0, 0};  // Alg. 3's C_L / C_R banked, in prompt tokens
  int64_t unpaced_running_ = 0;        // handed out, not finished (pacing off)
  int64_t credited_step_ = -1;
  std::vector<int32_t> order_;     // the plan's order; the left cursor eats it from the front
  std::vector<int32_t> group_of_;  // group index of each position of order_
  std::vector<double> reservation_;
  std::vector<double> prompt_tokens_;
  std::vector<double> estimated_output_;
  std::vector<double> occupancy_output_;  // d + kSpreadHeadroom sigma: what the token-steps count
  std::vector<Side> side_of_;
  double capacity_;
  size_t window_;
  std::vector<double> cum_compute_, cum_memory_, cum_prompt_, cum_output_;  // prefix sums
  double used_[2] = {0, 0};
  size_t low_ = 0, high_ = 0;  // requests [low_, high_) of order_ are still waiting
  int32_t left_group_ = -1, right_group_ = -1;
  int64_t taken_ = 0, total_ = 0;
  Side last_side_ = Side::kLeft;
  MemoryPartition partition_;
  std::vector<MemoryPartition> history_;
  // Capacity pacing.
  PacingOptions pacing_options_;
  Pacing pacing_;
  std::vector<double> dense_tokens_;    // per request: (1 - s_group) p + d
  std::vector<char> memory_intensive_;  // per request: rho(r) below the root density
  std::vector<double> generated_;       // per request, tokens produced so far (its age)
  std::vector<int32_t> running_[2];     // handed out, not finished, per side
  std::vector<int32_t> running_slot_;   // position of a request in its running_ list
  std::multiset<double> waiting_outputs_;
  std::vector<char> taken_position_;  // per position of order_
  // Waiting memory-intensive requests, longest first: (-d, position).
  std::set<std::pair<double, size_t>> memory_waiting_;
  std::vector<size_t> compute_positions_;  // compute-intensive positions, in the plan's order
  size_t next_compute_ = 0;
  struct {
    double dense = 0, occupancy = 0, occupancy_right = 0;  // token-steps
  } waiting_;  // totals over the requests not handed out yet
  // Running memory-intensive requests whose end spacing is a step or more: projected end step
  // (start + estimate) -> their spacing; and each one's place in it.
  std::multimap<double, double> right_ends_;
  std::vector<std::multimap<double, double>::iterator> right_end_of_;
  int64_t right_version_ = 0;
  mutable int64_t profile_step_ = -1, profile_version_ = -1;
  mutable std::vector<double> profile_remaining_, profile_suffix_;
  int64_t step_ = 0, paced_step_ = -1;
  double left_prompt_credit_ = 0;
  AdmittedWork admitted_;  // the handed-out requests' work
};

}  // namespace blend::plan
