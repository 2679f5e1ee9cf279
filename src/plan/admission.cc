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

// Token-steps of KV a request of prompt p and output d still holds from age `age` on (p + k for
// k = age .. d): capacity pacing's measure of the work left (the dual scanner and PacedWork).
double remaining_token_steps(double p, double d, double age) {
  const double a = std::min(age, d), left = d - a;
  return (p + a) * left + left * left / 2;
}

}  // namespace

double kv_reservation_bytes(const CostModel& cost, const PlanRequest& request) {
  const double p = static_cast<double>(request.prompt.size());
  return (p + request.output_tokens / 2) * cost.kv_bytes_per_token_per_device();
}

OrderedStream::OrderedStream(const Plan& plan, const std::vector<PlanRequest>& requests,
                             const CostModel& cost, double kv_memory_bytes,
                             std::optional<PacingOptions> pacing, double pacing_memory_bytes)
    : order_(plan.order()), capacity_(kv_memory_bytes) {
  reservation_.reserve(requests.size());
  for (const PlanRequest& r : requests) reservation_.push_back(kv_reservation_bytes(cost, r));
  // No memory limit of its own (fcfs): the engine's scheduler queues what it is handed.
  if (pacing)
    paced_.emplace(plan, requests, cost, pacing_memory_bytes, *pacing,
                   /*engine_queues=*/!std::isfinite(kv_memory_bytes));
}

std::optional<int32_t> OrderedStream::next() {
  if (cursor_ >= order_.size()) return std::nullopt;
  const int32_t r = order_[cursor_];
  const double need = reservation_[static_cast<size_t>(r)];
  if (running_ > 0 && used_ + need > capacity_) return std::nullopt;
  used_ += need;
  ++running_;
  ++cursor_;
  if (paced_) paced_->started(r);
  return r;
}

void OrderedStream::on_finished(int32_t request) {
  used_ -= reservation_[static_cast<size_t>(request)];
  --running_;
  if (paced_) paced_->finished(request);
}

void OrderedStream::on_progress(int32_t request, double generated_tokens) {
  if (paced_) paced_->progressed(request, generated_tokens);
}

void OrderedStream::on_step(int64_t step) {
  if (paced_) paced_->on_step(step);
}

std::optional<int32_t> OrderedStream::step_token_budget() const {
  if (!paced_) return std::nullopt;
  return paced_->step_tokens();
}

double paced_step_tokens(double capacity_tokens, const WorkLeft& work, double floor,
                         const PacingOptions& options) {
  const double max_tokens = options.max_step_tokens;
  const double g = std::max(1, options.granularity);
  // KV capacity rounds down (a larger budget would not fit); the longest request's steps round
  // up: rounded down, the dense tokens would outlast it and lengthen the run (at a 128-token
  // floor a 4K-request run took up to 1.2x longer; docs/BENCHMARKS.md).
  double b = work.occupancy > 0 ? std::floor(capacity_tokens * work.dense / work.occupancy / g) * g
                                : max_tokens;
  if (work.longest >= 1) b = std::min(b, std::ceil(work.dense / work.longest / g) * g);
  if (!options.step_budget) b = max_tokens;
  b = std::max(b, floor);
  return std::clamp(b, std::min(g, max_tokens), max_tokens);
}

PacedWork::PacedWork(const Plan& plan, const std::vector<PlanRequest>& requests,
                     const CostModel& cost, double capacity_bytes, PacingOptions options,
                     bool engine_queues)
    : options_(options),
      capacity_tokens_(capacity_bytes / cost.kv_bytes_per_token_per_device()),
      engine_queues_(engine_queues) {
  const size_t n = requests.size();
  prompt_.assign(n, 0);
  output_ = occupancy_output_ = dense_ = generated_ = prompt_;
  slot_.assign(n, -1);
  for (const RequestGroup& group : plan.groups) {
    const double s = group.stats.sharing_ratio();
    for (int32_t r : group.requests) {
      const auto i = static_cast<size_t>(r);
      const PlanRequest& q = requests[i];
      prompt_[i] = static_cast<double>(q.prompt.size());
      output_[i] = q.output_tokens;
      occupancy_output_[i] = q.output_tokens + kSpreadHeadroom * q.output_spread;
      dense_[i] = (1 - s) * prompt_[i] + output_[i];
      waiting_.dense += dense_[i];
      waiting_.occupancy += remaining_token_steps(prompt_[i], occupancy_output_[i], 0);
      waiting_outputs_.insert(output_[i]);
    }
  }
}

void PacedWork::started(int32_t request) {
  const auto i = static_cast<size_t>(request);
  slot_[i] = static_cast<int32_t>(running_.size());
  running_.push_back(request);
  waiting_.dense -= dense_[i];
  waiting_.occupancy -= remaining_token_steps(prompt_[i], occupancy_output_[i], 0);
  waiting_outputs_.erase(waiting_outputs_.find(output_[i]));
  admitted_.handed_out(unique_prompt_tokens(i));
}

void PacedWork::progressed(int32_t request, double generated_tokens) {
  const auto i = static_cast<size_t>(request);
  if (generated_[i] == 0 && generated_tokens > 0 && slot_[i] >= 0)
    admitted_.began_decoding(unique_prompt_tokens(i));
  generated_[i] = generated_tokens;
}

void PacedWork::finished(int32_t request) {
  const auto i = static_cast<size_t>(request);
  if (slot_[i] < 0) return;
  admitted_.finished(generated_[i] > 0, unique_prompt_tokens(i));
  const auto slot = static_cast<size_t>(slot_[i]);
  running_[slot] = running_.back();
  slot_[static_cast<size_t>(running_[slot])] = static_cast<int32_t>(slot);
  running_.pop_back();
  slot_[i] = -1;
}

// As DualScanner::admitted_work_floor: a decode token for every running request; on a
// sequential engine also every admitted prompt's unique tokens. A stream that admits within
// reservations (dfs, random, the dual scanner) hands out only what runs; fcfs hands the whole
// batch out at once and the engine's queue holds most of it, so there only the requests that
// have begun to decode count (counting all, its floor was the whole batch and its budget the
// engine's every step: 16,349 against 16,443 tokens/s on Trace#1 at 20K, 9,754 against 10,388
// on Trace#4; docs/BENCHMARKS.md).
double PacedWork::admitted_floor() const {
  const double g = std::max(1, options_.granularity);
  const double running = engine_queues_ ? static_cast<double>(admitted_.decoding)
                                        : static_cast<double>(running_.size());
  const double work = options_.sequential_steps ? admitted_.sequential_tokens() : running;
  return std::ceil(work / g) * g;
}

void PacedWork::on_step(int64_t step) {
  if (step <= step_) return;
  step_ = step;
  WorkLeft work = waiting_;
  work.longest = waiting_outputs_.empty() ? 0 : *waiting_outputs_.rbegin();
  for (int32_t r : running_) {
    const auto i = static_cast<size_t>(r);
    const double age = generated_[i], left = std::max(0.0, output_[i] - age);
    work.dense += age > 0 ? left : dense_[i];
    work.occupancy += remaining_token_steps(prompt_[i], occupancy_output_[i], age);
    work.longest = std::max(work.longest, left);
  }
  budget_ = paced_step_tokens(capacity_tokens_, work, admitted_floor(), options_);
}

int32_t PacedWork::step_tokens() const {
  if (!options_.sequential_steps) return static_cast<int32_t>(budget_);
  // Requests admitted since the step was paced count too (DualScanner::step_token_budget).
  const double max_tokens = options_.max_step_tokens;
  return static_cast<int32_t>(std::max(budget_, std::min(admitted_floor(), max_tokens)));
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
                         const CostModel& cost, double kv_memory_bytes, size_t window,
                         PacingOptions pacing)
    : plan_(plan),
      cost_(cost),
      capacity_(kv_memory_bytes),
      window_(std::max<size_t>(window, 1)),
      pacing_options_(pacing) {
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
    occupancy_output_.push_back(r.output_tokens + kSpreadHeadroom * r.output_spread);
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

  // Capacity pacing: per request dense tokens and KV token-steps; which side it belongs to.
  dense_tokens_.assign(requests.size(), 0);
  memory_intensive_.assign(requests.size(), 0);
  generated_.assign(requests.size(), 0);
  taken_position_.assign(order_.size(), 0);
  running_slot_.assign(requests.size(), -1);
  right_end_of_.assign(requests.size(), right_ends_.end());
  for (size_t i = 0; i < order_.size(); ++i) {
    const auto r = static_cast<size_t>(order_[i]);
    const double s = plan.groups[static_cast<size_t>(group_of_[i])].stats.sharing_ratio();
    const double p = prompt_tokens_[r], d = estimated_output_[r];
    dense_tokens_[r] = (1 - s) * p + d;
    memory_intensive_[r] = finite_density(cost.request_density(p, d)) < plan.root_density;
    add_waiting(r, +1);
    waiting_outputs_.insert(d);
    if (memory_intensive_[r])
      memory_waiting_.emplace(-d, i);
    else
      compute_positions_.push_back(i);
  }
  repartition();
}

void DualScanner::add_waiting(size_t i, double sign) {
  const double steps = remaining_token_steps(prompt_tokens_[i], occupancy_output_[i], 0);
  waiting_.dense += sign * dense_tokens_[i];
  waiting_.occupancy += sign * steps;
  if (memory_intensive_[i]) waiting_.occupancy_right += sign * steps;
}

void DualScanner::on_step(int64_t step) {
  if (!pacing_options_.enabled) {
    if (!pacing_options_.prefill_budgets || step == credited_step_) return;
    credited_step_ = step;
    repartition();  // the cursors' nodes now
    const double budget[2] = {partition_.prefill_budget_left, partition_.prefill_budget_right};
    for (int s : {0, 1})
      prefill_credit_[s] = std::min(prefill_credit_[s] + budget[s], 2 * budget[s]);
    return;
  }
  if (step <= step_ && paced_step_ >= 0) return;
  step_ = step;
  repace();
  // New prompt tokens the compute-intensive side may start this step: the budget less the
  // decode token every running request takes (at most two steps' worth banked).
  const double decoders = static_cast<double>(running_[0].size() + running_[1].size());
  const double b = pacing_.step_tokens;
  left_prompt_credit_ = std::min(left_prompt_credit_ + std::max(0.0, b - decoders), 2 * b);
}

std::optional<int32_t> DualScanner::step_token_budget() const {
  if (!pacing_options_.enabled || paced_step_ < 0) return std::nullopt;
  if (!pacing_options_.sequential_steps) return pacing_.step_tokens;
  // The requests admitted since the step was paced count too.
  const double max_tokens = pacing_options_.max_step_tokens;
  return static_cast<int32_t>(
      std::max<double>(pacing_.step_tokens, std::min(admitted_work_floor(), max_tokens)));
}

double DualScanner::admitted_work_floor() const {
  const double g = std::max(1, pacing_options_.granularity);
  // Never below one token for every running request: a budget under the running decodes starves
  // some of them each step, which frees no memory sooner and stretches the run (a uniform
  // 400 x (40 + 400) job took 1,108 steps instead of ~410 before this floor, 1.51x dfs's time).
  if (!pacing_options_.sequential_steps)
    return std::ceil(static_cast<double>(running_[0].size() + running_[1].size()) / g) * g;
  // An engine that runs a step's parts one after another prices a prompt token the same in any
  // step, so a prompt admitted is computed at once: a decode token for every request that has
  // begun to decode, and the unique prompt tokens of every request admitted but not begun.
  // Paced below that, the admitted prompts queued in the engine, holding their reservations,
  // while the budget, paced on the dense work left, shrank with every step they waited: on a
  // 1,000-request Trace#1 mix on an H100 a request waited a median 62 steps and up to 469 for its
  // first token, and the run took 1,232 steps where dfs took 677 (docs/BENCHMARKS.md). An
  // overlapped engine keeps them queued: there the budget holds a step's compute under its
  // decodes' memory time, which hides it. The paced b itself rises, and with it the credit the
  // compute-intensive side admits by, so that side admits as fast as the engine computes
  // (raising only the engine's budget left that mix at 783-842 steps).
  return std::ceil(admitted_.sequential_tokens() / g) * g;
}

void DualScanner::repace() {
  paced_step_ = step_;
  const double kv = cost_.kv_bytes_per_token_per_device();
  double dense = waiting_.dense, occupancy = waiting_.occupancy;
  double occupancy_right = waiting_.occupancy_right;
  double longest = waiting_outputs_.empty() ? 0 : *waiting_outputs_.rbegin();
  for (int side : {0, 1})
    for (int32_t r : running_[side]) {
      const auto i = static_cast<size_t>(r);
      const double age = generated_[i];
      const double d = estimated_output_[i], left = std::max(0.0, d - age);
      const double steps = remaining_token_steps(prompt_tokens_[i], occupancy_output_[i], age);
      // A request that has generated nothing is still in its prompt, whose unique tokens are
      // dense work too: counting only its output, the budget starved the prompts the stream had
      // already admitted (300 Trace#1 requests with outputs capped at 8 tokens ran 754 steps of
      // 128-384 tokens, fcfs 53 of 4,096).
      dense += age > 0 ? left : dense_tokens_[i];
      occupancy += steps;
      if (side == 1) occupancy_right += steps;
      longest = std::max(longest, left);
    }
  const double b = paced_step_tokens(capacity_ / kv, {dense, occupancy, longest},
                                     admitted_work_floor(), pacing_options_);
  pacing_.step_tokens = static_cast<int32_t>(b);
  pacing_.remaining_dense = dense;
  pacing_.remaining_occupancy = occupancy * kv;
  pacing_.memory_right = dense > 0 ? std::min(capacity_, occupancy_right * kv * b / dense) : 0;
  // The memory-intensive side's projected peak may not take the last half of what the
  // compute-intensive side needs at this budget. Half, not all: those requests are short-lived
  // and make room within a few hundred steps (measured on Table 2's traces: 0, 0.25, 0.5, 0.75
  // and 1 of it; docs/BENCHMARKS.md).
  constexpr double kLeftFloorShare = 0.5;
  pacing_.memory_left_floor =
      dense > 0 && pacing_options_.left_floor
          ? kLeftFloorShare * std::min(capacity_, (occupancy - occupancy_right) * kv * b / dense)
          : 0;
  pacing_.right_end_spacing =
      memory_waiting_.empty()
          ? 0
          : end_spacing(static_cast<size_t>(order_[memory_waiting_.begin()->second]));
}

double DualScanner::end_spacing(size_t i) const {
  // M_R held by requests like i alone: N = M_R / (p + d/2) of them, and N running with evenly
  // spread ends end one every d / N steps.
  return pacing_.memory_right > 0 && pacing_options_.end_spacing
             ? estimated_output_[i] * reservation_[i] / pacing_.memory_right
             : 0;
}

std::optional<double> DualScanner::end_too_close(double end, double spacing) const {
  if (spacing < 1) return std::nullopt;
  // Two requests' ends must lie the smaller of their spacings apart (a short request's end
  // matters little to a long one's footprint).
  for (auto e = right_ends_.lower_bound(end - spacing);
       e != right_ends_.end() && e->first < end + spacing; ++e) {
    const double apart = std::min(spacing, e->second);
    if (std::abs(e->first - end) < apart) return e->first - apart;
  }
  return std::nullopt;
}

double DualScanner::left_reservation(size_t i) const {
  return (unique_prompt_tokens(i) + estimated_output_[i] / 2) *
         cost_.kv_bytes_per_token_per_device();
}

double DualScanner::right_footprint_after(double steps) const {
  double tokens = 0;
  for (int32_t r : running_[1]) {
    const auto i = static_cast<size_t>(r);
    const double age = generated_[i] + steps;
    if (age < estimated_output_[i]) tokens += prompt_tokens_[i] + age;
  }
  return tokens * cost_.kv_bytes_per_token_per_device();
}

void DualScanner::project_right() const {
  if (profile_step_ == step_ && profile_version_ == right_version_) return;
  profile_step_ = step_;
  profile_version_ = right_version_;
  struct Future {
    double remaining, tokens;
  };
  std::vector<Future> futures;
  futures.reserve(running_[1].size());
  for (int32_t r : running_[1]) {
    const auto i = static_cast<size_t>(r);
    const double age = generated_[i], d = estimated_output_[i];
    futures.push_back({std::max(1.0, d - age), prompt_tokens_[i] + std::min(age, d)});
  }
  std::sort(futures.begin(), futures.end(),
            [](const Future& a, const Future& b) { return a.remaining < b.remaining; });
  profile_remaining_.resize(futures.size());
  profile_suffix_.assign(futures.size() + 1, 0);
  for (size_t k = futures.size(); k-- > 0;) {
    profile_remaining_[k] = futures[k].remaining;
    profile_suffix_[k] = profile_suffix_[k + 1] + futures[k].tokens;
  }
}

double DualScanner::right_peak_with(size_t candidate) const {
  project_right();
  // Footprints grow a token a step until each request ends, so the total peaks just before an
  // end: at t = remaining_k, request k and every later-ending one (and the candidate, if it is
  // still running) hold tokens + t each.
  const size_t n = profile_remaining_.size();
  const double cand_remaining = std::max(1.0, estimated_output_[candidate]);
  const double cand_tokens = prompt_tokens_[candidate];
  double peak = 0;
  for (size_t k = 0; k < n; ++k) {
    const double t = profile_remaining_[k];
    double tokens = profile_suffix_[k] + static_cast<double>(n - k) * t;
    if (cand_remaining >= t) tokens += cand_tokens + t;
    peak = std::max(peak, tokens);
  }
  // At the candidate's own end.
  const auto j = static_cast<size_t>(
      std::lower_bound(profile_remaining_.begin(), profile_remaining_.end(), cand_remaining) -
      profile_remaining_.begin());
  peak = std::max(peak, cand_tokens + cand_remaining + profile_suffix_[j] +
                            static_cast<double>(n - j) * cand_remaining);
  return peak * cost_.kv_bytes_per_token_per_device();
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
  if (pacing_options_.enabled) return next_paced();
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
    if (pacing_options_.prefill_budgets && unpaced_running_ > 0 && prefill_credit_[s] <= 0)
      continue;
    prefill_credit_[s] -= prompt_tokens_[static_cast<size_t>(r)];
    ++unpaced_running_;
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

void DualScanner::take_position(size_t pos) {
  taken_position_[pos] = 1;
  while (low_ < high_ && taken_position_[low_]) ++low_;
  while (low_ < high_ && taken_position_[high_ - 1]) --high_;
}

std::optional<int32_t> DualScanner::next_paced() {
  if (paced_step_ < 0) repace();
  auto take = [&](size_t pos) {
    const int32_t r = order_[pos];
    take_position(pos);
    const auto i = static_cast<size_t>(r);
    const int side = memory_intensive_[i] ? 1 : 0;
    side_of_[i] = last_side_ = side == 1 ? Side::kRight : Side::kLeft;
    running_slot_[i] = static_cast<int32_t>(running_[side].size());
    running_[side].push_back(r);
    add_waiting(i, -1);
    waiting_outputs_.erase(waiting_outputs_.find(estimated_output_[i]));
    admitted_.handed_out(unique_prompt_tokens(i));
    if (side == 0) {
      used_[0] += left_reservation(i);
      left_prompt_credit_ -= unique_prompt_tokens(i);
    } else {
      used_[1] += reservation_[i];
      ++right_version_;
      const double spacing = end_spacing(i);
      if (spacing >= 1)
        right_end_of_[i] =
            right_ends_.emplace(static_cast<double>(step_) + estimated_output_[i], spacing);
    }
    ++taken_;
    return r;
  };
  // Memory-intensive requests first: each is long-lived, and starting it late stretches the run.
  // Their projected peak must leave the compute-intensive side what the step budget needs. The
  // longest goes first (it is the critical path), unless a running one is projected to end
  // within a spacing of it (end_spacing): then the longest that ends that far earlier.
  // Requests that start together grow together and end together, and their KV swings between
  // their prompts and their peak every wave; ends a spacing apart keep it level, one starting
  // as one ends. When the longest does not fit, a shorter one among the kRightWindow looked at
  // may: one that ends before the others peak fills the gap their growth leaves.
  constexpr int kRightWindow = 64;
  const bool idle = running_[0].empty() && running_[1].empty();
  int looked = 0;
  for (auto it = memory_waiting_.begin(); it != memory_waiting_.end() && looked < kRightWindow;
       ++looked) {
    const size_t pos = it->second;
    const auto i = static_cast<size_t>(order_[pos]);
    // A request that needs as many steps as the rest of the run has no slack: it does not wait
    // for a free end.
    const bool urgent = estimated_output_[i] * pacing_.step_tokens >= pacing_.remaining_dense;
    if (!idle && !urgent) {
      const auto step = static_cast<double>(step_);
      if (const auto before = end_too_close(step + estimated_output_[i], end_spacing(i))) {
        it = memory_waiting_.lower_bound({-(*before - step), 0});  // the longest ending before
        continue;
      }
    }
    if (idle || running_[1].empty() ||
        right_peak_with(i) <= capacity_ - pacing_.memory_left_floor) {
      memory_waiting_.erase(it);
      return take(pos);
    }
    ++it;
  }
  // Compute-intensive requests in the plan's order: at the step budget's pace, in the room the
  // memory-intensive side leaves for as long as the candidate runs (it is short-lived; theirs
  // grow meanwhile).
  while (next_compute_ < compute_positions_.size() &&
         taken_position_[compute_positions_[next_compute_]])
    ++next_compute_;
  if (next_compute_ < compute_positions_.size()) {
    const size_t pos = compute_positions_[next_compute_];
    const auto i = static_cast<size_t>(order_[pos]);
    const double room = capacity_ - right_footprint_after(estimated_output_[i] + 1);
    // As on the memory-intensive side, a request that needs as many steps as the run has left
    // has no slack: it starts without waiting for prompt credit (a uniform 400 x (40 + 400) job
    // kept its last 16 requests waiting until the others ended, which doubled its length).
    const bool urgent = estimated_output_[i] * pacing_.step_tokens >= pacing_.remaining_dense;
    if (running_[0].empty() ||
        ((urgent || left_prompt_credit_ > 0) && used_[0] + left_reservation(i) <= room))
      return take(pos);
  }
  return std::nullopt;
}

void DualScanner::on_finished(int32_t request) {
  const auto i = static_cast<size_t>(request);
  const int s = side_of_[i] == Side::kLeft ? 0 : 1;
  if (pacing_options_.enabled) {
    admitted_.finished(generated_[i] > 0, unique_prompt_tokens(i));
    if (s == 0)
      used_[0] = std::max(0.0, used_[0] - left_reservation(i));
    else
      used_[1] = std::max(0.0, used_[1] - reservation_[i]);
    std::vector<int32_t>& list = running_[s];
    const auto slot = static_cast<size_t>(running_slot_[i]);
    list[slot] = list.back();
    running_slot_[static_cast<size_t>(list[slot])] = static_cast<int32_t>(slot);
    list.pop_back();
    running_slot_[i] = -1;
    if (s == 1) {
      ++right_version_;
      if (right_end_of_[i] != right_ends_.end()) {
        right_ends_.erase(right_end_of_[i]);
        right_end_of_[i] = right_ends_.end();
      }
    }
    return;
  }
  used_[s] = std::max(0.0, used_[s] - reservation_[i]);
  --unpaced_running_;
}

void DualScanner::on_progress(int32_t request, double generated_tokens) {
  const size_t r = static_cast<size_t>(request);
  if (pacing_options_.enabled) {  // pacing projects footprints from each request's real age
    if (generated_[r] == 0 && generated_tokens > 0 && running_slot_[r] >= 0)
      admitted_.began_decoding(unique_prompt_tokens(r));
    generated_[r] = generated_tokens;
    return;
  }
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
