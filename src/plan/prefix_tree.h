// The resource-aware prefix tree of BlendServe §5.1: a compressed radix trie over prompt token
// ids whose leaves are the requests of an offline batch. Inner nodes are prompt segments shared
// by every request below them; a request whose prompt ends inside or at a node hangs below it as
// a leaf with an empty segment. Children keep the order their first request arrived in, so a
// depth-first walk of an unsorted tree is the DFS baseline order.
//
// Building is linear in the prompt tokens (one hash probe per edge followed); 400K prompts of
// ~1K tokens build in about 0.6 s on one core (docs/BENCHMARKS.md, "Planner").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace blend::plan {

using TokenId = int32_t;
using ModelId = int32_t;  // as core/types.h

// One request of the batch as the planner sees it.
struct PlanRequest {
  std::string id;               // custom_id
  std::vector<TokenId> prompt;  // token ids
  double output_tokens = 0;     // estimated (or known) output length d
  bool output_known = false;    // ignore_eos + max_tokens: d is exact
  double output_spread = 0;     // standard deviation of the lengths d was estimated from
  // The engine's model it runs on: requests of different models share no prefix (their KV is
  // never shared), so the tree keeps each model's prompts in subtrees of their own.
  ModelId model = 0;
};

struct PrefixNode {
  int32_t parent = -1;
  int32_t request = -1;        // >= 0 for a leaf: index into the request list
  int32_t segment_owner = -1;  // request whose prompt holds this node's tokens
  int32_t segment_begin = 0;   // [begin, begin + length) of that prompt
  int32_t segment_length = 0;  // 0 for leaves and the root
  int32_t depth_tokens = 0;    // prompt tokens from the root to the end of this node
  std::vector<int32_t> children;
};

class PrefixTree {
 public:
  // Builds the trie of `requests` (kept by reference: they must outlive the tree).
  explicit PrefixTree(const std::vector<PlanRequest>& requests);

  static constexpr int32_t kRoot = 0;
  const std::vector<PlanRequest>& requests() const { return *requests_; }
  const PrefixNode& node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
  PrefixNode& mutable_node(int32_t i) { return nodes_[static_cast<size_t>(i)]; }
  int32_t size() const { return static_cast<int32_t>(nodes_.size()); }
  int32_t leaf_of(int32_t request) const { return leaf_of_[static_cast<size_t>(request)]; }
  std::span<const TokenId> segment(int32_t node) const;

  // Prompt tokens of all requests, and the tokens computed when every node is computed once
  // (the sum of segment lengths): the optimal sharing ratio s_o = 1 - unique / total that a
  // DFS order reaches with an unlimited prefix cache (BlendServe §3.3, §5.1).
  int64_t total_prompt_tokens() const { return total_prompt_tokens_; }
  int64_t unique_prompt_tokens() const { return unique_prompt_tokens_; }
  double optimal_sharing_ratio() const;

  // Requests in depth-first order of the tree as it stands (children in their current order).
  std::vector<int32_t> dfs_order() const;
  // Nodes in depth-first pre-order from `from`.
  std::vector<int32_t> preorder(int32_t from = kRoot) const;

 private:
  const std::vector<PlanRequest>* requests_;
  std::vector<PrefixNode> nodes_;
  std::vector<int32_t> leaf_of_;
  int64_t total_prompt_tokens_ = 0;
  int64_t unique_prompt_tokens_ = 0;
};

}  // namespace blend::plan
