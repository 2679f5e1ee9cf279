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

#include <cstdint>
#include <optional>
#include <string>
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
};

// Reservation of one request in bytes on one device.
double kv_reservation_bytes(const CostModel& cost, const PlanRequest& request);

// fcfs / dfs / random: the plan's order, admitted while the reservations fit.
class OrderedStream : public AdmissionStream {
 public:
  OrderedStream(const Plan& plan, const std::vector<PlanRequest>& requests, const CostModel& cost,
                double kv_memory_bytes);
  std::optional<int32_t> next() override;
  void on_finished(int32_t request) override;
  bool exhausted() const override { return cursor_ >= order_.size(); }

 private:
  std::vector<int32_t> order_;
  std::vector<double> reservation_;
  size_t cursor_ = 0;
  double capacity_, used_ = 0;
  int64_t running_ = 0;
};

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

class DualScanner : public AdmissionStream {
 public:
  // `window`: how many upcoming requests on each side stand for the node a cursor is at
  // (128: A.2's batch granularity).
  DualScanner(const Plan& plan, const std::vector<PlanRequest>& requests, const CostModel& cost,
              double kv_memory_bytes, size_t window = 128);
  std::optional<int32_t> next() override;
  void on_finished(int32_t request) override;
  bool exhausted() const override { return taken_ >= total_; }

  // §5.4: a running request has produced `generated_tokens`. Once that passes its estimate its
  // reservation grows to its real footprint (p + generated) and it is charged to the memory-
  // intensive side M_R, whatever side admitted it; further admissions see the smaller room.
  void on_progress(int32_t request, double generated_tokens);
  double reserved_bytes(Side side) const { return used_[side == Side::kLeft ? 0 : 1]; }

  // Which side handed out the last request from next().
  Side last_side() const { return last_side_; }
  const MemoryPartition& partition() const { return partition_; }
  // The partition at each change of the groups under the cursors (for explain output).
  const std::vector<MemoryPartition>& partition_history() const { return history_; }

 private:
  void repartition();

  const Plan& plan_;
  const CostModel& cost_;
  std::vector<int32_t> order_;     // the plan's order; the left cursor eats it from the front
  std::vector<int32_t> group_of_;  // group index of each position of order_
  std::vector<double> reservation_;
  std::vector<double> prompt_tokens_;
  std::vector<double> estimated_output_;
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
};

}  // namespace blend::plan
