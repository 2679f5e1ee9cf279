// Grammar — a context-free grammar over bytes and the incremental matcher that follows it.
//
// Rules are regular expressions over byte sets that may call rules (recursion allowed, left
// recursion not: nothing we generate has it). compile() turns each rule into a small automaton
// whose edges consume one byte or call a rule, with the epsilon moves removed, so the matcher
// is a pushdown automaton: a state is a set of stacks of automaton nodes (callers' return nodes
// below, the node being matched on top), advanced one byte at a time. This is the shape of
// llama.cpp's GBNF matcher (stacks of grammar positions) and of XGrammar's pushdown automaton,
// written for bytes rather than code points so that tokens that split a UTF-8 character are
// matched exactly.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace blend {

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  // Adds every byte of `other`; whether any was new.
  bool add_all(const ByteSet& other) {
    bool grew = false;
    for (size_t w = 0; w < bits.size(); ++w) {
      grew = grew || (other.bits[w] & ~bits[w]) != 0;
      bits[w] |= other.bits[w];
    }
    return grew;
  }
  bool operator==(const ByteSet&) const = default;
};

struct GrammarExpr;
using GExpr = std::shared_ptr<const GrammarExpr>;

struct GrammarExpr {
  enum class Kind { kBytes, kSeq, kAlt, kRepeat, kRule };
  Kind kind = Kind::kSeq;
  ByteSet bytes;              // kBytes: one byte of this set
  std::vector<GExpr> items;   // kSeq, kAlt; kRepeat: items[0]
  int32_t min = 0, max = -1;  // kRepeat: max -1 = unbounded
  int32_t rule = -1;          // kRule
};

// Expression builders.
GExpr g_bytes(const ByteSet& set);
GExpr g_range(uint8_t lo, uint8_t hi);
GExpr g_lit(std::string_view text);  // these bytes in order
GExpr g_seq(std::vector<GExpr> items);
GExpr g_alt(std::vector<GExpr> items);
GExpr g_repeat(GExpr item, int32_t min, int32_t max);
inline GExpr g_opt(GExpr item) {
  return g_repeat(std::move(item), 0, 1);
}
inline GExpr g_star(GExpr item) {
  return g_repeat(std::move(item), 0, -1);
}
GExpr g_rule(int32_t rule);

// What one Grammar::compile() may spend. Grammars come from clients' schemas, and without a
// bound one 3 MB enum held a thread for 564 s and 0.9 GB (issue 54). Real schemas stay far
// below: the benchmark's schemas (tests/grammar/data) compile to at most 616 nodes, within a
// hundredth of the work budget (grammar_test checks it); the largest enum json_schema allows
// (4,096 values, 125 KB of them) to 105,618 nodes, 45 MB and 2.5 million steps in 0.4 s.
struct GrammarBudget {
  // Automaton nodes (about 430 bytes each with their step tables; a byte of an enum or const
  // value is one): 131,072 nodes are about 56 MB.
  int64_t max_nodes = int64_t{1} << 17;
  // Elementary steps of the passes (Thompson states, epsilon closures, node merging, shapes,
  // productivity, follow sets): 2^23 (8.4 million), 1.5 s to 7 s of one core (1.3 to 6 million
  // steps a second were measured, on a loaded and an idle core).
  int64_t max_work = int64_t{1} << 23;
  // Polled every 2^14 steps; true stops the compilation (the client left). Null: never.
  std::function<bool()> cancelled;
};

// Bytes of rule-shape text the process-wide shape registry holds now (compile() interns each
// rule's shape there; bounded, like the number of shapes: past the bound it starts over).
size_t shape_registry_bytes();

// A stack of automaton nodes, callers' return nodes first, the current node last.
using GrammarStack = std::vector<int32_t>;

class Grammar {
 public:
  // Stacks whose bottom is kOutside came from matching a node "out of context" (grammar/
  // token_mask precomputes what a token does from one node alone): popping onto it means the
  // rest of the token is for the callers, who are not known there.
  static constexpr int32_t kOutside = -1;

  int32_t add_rule(std::string name);
  void define(int32_t rule, GExpr body);
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  const std::string& rule_name(int32_t rule) const { return rules_[rule].name; }
  // Builds every rule's automaton; `root` is what the whole output must match. Every rule
  // must be defined. Alternatives that can never end (a rule that only recurses, such as the
  // schema {"$ref": "#"}) are removed, so that every state the matcher reaches can still
  // complete. Throws blend::Error for an undefined rule, a root that matches no finite text, a
  // rule that calls itself before consuming a byte (left recursion), more nodes or work than
  // `budget` allows (the message names the limit), or a cancelled compilation.
  void compile(int32_t root, const GrammarBudget& budget = {});
  // After compile(): whether `rule` matches some finite text (its calls included).
  bool rule_productive(int32_t rule) const { return productive_[static_cast<size_t>(rule)] != 0; }
  // Bytes the compiled grammar holds (its nodes, edges and tables), for byte-bounded caches.
  size_t memory_bytes() const;

  // The matcher's primitives. The initial state is one stack holding the root's start node.
  std::vector<GrammarStack> initial() const { return {{rules_[root_].start}}; }
  // Every way `stack` can consume byte `b`, appended to `out` (not deduplicated). Sets
  // *outside when a way pops onto kOutside before consuming the byte.
  void step(const GrammarStack& stack, uint8_t b, std::vector<GrammarStack>& out,
            bool* outside = nullptr) const;
  // All stacks after one byte, sorted and deduplicated (empty: the byte is not allowed).
  std::vector<GrammarStack> advance(const std::vector<GrammarStack>& state, uint8_t b,
                                    bool* outside = nullptr) const;
  // advance() for hot loops: the result is out[0, out_size), and the stacks already in `out`
  // are reused (their capacity), so a warm call allocates nothing.
  void advance_into(const std::vector<GrammarStack>& state, size_t state_size, uint8_t b,
                    std::vector<GrammarStack>& out, size_t& out_size,
                    bool* outside = nullptr) const;
  // For hot loops (grammar/token_mask walks the vocabulary a byte at a time): the node a stack
  // topped by `node` moves to on byte `b`, the rest of the stack unchanged, when `node` makes
  // no calls, cannot end its rule and has no byte on two of its edges (a string's interior,
  // an escape, a UTF-8 sequence): the target, or kNoEdge when no edge takes `b`.
  // kNotDeterministic for any other node: then only step() knows.
  static constexpr int32_t kNoEdge = -1, kNotDeterministic = -2;
  int32_t deterministic_step(int32_t node, uint8_t b) const {
    const int32_t slot = deterministic_slot_[static_cast<size_t>(node)];
    if (slot < 0) return kNotDeterministic;
    const uint8_t edge = edge_of_byte_[static_cast<size_t>(slot) * 256 + b];
    return edge == kNoEdgeIndex ? kNoEdge : nodes_[static_cast<size_t>(node)].bytes[edge].target;
  }
  // The bytes that can come right after a match of `rule` anywhere in the grammar (LL
  // parsing's FOLLOW set, over bytes): what its callers' return nodes can consume next,
  // through rules that match nothing and callers that end with it. Empty for the root: nothing
  // follows the output. An over-approximation, never an under-one: a byte outside it cannot
  // follow the rule in any stack, so token_mask rejects a token that leaves the rule with
  // such a byte without knowing the callers (a space then a letter, after JSON whitespace).
  const ByteSet& follow(int32_t rule) const { return follow_[static_cast<size_t>(rule)]; }
  // The stack's input so far is a complete match of the root.
  bool can_finish(const GrammarStack& stack) const;
  // The rule of `node` may end there (possibly after calls to rules that match nothing).
  bool node_completes(int32_t node) const { return nodes_[static_cast<size_t>(node)].completes; }
  // Some byte can follow.
  bool can_continue(const GrammarStack& stack) const;
  // What a node's token table depends on, the same in every grammar: the shape of its rule
  // (its automaton and, through their shapes, the rules it calls) and its place in that rule.
  // Equal shapes mean equal automata from there on, so grammars compiled from different
  // schemas share the tables of their common rules (whitespace, strings, numbers). Rules that
  // can call themselves get a shape of their own, shared with nothing.
  struct NodeShape {
    uint64_t rule_shape;
    int32_t index;
  };
  NodeShape node_shape(int32_t node) const {
    const Node& n = nodes_[static_cast<size_t>(node)];
    return {shapes_[static_cast<size_t>(n.rule)], node - rules_[static_cast<size_t>(n.rule)].start};
  }
  // A string rule `"` char{min,max} `"` made like the unbounded `"` char* `"` rule
  // `unbounded_rule`, char being one JSON string character (json_schema's minLength and
  // maxLength). Its automaton has a node per character position, but from each of them a
  // token does what it does from the unbounded rule's node in the same place within a
  // character, unless it has too many characters (or closes too early): token_mask derives
  // their tables from the unbounded rule's instead of walking the vocabulary again.
  struct CountedString {
    int32_t unbounded_rule = -1, min = 0, max = -1;  // max -1: unbounded
  };
  void set_counted_string(int32_t rule, CountedString c);
  const CountedString* counted_string(int32_t rule) const;
  int32_t node_rule(int32_t node) const { return nodes_[static_cast<size_t>(node)].rule; }
  int32_t rule_start(int32_t rule) const { return rules_[static_cast<size_t>(rule)].start; }
  // Bytes that lead from the start of `node`'s rule to `node` over byte edges (the lowest byte
  // of each edge, breadth first); false when no such path exists.
  bool witness(int32_t node, std::string& bytes) const;
  // The node `bytes` lead to from `node` over byte edges, each byte on exactly one edge; -1
  // when some byte has no edge or several.
  int32_t walk_bytes(int32_t node, std::string_view bytes) const;
  // Whether the whole text matches (tests).
  bool matches(std::string_view text) const;
  bool matches_prefix(std::string_view text) const;  // some continuation would match
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }

 private:
  struct ByteEdge {
    ByteSet set;
    int32_t target;
  };
  struct CallEdge {
    int32_t rule, target;
    bool operator==(const CallEdge&) const = default;
  };
  struct Node {
    int32_t rule = 0;
    bool final = false;      // the rule may end here
    bool completes = false;  // ... possibly after calls to rules that match nothing
    std::vector<ByteEdge> bytes;
    std::vector<CallEdge> calls;
    void add_call(const CallEdge& c) {  // once
      if (std::find(calls.begin(), calls.end(), c) == calls.end()) calls.push_back(c);
    }
  };
  struct Rule {
    std::string name;
    GExpr body;
    int32_t start = -1, end = -1;  // its nodes are [start, end)
    CountedString counted;
  };
  void step_rec(GrammarStack& stack, uint8_t b, std::vector<GrammarStack>& out, size_t& count,
                bool* outside, int budget) const;
  void compile_rule(int32_t rule);
  // Charges `steps` to the budget of the compile() running; throws past it or when cancelled.
  void spend(int64_t steps);
  // Drops byte edges and calls that lead where the rule can no longer end, and the calls of
  // rules that match nothing; sets productive_. Throws when the root matches nothing.
  void remove_unproductive();
  // Throws when a rule can call itself before consuming a byte.
  void refuse_left_recursion();
  // Folds the rule's nodes that behave alike into one (they would share every table anyway,
  // but under different node shapes each would be walked on its own).
  void merge_equivalent_nodes(int32_t rule);
  void compute_shapes();
  void index_deterministic_nodes();
  void compute_follow();

  std::vector<Rule> rules_;
  std::vector<Node> nodes_;
  std::vector<uint64_t> shapes_;  // per rule
  std::vector<ByteSet> follow_;   // per rule
  std::vector<char> productive_;  // per rule
  // The compile() running: its budget and the steps spent.
  const GrammarBudget* budget_ = nullptr;
  int64_t work_ = 0;
  // deterministic_step's tables: per node, its slot (-1: not deterministic); per slot, which
  // of the node's byte edges takes each byte (kNoEdgeIndex: none). 256 bytes a node.
  static constexpr uint8_t kNoEdgeIndex = 0xff;
  std::vector<int32_t> deterministic_slot_;
  std::vector<uint8_t> edge_of_byte_;
  int32_t root_ = 0;
};

}  // namespace blend
