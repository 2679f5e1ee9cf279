#include "plan/admission.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace blend::plan {
namespace {

// Densities of groups that never decode are infinite; a large finite stand-in keeps Alg. 3's
// arithmetic defined (such groups then get almost no memory, which is what they need).
constexpr double kMaxDensity = 1e9;

double finite_density(double rho) {
  return std::isfinite(rho) ? rho : kMaxDensity;
}

}  // namespace

double kv_reservation_bytes(const CostModel& cost, const PlanRequest& request) {
  const double p = static_cast<double>(request.prompt.size());
  return (p + request.output_tokens / 2) * cost.kv_bytes_per_token_per_device();
}

OrderedStream::OrderedStream(const Plan& plan, const std::vector<PlanRequest>& requests,
                             const CostModel& cost, double kv_memory_bytes)
    : order_(plan.order()), capacity_(kv_memory_bytes) {
  reservation_.reserve(requests.size());
  for (const PlanRequest& r : requests) reservation_.push_back(kv_reservation_bytes(cost, r));
}

std::optional<int32_t> OrderedStream::next() {
  if (cursor_ >= order_.size()) return std::nullopt;
  const int32_t r = order_[cursor_];
  const double need = reservation_[static_cast<size_t>(r)];
  if (running_ > 0 && used_ + need > capacity_) return std::nullopt;
  used_ += need;
  ++running_;
  ++cursor_;
  return r;
}

void OrderedStream::on_finished(int32_t request) {
  used_ -= reservation_[static_cast<size_t>(request)];
  --running_;
}

MemoryPartition partition_memory(double memory_bytes, double rho_root, double rho_left,
                                 double rho_right, double prompt_left, double output_left,
                                 double prompt_right, double output_right,
                                 double kv_bytes_per_token) {
  MemoryPartition m;
  m.rho_root = finite_density(rho_root);
  m.rho_left = finite_density(rho_left);
  m.rho_right = finite_density(rho_right);
  if (m.rho_left - m.rho_right <= 0) {
    m.memory_left = memory_bytes;
    m.note = "both cursors on groups of equal density: all memory to the left";
  } else if (m.rho_root >= m.rho_left) {
    m.memory_left = memory_bytes;
    m.note = "root density at or above the left group's: all memory to the left";
  } else if (m.rho_root <= m.rho_right) {
    m.memory_right = memory_bytes;
    m.note = "root density at or below the right group's: all memory to the right";
  } else {  // Alg. 3 step 1
    m.memory_left = memory_bytes * (m.rho_root - m.rho_right) / (m.rho_left - m.rho_right);
    m.memory_right = memory_bytes * (m.rho_left - m.rho_root) / (m.rho_left - m.rho_right);
  }
  // Alg. 3 steps 2-3: decode population and chunked-prefill budget of each side.
  const double d_left = std::max(output_left, 1.0), d_right = std::max(output_right, 1.0);
  m.requests_left = m.memory_left / ((prompt_left + d_left / 2) * kv_bytes_per_token);
  m.requests_right = m.memory_right / ((prompt_right + d_right / 2) * kv_bytes_per_token);
  m.prefill_budget_left = m.requests_left * prompt_left / d_left;
  m.prefill_budget_right = m.requests_right * prompt_right / d_right;
  return m;
}

DualScanner::DualScanner(const Plan& plan, const std::vector<PlanRequest>& requests,
                         const CostModel& cost, double kv_memory_bytes, size_t window)
    : plan_(plan), cost_(cost), capacity_(kv_memory_bytes), window_(std::max<size_t>(window, 1)) {
  if (!(kv_memory_bytes > 0)) throw Error("dual scanner: KV memory must be positive");
  for (size_t g = 0; g < plan.groups.size(); ++g)
    for (int32_t r : plan.groups[g].requests) {
      order_.push_back(r);
      group_of_.push_back(static_cast<int32_t>(g));
    }
  reservation_.reserve(requests.size());
  for (const PlanRequest& r : requests) {
    reservation_.push_back(kv_reservation_bytes(cost, r));
    prompt_tokens_.push_back(static_cast<double>(r.prompt.size()));
    estimated_output_.push_back(r.output_tokens);
  }
  side_of_.assign(requests.size(), Side::kLeft);
  cum_compute_.assign(order_.size() + 1, 0);
  cum_memory_ = cum_prompt_ = cum_output_ = cum_compute_;
  for (size_t i = 0; i < order_.size(); ++i) {
    const PlanRequest& q = requests[static_cast<size_t>(order_[i])];
    const double p = static_cast<double>(q.prompt.size());
    cum_compute_[i + 1] = cum_compute_[i] + cost.request_compute_seconds(p, q.output_tokens);
    cum_memory_[i + 1] = cum_memory_[i] + cost.request_memory_seconds(p, q.output_tokens);
    cum_prompt_[i + 1] = cum_prompt_[i] + p;
    cum_output_[i + 1] = cum_output_[i] + q.output_tokens;
  }
  high_ = order_.size();
  total_ = static_cast<int64_t>(order_.size());
  repartition();
}

void DualScanner::repartition() {
  if (low_ >= high_) return;
  const int32_t lg = group_of_[low_], rg = group_of_[high_ - 1];
  // The node each cursor is at: the next `window_` requests on its side, within its group
  // (whose sharing ratio discounts their compute), so a large group sorted by density still
  // yields the density of the part being scanned.
  auto window_stats = [&](size_t begin, size_t end, int32_t group) {
    DemandStats w;
    w.compute_seconds = cum_compute_[end] - cum_compute_[begin];
    w.memory_seconds = cum_memory_[end] - cum_memory_[begin];
    w.prompt_tokens = cum_prompt_[end] - cum_prompt_[begin];
    w.output_tokens = cum_output_[end] - cum_output_[begin];
    w.requests = static_cast<int64_t>(end - begin);
    const double s = plan_.groups[static_cast<size_t>(group)].stats.sharing_ratio();
    w.unique_tokens = (1 - s) * w.prompt_tokens;
    return w;
  };
  size_t left_end = low_;
  while (left_end < high_ && left_end - low_ < window_ && group_of_[left_end] == lg) ++left_end;
  size_t right_begin = high_;
  while (right_begin > low_ && high_ - right_begin < window_ && group_of_[right_begin - 1] == rg)
    --right_begin;
  const DemandStats l = window_stats(low_, left_end, lg);
  const DemandStats r = window_stats(right_begin, high_, rg);
  partition_ = partition_memory(capacity_, plan_.root_density, l.density(), r.density(),
                                l.mean_prompt(), l.mean_output(), r.mean_prompt(), r.mean_output(),
                                cost_.kv_bytes_per_token_per_device());
  if (lg != left_group_ || rg != right_group_) history_.push_back(partition_);
  left_group_ = lg;
  right_group_ = rg;
}

std::optional<int32_t> DualScanner::next() {
  if (low_ >= high_) return std::nullopt;
  repartition();
  const double budget[2] = {partition_.memory_left, partition_.memory_right};
  // Fill the side that is emptier relative to its share first.
  auto fill = [&](int s) { return budget[s] > 0 ? used_[s] / budget[s] : 2.0; };
  const int first = fill(0) <= fill(1) ? 0 : 1;
  for (int s : {first, 1 - first}) {
    if (budget[s] <= 0) continue;
    const int32_t r = s == 0 ? order_[low_] : order_[high_ - 1];
    const double need = reservation_[static_cast<size_t>(r)];
    if (used_[s] > 0 && used_[s] + need > budget[s]) continue;
    if (used_[0] + used_[1] > 0 && used_[0] + used_[1] + need > capacity_) continue;
    if (s == 0) {
      ++low_;
    } else {
      --high_;
    }
    used_[s] += need;
    last_side_ = s == 0 ? Side::kLeft : Side::kRight;
    side_of_[static_cast<size_t>(r)] = last_side_;
    ++taken_;
    return r;
  }
  return std::nullopt;
}

void DualScanner::on_finished(int32_t request) {
  const int s = side_of_[static_cast<size_t>(request)] == Side::kLeft ? 0 : 1;
  used_[s] = std::max(0.0, used_[s] - reservation_[static_cast<size_t>(request)]);
}

void DualScanner::on_progress(int32_t request, double generated_tokens) {
  const size_t r = static_cast<size_t>(request);
  if (generated_tokens <= estimated_output_[r]) return;
  const double footprint =
      (prompt_tokens_[r] + generated_tokens) * cost_.kv_bytes_per_token_per_device();
  if (footprint <= reservation_[r] && side_of_[r] == Side::kRight) return;
  const int from = side_of_[r] == Side::kLeft ? 0 : 1;
  used_[from] = std::max(0.0, used_[from] - reservation_[r]);
  reservation_[r] = std::max(reservation_[r], footprint);
  used_[1] += reservation_[r];
  side_of_[r] = Side::kRight;
}

}  // namespace blend::plan
