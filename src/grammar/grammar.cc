#include "grammar/grammar.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace blend {
namespace {

// Calls and returns followed for one byte before giving up: bounds the work of rules that
// match nothing inside loops (none of ours loop that way, and compile() refuses left
// recursion; this is the guard if one did). An object's optional properties are a chain of
// such calls, one per property (json_schema caps them at 256 an object): at 64, an object of
// 60 optional properties could not be closed empty nor start with its last property.
constexpr int kCallBudget = 1024;

// Rule shapes, process-wide: a canonical text of each rule's automaton (its callees written as
// their shape ids) interned to an id. Ids are never reused, so forgetting the registry when it
// grows large only costs tables rebuilt under new ids, never a wrong match. Bounded by bytes
// too: a large enum's rule is one shape whose text holds every value, so a stream of distinct
// schemas grew the registry (and the server) by megabytes a schema long before 65,536 shapes
// (issue 54's soak: RSS +2.6 MB a schema once the grammar cache was full).
constexpr size_t kMaxShapes = size_t{1} << 16;
constexpr size_t kMaxShapeBytes = size_t{32} << 20;
std::mutex shapes_mu;
std::unordered_map<std::string, uint64_t> shape_ids;
size_t shape_bytes = 0;  // of the keys in shape_ids
uint64_t next_shape = 1;

uint64_t intern_shape(std::string key) {
  std::lock_guard lock(shapes_mu);
  if (shape_ids.size() >= kMaxShapes || shape_bytes + key.size() > kMaxShapeBytes) {
    std::unordered_map<std::string, uint64_t>().swap(shape_ids);  // its buckets go too
    shape_bytes = 0;
  }
  auto [it, added] = shape_ids.emplace(std::move(key), next_shape);
  if (added) {
    ++next_shape;
    shape_bytes += it->first.size();
  }
  return it->second;
}

}  // namespace

size_t shape_registry_bytes() {
  std::lock_guard lock(shapes_mu);
  return shape_bytes;
}

namespace {

uint64_t unique_shape() {
  std::lock_guard lock(shapes_mu);
  return next_shape++;
}

template <typename T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}

GExpr make(GrammarExpr e) {
  return std::make_shared<const GrammarExpr>(std::move(e));
}

}  // namespace

GExpr g_bytes(const ByteSet& set) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kBytes;
  e.bytes = set;
  return make(std::move(e));
}

GExpr g_range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add_range(lo, hi);
  return g_bytes(s);
}

GExpr g_lit(std::string_view text) {
  std::vector<GExpr> items;
  for (char c : text) {
    ByteSet s;
    s.add(static_cast<uint8_t>(c));
    items.push_back(g_bytes(s));
  }
  return g_seq(std::move(items));
}

GExpr g_seq(std::vector<GExpr> items) {
  if (items.size() == 1) return items[0];
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kSeq;
  e.items = std::move(items);
  return make(std::move(e));
}

GExpr g_alt(std::vector<GExpr> items) {
  if (items.size() == 1) return items[0];
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kAlt;
  e.items = std::move(items);
  return make(std::move(e));
}

GExpr g_repeat(GExpr item, int32_t min, int32_t max) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kRepeat;
  e.items = {std::move(item)};
  e.min = min;
  e.max = max;
  return make(std::move(e));
}

GExpr g_rule(int32_t rule) {
  GrammarExpr e;
  e.kind = GrammarExpr::Kind::kRule;
  e.rule = rule;
  return make(std::move(e));
}

int32_t Grammar::add_rule(std::string name) {
  rules_.push_back({std::move(name), nullptr, -1});
  return static_cast<int32_t>(rules_.size()) - 1;
}

void Grammar::define(int32_t rule, GExpr body) {
  rules_.at(static_cast<size_t>(rule)).body = std::move(body);
}

void Grammar::set_counted_string(int32_t rule, CountedString c) {
  rules_.at(static_cast<size_t>(rule)).counted = c;
}

const Grammar::CountedString* Grammar::counted_string(int32_t rule) const {
  const Rule& r = rules_[static_cast<size_t>(rule)];
  return r.counted.unbounded_rule >= 0 ? &r.counted : nullptr;
}

bool Grammar::witness(int32_t node, std::string& bytes) const {
  const Rule& r = rules_[static_cast<size_t>(nodes_[static_cast<size_t>(node)].rule)];
  const size_t count = static_cast<size_t>(r.end - r.start);
  std::vector<int32_t> parent(count, -1);
  std::vector<uint8_t> via(count, 0);
  std::vector<int32_t> queue{r.start};
  parent[0] = r.start;
  for (size_t q = 0; q < queue.size() && parent[static_cast<size_t>(node - r.start)] < 0; ++q) {
    for (const ByteEdge& e : nodes_[static_cast<size_t>(queue[q])].bytes) {
      const size_t t = static_cast<size_t>(e.target - r.start);
      if (t >= count || parent[t] >= 0) continue;
      int b = 0;
      while (b < 256 && !e.set.has(static_cast<uint8_t>(b))) ++b;
      if (b == 256) continue;
      parent[t] = queue[q];
      via[t] = static_cast<uint8_t>(b);
      queue.push_back(e.target);
    }
  }
  if (parent[static_cast<size_t>(node - r.start)] < 0) return false;
  bytes.clear();
  for (int32_t x = node; x != r.start; x = parent[static_cast<size_t>(x - r.start)])
    bytes.push_back(static_cast<char>(via[static_cast<size_t>(x - r.start)]));
  std::reverse(bytes.begin(), bytes.end());
  return true;
}

int32_t Grammar::walk_bytes(int32_t node, std::string_view bytes) const {
  for (char c : bytes) {
    int32_t next = -1;
    for (const ByteEdge& e : nodes_[static_cast<size_t>(node)].bytes) {
      if (!e.set.has(static_cast<uint8_t>(c))) continue;
      if (next >= 0) return -1;
      next = e.target;
    }
    if (next < 0) return -1;
    node = next;
  }
  return node;
}

void Grammar::compile_rule(int32_t rule) {
  // Thompson construction with epsilon moves, then each state's epsilon closure folded into it.
  struct NState {
    std::vector<int> eps;
    std::vector<std::pair<ByteSet, int>> bytes;
    std::vector<std::pair<int32_t, int>> calls;
  };
  std::vector<NState> ns(1);
  // A bounded repeat copies its item max times: the states are bounded as the nodes are.
  const auto max_states = static_cast<size_t>(4 * budget_->max_nodes);
  auto fresh = [&] {
    spend(1);
    if (ns.size() >= max_states)
      throw Error("the grammar needs more than " + std::to_string(max_states) +
                  " automaton states (the limit: a long enum, const or bounded repeat of a large "
                  "schema makes many)");
    ns.emplace_back();
    return static_cast<int>(ns.size()) - 1;
  };
  // Builds `e` from state `from`; returns the state where it ends.
  std::function<int(const GExpr&, int)> build = [&](const GExpr& e, int from) -> int {
    switch (e->kind) {
      case GrammarExpr::Kind::kBytes: {
        const int t = fresh();
        ns[from].bytes.push_back({e->bytes, t});
        return t;
      }
      case GrammarExpr::Kind::kRule: {
        if (e->rule < 0 || e->rule >= num_rules()) throw Error("internal: grammar rule id");
        const int t = fresh();
        ns[from].calls.push_back({e->rule, t});
        return t;
      }
      case GrammarExpr::Kind::kSeq: {
        int cur = from;
        for (const GExpr& item : e->items) cur = build(item, cur);
        return cur;
      }
      case GrammarExpr::Kind::kAlt: {
        const int end = fresh();
        for (const GExpr& item : e->items) {
          const int s = fresh();
          ns[from].eps.push_back(s);
          ns[build(item, s)].eps.push_back(end);
        }
        return end;
      }
      case GrammarExpr::Kind::kRepeat: {
        int cur = from;
        for (int32_t i = 0; i < e->min; ++i) cur = build(e->items[0], cur);
        if (e->max < 0) {
          const int loop = fresh();
          ns[cur].eps.push_back(loop);
          ns[build(e->items[0], loop)].eps.push_back(loop);
          return loop;
        }
        const int end = fresh();
        for (int32_t i = e->min; i < e->max; ++i) {
          ns[cur].eps.push_back(end);
          cur = build(e->items[0], cur);
        }
        ns[cur].eps.push_back(end);
        return end;
      }
    }
    return from;
  };
  if (!rules_[rule].body)
    throw Error("internal: grammar rule '" + rules_[rule].name + "' undefined");
  const int accept = build(rules_[rule].body, 0);

  // Nodes for the start state and every target of a byte or call edge.
  std::map<int, int32_t> node_of;
  std::vector<int> order{0};
  node_of[0] = static_cast<int32_t>(nodes_.size());
  nodes_.emplace_back();
  // seen[x] == i + 1: x is in the closure of order[i] (a mark per closure, never a clear of
  // every state per node: that was quadratic, 564 s for a 3 MB enum).
  std::vector<uint32_t> seen(ns.size(), 0);
  for (size_t i = 0; i < order.size(); ++i) {
    const int s = order[i];
    const auto mark = static_cast<uint32_t>(i + 1);
    // Epsilon closure of s.
    std::vector<int> closure{s}, todo{s};
    seen[static_cast<size_t>(s)] = mark;
    while (!todo.empty()) {
      const int x = todo.back();
      todo.pop_back();
      spend(1 + static_cast<int64_t>(ns[static_cast<size_t>(x)].eps.size()));
      for (int y : ns[static_cast<size_t>(x)].eps)
        if (seen[static_cast<size_t>(y)] != mark) {
          seen[static_cast<size_t>(y)] = mark;
          closure.push_back(y);
          todo.push_back(y);
        }
    }
    auto node_for = [&](int t) {
      auto [it, added] = node_of.emplace(t, static_cast<int32_t>(nodes_.size()));
      if (added) {
        if (static_cast<int64_t>(nodes_.size()) >= budget_->max_nodes)
          throw Error("the grammar needs more than " + std::to_string(budget_->max_nodes) +
                      " automaton nodes (the limit: each byte of an enum or const value is one)");
        nodes_.emplace_back();
        order.push_back(t);
      }
      return it->second;
    };
    Node n;
    n.rule = rule;
    std::map<int32_t, ByteSet> by_target;  // one edge per target: the union of its byte sets
    for (int x : closure) {
      spend(1);
      if (x == accept) n.final = true;
      for (const auto& [set, t] : ns[static_cast<size_t>(x)].bytes)
        by_target[node_for(t)].add_all(set);
      for (const auto& [r, t] : ns[static_cast<size_t>(x)].calls) n.add_call({r, node_for(t)});
    }
    for (const auto& [t, set] : by_target) n.bytes.push_back({set, t});
    nodes_[static_cast<size_t>(node_of[s])] = std::move(n);
  }
  rules_[rule].start = node_of[0];
  rules_[rule].end = static_cast<int32_t>(nodes_.size());
  merge_equivalent_nodes(rule);
}

void Grammar::merge_equivalent_nodes(int32_t rule) {
  // Nodes that may end the rule alike and whose edges are the same (the same bytes to the same
  // nodes, the same calls returning to the same nodes) behave alike: each group becomes one
  // node, and again while merged targets make more nodes alike, for kMergeRounds rounds at
  // most (a merge is right after any round; two literals with a long common suffix would
  // otherwise take a round per byte). Coarser than none, not always minimal; enough for the
  // string rule's "between two characters" nodes, one per kind of character (one round).
  constexpr int kMergeRounds = 4;
  const int32_t start = rules_[rule].start;
  const size_t count = static_cast<size_t>(rules_[rule].end - start);
  std::vector<int32_t> rep(count);  // each node's group, as the index of its first node
  for (size_t i = 0; i < count; ++i) rep[i] = static_cast<int32_t>(i);
  auto group_of = [&](int32_t node) { return rep[static_cast<size_t>(node - start)]; };
  bool merged = true;
  for (int round = 0; merged && round < kMergeRounds; ++round) {
    merged = false;
    std::map<std::string, int32_t> first_with;
    for (size_t i = 0; i < count; ++i) {
      if (rep[i] != static_cast<int32_t>(i)) continue;  // folded into an earlier node
      const Node& n = nodes_[start + i];
      spend(1 + static_cast<int64_t>(n.bytes.size() + n.calls.size()));
      std::map<int32_t, ByteSet> bytes_to;  // target group -> the bytes that lead there
      for (const ByteEdge& e : n.bytes) bytes_to[group_of(e.target)].add_all(e.set);
      std::vector<std::pair<int32_t, int32_t>> calls;  // (rule, return group)
      for (const CallEdge& c : n.calls) calls.push_back({c.rule, group_of(c.target)});
      std::sort(calls.begin(), calls.end());
      calls.erase(std::unique(calls.begin(), calls.end()), calls.end());
      std::string signature(1, n.final ? 'f' : 'n');
      for (const auto& [target, set] : bytes_to) {
        put(signature, target);
        put(signature, set.bits);
      }
      put(signature, int32_t{-1});
      for (const auto& call : calls) put(signature, call);
      const auto [it, added] = first_with.emplace(std::move(signature), static_cast<int32_t>(i));
      if (!added) {
        rep[i] = it->second;
        merged = true;
      }
    }
    // A node folded into one that was itself folded this round points at the final group.
    for (size_t i = 0; i < count; ++i) rep[i] = rep[static_cast<size_t>(rep[i])];
  }
  // One node per group, in the order of their first nodes (the start stays first).
  std::vector<int32_t> new_index(count, -1);
  int32_t kept = 0;
  for (size_t i = 0; i < count; ++i)
    if (rep[i] == static_cast<int32_t>(i)) new_index[i] = start + kept++;
  if (static_cast<size_t>(kept) == count) return;
  auto renumber = [&](int32_t node) { return new_index[static_cast<size_t>(group_of(node))]; };
  std::vector<Node> folded;
  for (size_t i = 0; i < count; ++i) {
    if (rep[i] != static_cast<int32_t>(i)) continue;
    const Node& n = nodes_[start + i];
    Node m;
    m.rule = rule;
    m.final = n.final;
    std::map<int32_t, ByteSet> by_target;  // one edge per target, as compile_rule makes them
    for (const ByteEdge& e : n.bytes) by_target[renumber(e.target)].add_all(e.set);
    for (const auto& [t, set] : by_target) m.bytes.push_back({set, t});
    for (const CallEdge& c : n.calls) m.add_call({c.rule, renumber(c.target)});
    folded.push_back(std::move(m));
  }
  nodes_.resize(static_cast<size_t>(start));
  nodes_.insert(nodes_.end(), folded.begin(), folded.end());
  rules_[rule].end = static_cast<int32_t>(nodes_.size());
}

void Grammar::compute_shapes() {
  const size_t num = rules_.size();
  std::vector<std::vector<int32_t>> callees(num);
  for (size_t r = 0; r < num; ++r) {
    for (int32_t n = rules_[r].start; n < rules_[r].end; ++n)
      for (const CallEdge& c : nodes_[static_cast<size_t>(n)].calls) callees[r].push_back(c.rule);
    std::sort(callees[r].begin(), callees[r].end());
    callees[r].erase(std::unique(callees[r].begin(), callees[r].end()), callees[r].end());
  }
  // A rule that reaches itself through calls has no finite canonical text (a cycle would have
  // to be canonicalised as a whole); it gets a unique shape instead.
  std::vector<char> cyclic(num, 0);
  std::vector<uint32_t> seen(num, 0);
  std::vector<int32_t> todo;
  for (size_t r = 0; r < num; ++r) {
    const uint32_t epoch = static_cast<uint32_t>(r) + 1;
    todo.assign(callees[r].begin(), callees[r].end());
    while (!todo.empty() && !cyclic[r]) {
      const size_t x = static_cast<size_t>(todo.back());
      todo.pop_back();
      spend(1);
      if (x == r) cyclic[r] = 1;
      if (seen[x] == epoch) continue;
      seen[x] = epoch;
      todo.insert(todo.end(), callees[x].begin(), callees[x].end());
    }
  }
  shapes_.assign(num, 0);
  // Callees first; an acyclic rule only calls rules whose recursion ends, so this terminates.
  std::function<uint64_t(size_t)> shape = [&](size_t r) -> uint64_t {
    if (shapes_[r]) return shapes_[r];
    if (cyclic[r]) return shapes_[r] = unique_shape();
    std::string key;
    const int32_t start = rules_[r].start;
    spend(rules_[r].end - start);
    put(key, rules_[r].end - start);
    for (int32_t i = start; i < rules_[r].end; ++i) {
      const Node& n = nodes_[static_cast<size_t>(i)];
      put(key, static_cast<uint8_t>(n.final | (n.completes << 1)));
      put(key, static_cast<uint32_t>(n.bytes.size()));
      for (const ByteEdge& e : n.bytes) {
        put(key, e.set.bits);
        put(key, e.target - start);
      }
      put(key, static_cast<uint32_t>(n.calls.size()));
      for (const CallEdge& c : n.calls) {
        put(key, shape(static_cast<size_t>(c.rule)));
        put(key, c.target - start);
      }
    }
    return shapes_[r] = intern_shape(std::move(key));
  };
  for (size_t r = 0; r < num; ++r) shape(r);
}

void Grammar::spend(int64_t steps) {
  constexpr int64_t kPollEvery = int64_t{1} << 14;
  const int64_t before = work_;
  work_ += steps;
  if (work_ > budget_->max_work)
    throw Error("compiling the grammar took more than " + std::to_string(budget_->max_work) +
                " steps (the limit: the schema is too large or too deeply repeated)");
  if (budget_->cancelled && before / kPollEvery != work_ / kPollEvery && budget_->cancelled())
    throw Error("the grammar's compilation was cancelled");
}

void Grammar::compile(int32_t root, const GrammarBudget& budget) {
  budget_ = &budget;
  work_ = 0;
  struct Forget {  // the budget is the caller's: not kept past this call, whatever happens
    const GrammarBudget*& budget;
    ~Forget() { budget = nullptr; }
  } forget{budget_};
  nodes_.clear();
  for (int32_t r = 0; r < num_rules(); ++r) compile_rule(r);
  root_ = root;
  // The expressions are in the automata now; a large enum's would double what is kept.
  for (Rule& r : rules_) r.body.reset();
  // completes(n): the rule may end at n, possibly after calls to rules that match nothing.
  for (Node& n : nodes_) n.completes = n.final;
  for (bool changed = true; changed;) {
    changed = false;
    spend(static_cast<int64_t>(nodes_.size()));
    for (Node& n : nodes_) {
      if (n.completes) continue;
      for (const CallEdge& c : n.calls)
        if (nodes_[static_cast<size_t>(rules_[c.rule].start)].completes &&
            nodes_[static_cast<size_t>(c.target)].completes) {
          n.completes = changed = true;
          break;
        }
    }
  }
  remove_unproductive();
  refuse_left_recursion();
  compute_shapes();
  index_deterministic_nodes();
  compute_follow();
}

void Grammar::remove_unproductive() {
  // can_end[n]: some finite text leads from n to its rule's end (through calls of rules that
  // match some finite text): a least fixpoint, last node first since edges mostly lead on.
  const size_t count = nodes_.size();
  std::vector<char> can_end(count, 0);
  for (size_t i = 0; i < count; ++i) can_end[i] = nodes_[i].final;
  auto starts_productive = [&](int32_t rule) {
    return can_end[static_cast<size_t>(rules_[static_cast<size_t>(rule)].start)] != 0;
  };
  for (bool changed = true; changed;) {
    changed = false;
    spend(static_cast<int64_t>(count));
    for (size_t i = count; i-- > 0;) {
      if (can_end[i]) continue;
      const Node& n = nodes_[i];
      bool ends = std::any_of(n.bytes.begin(), n.bytes.end(), [&](const ByteEdge& e) {
        return can_end[static_cast<size_t>(e.target)] != 0;
      });
      ends = ends || std::any_of(n.calls.begin(), n.calls.end(), [&](const CallEdge& c) {
               return starts_productive(c.rule) && can_end[static_cast<size_t>(c.target)];
             });
      if (ends) can_end[i] = changed = true;
    }
  }
  productive_.assign(rules_.size(), 0);
  for (size_t r = 0; r < rules_.size(); ++r)
    productive_[r] = starts_productive(static_cast<int32_t>(r));
  if (!productive_[static_cast<size_t>(root_)])
    throw Error("the grammar matches no finite text: every way through '" +
                rules_[static_cast<size_t>(root_)].name +
                "' recurses without end (such as the schema {\"$ref\": \"#\"})");
  // A matcher that took such an edge could never finish: it would be stuck with an empty mask
  // (the output "!" reported as complete, issue 54). Without them every state can complete.
  for (Node& n : nodes_) {
    std::erase_if(n.bytes,
                  [&](const ByteEdge& e) { return !can_end[static_cast<size_t>(e.target)]; });
    std::erase_if(n.calls, [&](const CallEdge& c) {
      return !starts_productive(c.rule) || !can_end[static_cast<size_t>(c.target)];
    });
  }
}

void Grammar::refuse_left_recursion() {
  // Rule r calls c "first" when a call of c is reachable from r's start over calls of rules
  // that may match nothing. A cycle of such calls would let step() recurse without consuming
  // anything (bounded only by kCallBudget); in a schema it is an anyOf/$ref loop that adds no
  // value (anyOf: [{"$ref": "#"}, ...]).
  const size_t num = rules_.size();
  std::vector<std::vector<int32_t>> first_calls(num);
  std::vector<uint32_t> seen(nodes_.size(), 0);
  for (size_t r = 0; r < num; ++r) {
    const auto mark = static_cast<uint32_t>(r + 1);
    std::vector<int32_t> todo{rules_[r].start};
    seen[static_cast<size_t>(rules_[r].start)] = mark;
    while (!todo.empty()) {
      const Node& n = nodes_[static_cast<size_t>(todo.back())];
      todo.pop_back();
      spend(1 + static_cast<int64_t>(n.calls.size()));
      for (const CallEdge& c : n.calls) {
        first_calls[r].push_back(c.rule);
        const bool nullable =
            nodes_[static_cast<size_t>(rules_[static_cast<size_t>(c.rule)].start)].completes;
        if (nullable && seen[static_cast<size_t>(c.target)] != mark) {
          seen[static_cast<size_t>(c.target)] = mark;
          todo.push_back(c.target);
        }
      }
    }
  }
  // Depth-first search for a cycle: 0 unvisited, 1 on the path, 2 done.
  std::vector<char> color(num, 0);
  std::vector<std::pair<size_t, size_t>> path;  // (rule, next callee index)
  for (size_t r0 = 0; r0 < num; ++r0) {
    if (color[r0]) continue;
    path.push_back({r0, 0});
    color[r0] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      spend(1);
      if (next == first_calls[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const auto c = static_cast<size_t>(first_calls[r][next++]);
      if (color[c] == 1)
        throw Error("the grammar's rule '" + rules_[c].name +
                    "' can call itself before matching any byte (left recursion, not "
                    "supported: in a schema, an anyOf/$ref loop that adds no value)");
      if (color[c] == 0) {
        color[c] = 1;
        path.push_back({c, 0});
      }
    }
  }
}

size_t Grammar::memory_bytes() const {
  size_t bytes = sizeof(*this) + nodes_.capacity() * sizeof(Node) +
                 rules_.capacity() * sizeof(Rule) + shapes_.capacity() * sizeof(uint64_t) +
                 follow_.capacity() * sizeof(ByteSet) + productive_.capacity() +
                 deterministic_slot_.capacity() * sizeof(int32_t) + edge_of_byte_.capacity();
  for (const Node& n : nodes_)
    bytes += n.bytes.capacity() * sizeof(ByteEdge) + n.calls.capacity() * sizeof(CallEdge);
  for (const Rule& r : rules_) bytes += r.name.capacity();
  return bytes;
}

void Grammar::compute_follow() {
  // first[n]: the bytes a stack topped by n can consume next without popping n's rule: its
  // byte edges, the first bytes of the rules it calls and, where a called rule can match
  // nothing, the call's return node's.
  std::vector<ByteSet> first(nodes_.size());
  for (bool grew = true; grew;) {
    grew = false;
    spend(static_cast<int64_t>(nodes_.size()));
    // Last node first: a call's return node comes after the calling node, so one pass
    // carries most of what flows back through rules that match nothing.
    for (size_t i = nodes_.size(); i-- > 0;) {
      const Node& n = nodes_[i];
      for (const ByteEdge& e : n.bytes) grew = first[i].add_all(e.set) || grew;
      for (const CallEdge& c : n.calls) {
        const auto start = static_cast<size_t>(rules_[static_cast<size_t>(c.rule)].start);
        grew = first[i].add_all(first[start]) || grew;
        if (nodes_[start].completes)
          grew = first[i].add_all(first[static_cast<size_t>(c.target)]) || grew;
      }
    }
  }
  // follow[r]: after a call of r returns to t, what t consumes, and if t can end its rule,
  // what follows that rule.
  follow_.assign(rules_.size(), ByteSet{});
  for (bool grew = true; grew;) {
    grew = false;
    spend(static_cast<int64_t>(nodes_.size()));
    for (const Node& n : nodes_)
      for (const CallEdge& c : n.calls) {
        ByteSet& f = follow_[static_cast<size_t>(c.rule)];
        const auto t = static_cast<size_t>(c.target);
        grew = f.add_all(first[t]) || grew;
        if (nodes_[t].completes) grew = f.add_all(follow_[static_cast<size_t>(n.rule)]) || grew;
      }
  }
}

void Grammar::index_deterministic_nodes() {
  deterministic_slot_.assign(nodes_.size(), -1);
  edge_of_byte_.clear();
  std::array<uint8_t, 256> edge_of{};
  spend(static_cast<int64_t>(nodes_.size()));
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (!n.calls.empty() || n.final || n.bytes.size() >= kNoEdgeIndex) continue;
    edge_of.fill(kNoEdgeIndex);
    bool deterministic = true;
    for (size_t e = 0; e < n.bytes.size() && deterministic; ++e)
      for (size_t w = 0; w < 4 && deterministic; ++w)
        for (uint64_t bits = n.bytes[e].set.bits[w]; bits; bits &= bits - 1) {
          const size_t b = w * 64 + static_cast<size_t>(std::countr_zero(bits));
          if (edge_of[b] != kNoEdgeIndex) {
            deterministic = false;  // two edges take b: a set of stacks after it
            break;
          }
          edge_of[b] = static_cast<uint8_t>(e);
        }
    if (!deterministic) continue;
    deterministic_slot_[i] = static_cast<int32_t>(edge_of_byte_.size() / 256);
    edge_of_byte_.insert(edge_of_byte_.end(), edge_of.begin(), edge_of.end());
  }
}

void Grammar::step_rec(GrammarStack& s, uint8_t b, std::vector<GrammarStack>& out, size_t& count,
                       bool* outside, int budget) const {
  const int32_t top = s.back();
  const Node& n = nodes_[static_cast<size_t>(top)];
  for (const ByteEdge& e : n.bytes)
    if (e.set.has(b)) {
      if (count < out.size())
        out[count].assign(s.begin(), s.end());
      else
        out.push_back(s);
      out[count++].back() = e.target;
    }
  if (budget == 0) return;
  for (const CallEdge& c : n.calls) {
    s.back() = c.target;
    s.push_back(rules_[static_cast<size_t>(c.rule)].start);
    step_rec(s, b, out, count, outside, budget - 1);
    s.pop_back();
    s.back() = top;
  }
  if (n.final && s.size() > 1) {
    s.pop_back();
    if (s.back() == kOutside) {
      if (outside) *outside = true;
    } else {
      step_rec(s, b, out, count, outside, budget - 1);
    }
    s.push_back(top);
  }
}

void Grammar::step(const GrammarStack& stack, uint8_t b, std::vector<GrammarStack>& out,
                   bool* outside) const {
  GrammarStack s = stack;
  size_t count = out.size();
  step_rec(s, b, out, count, outside, kCallBudget);
}

void Grammar::advance_into(const std::vector<GrammarStack>& state, size_t state_size, uint8_t b,
                           std::vector<GrammarStack>& out, size_t& out_size, bool* outside) const {
  thread_local GrammarStack scratch;
  out_size = 0;
  for (size_t i = 0; i < state_size; ++i) {
    scratch.assign(state[i].begin(), state[i].end());
    step_rec(scratch, b, out, out_size, outside, kCallBudget);
  }
  if (out_size > 1) {
    const auto end = out.begin() + static_cast<ptrdiff_t>(out_size);
    std::sort(out.begin(), end);
    out_size = static_cast<size_t>(std::unique(out.begin(), end) - out.begin());
  }
}

std::vector<GrammarStack> Grammar::advance(const std::vector<GrammarStack>& state, uint8_t b,
                                           bool* outside) const {
  std::vector<GrammarStack> out;
  for (const GrammarStack& s : state) step(s, b, out, outside);
  if (out.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out;
}

bool Grammar::can_finish(const GrammarStack& stack) const {
  for (int32_t n : stack)
    if (n == kOutside || !nodes_[static_cast<size_t>(n)].completes) return false;
  return true;
}

bool Grammar::can_continue(const GrammarStack& stack) const {
  std::vector<GrammarStack> out;
  for (int b = 0; b < 256; ++b) {
    step(stack, static_cast<uint8_t>(b), out);
    if (!out.empty()) return true;
  }
  return false;
}

bool Grammar::matches_prefix(std::string_view text) const {
  std::vector<GrammarStack> state = initial();
  for (char c : text) {
    state = advance(state, static_cast<uint8_t>(c));
    if (state.empty()) return false;
  }
  return true;
}

bool Grammar::matches(std::string_view text) const {
  std::vector<GrammarStack> state = initial();
  for (char c : text) {
    state = advance(state, static_cast<uint8_t>(c));
    if (state.empty()) return false;
  }
  return std::any_of(state.begin(), state.end(),
                     [&](const GrammarStack& s) { return can_finish(s); });
}

}  // namespace blend
