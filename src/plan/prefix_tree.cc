#include "plan/prefix_tree.h"

#include <unordered_map>

#include "core/error.h"

namespace blend::plan {
namespace {

uint64_t child_key(int32_t node, TokenId first_token) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) |
         static_cast<uint32_t>(first_token);
}

// The key of a child of `node` for a request of `model`: below the root the path already tells
// models apart; at the root, model m > 0 keys its edges under a parent id no node has (negative),
// so no two models share a root child. Model 0 keys as a one-model tree always did.
uint64_t edge_key(int32_t node, ModelId model, TokenId first_token) {
  return child_key(node == PrefixTree::kRoot && model > 0 ? -1 - model : node, first_token);
}

}  // namespace

PrefixTree::PrefixTree(const std::vector<PlanRequest>& requests) : requests_(&requests) {
  if (requests.size() >= static_cast<size_t>(INT32_MAX / 2))
    throw Error("planner: too many requests");
  nodes_.reserve(requests.size() * 3 + 1);
  nodes_.emplace_back();  // root
  leaf_of_.resize(requests.size());
  // (node, first token of a child's segment) -> child; leaves (empty segments) are not keyed.
  std::unordered_map<uint64_t, int32_t> edges;
  edges.reserve(requests.size() * 2);

  auto add_node = [&](int32_t parent, int32_t owner, int32_t begin, int32_t length) {
    PrefixNode n;
    n.parent = parent;
    n.segment_owner = owner;
    n.segment_begin = begin;
    n.segment_length = length;
    n.depth_tokens = nodes_[static_cast<size_t>(parent)].depth_tokens + length;
    nodes_.push_back(std::move(n));
    const int32_t id = static_cast<int32_t>(nodes_.size() - 1);
    nodes_[static_cast<size_t>(parent)].children.push_back(id);
    return id;
  };

  for (size_t r = 0; r < requests.size(); ++r) {
    const std::vector<TokenId>& prompt = requests[r].prompt;
    const int32_t owner = static_cast<int32_t>(r);
    const int32_t length = static_cast<int32_t>(prompt.size());
    const ModelId model = requests[r].model;
    total_prompt_tokens_ += length;
    int32_t at = kRoot;
    int32_t pos = 0;
    while (pos < length) {
      auto it = edges.find(edge_key(at, model, prompt[static_cast<size_t>(pos)]));
      if (it == edges.end()) {  // a new branch holds the rest of the prompt
        const int32_t child = add_node(at, owner, pos, length - pos);
        edges.emplace(edge_key(at, model, prompt[static_cast<size_t>(pos)]), child);
        unique_prompt_tokens_ += length - pos;
        at = child;
        pos = length;
        break;
      }
      const int32_t child = it->second;
      const PrefixNode& c = nodes_[static_cast<size_t>(child)];
      const TokenId* seg =
          requests[static_cast<size_t>(c.segment_owner)].prompt.data() + c.segment_begin;
      const int32_t limit = std::min(c.segment_length, length - pos);
      int32_t k = 1;  // the first token matched through the hash key
      while (k < limit && seg[k] == prompt[static_cast<size_t>(pos + k)]) ++k;
      if (k == c.segment_length) {
        at = child;
        pos += k;
        continue;
      }
      // Split the child's segment after k tokens: parent -> middle -> child.
      const int32_t middle = static_cast<int32_t>(nodes_.size());
      it->second = middle;  // before any insertion can rehash and invalidate `it`
      {
        PrefixNode m;
        m.parent = at;
        m.segment_owner = c.segment_owner;
        m.segment_begin = c.segment_begin;
        m.segment_length = k;
        m.depth_tokens = nodes_[static_cast<size_t>(at)].depth_tokens + k;
        m.children.push_back(child);
        const TokenId rest_first = seg[k];
        nodes_.push_back(std::move(m));
        PrefixNode& moved = nodes_[static_cast<size_t>(child)];  // re-fetch: push_back may move
        moved.parent = middle;
        moved.segment_begin += k;
        moved.segment_length -= k;
        edges.emplace(child_key(middle, rest_first), child);
      }
      for (int32_t& sibling : nodes_[static_cast<size_t>(at)].children)
        if (sibling == child) sibling = middle;
      at = middle;
      pos += k;
    }
    const int32_t leaf = add_node(at, owner, length, 0);
    nodes_[static_cast<size_t>(leaf)].request = owner;
    leaf_of_[r] = leaf;
  }
}

std::span<const TokenId> PrefixTree::segment(int32_t node) const {
  const PrefixNode& n = nodes_[static_cast<size_t>(node)];
  if (n.segment_length == 0) return {};
  return std::span<const TokenId>(
      (*requests_)[static_cast<size_t>(n.segment_owner)].prompt.data() + n.segment_begin,
      static_cast<size_t>(n.segment_length));
}

double PrefixTree::optimal_sharing_ratio() const {
  if (total_prompt_tokens_ == 0) return 0.0;
  return 1.0 -
         static_cast<double>(unique_prompt_tokens_) / static_cast<double>(total_prompt_tokens_);
}

std::vector<int32_t> PrefixTree::preorder(int32_t from) const {
  std::vector<int32_t> out;
  std::vector<int32_t> stack{from};
  while (!stack.empty()) {
    const int32_t n = stack.back();
    stack.pop_back();
    out.push_back(n);
    const std::vector<int32_t>& ch = nodes_[static_cast<size_t>(n)].children;
    for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back(*it);
  }
  return out;
}

std::vector<int32_t> PrefixTree::dfs_order() const {
  std::vector<int32_t> order;
  order.reserve(leaf_of_.size());
  for (int32_t n : preorder(kRoot))
    if (nodes_[static_cast<size_t>(n)].request >= 0)
      order.push_back(nodes_[static_cast<size_t>(n)].request);
  return order;
}

}  // namespace blend::plan
