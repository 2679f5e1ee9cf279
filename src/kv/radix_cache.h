// RadixCache — the runtime prefix cache (SGLang's RadixAttention at page granularity; BlendServe
// App. A.2 "Runtime prefix tree"). A tree over token ids whose nodes are KV pages: the path from
// the root to a node spells the tokens whose K/V that node's page (and its ancestors' pages)
// hold. Sequences leave their computed full pages in the tree while they run and their last,
// partly filled page when they finish; a new sequence reuses the longest cached prefix and
// prefills only the rest.
//
// Promises:
//  - Only computed KV enters the tree. The tree holds one reference on each of its pages
//    (PagePool::set_cached marks them), so a page is freed only after the tree lets go of it.
//  - A page some sequence still holds (refcount > 1) is never evicted. Eviction takes idle
//    leaves in least-recently-used order; a parent whose last child went becomes a leaf.
//  - match() is token-granular: whole pages are shared; a last page that matches only in part
//    (a page some sequence has filled only in part, or a full page the new prompt leaves midway) is
//    named as a copy-on-write source: the caller copies it into a private page and overwrites the
//    rest.
//  - Intra-batch sharing (BlendServe A.2): a running sequence claims the prompt pages it is
//    about to compute. A new sequence to which another running sequence's claim would give more
//    tokens than the tree has now is told to wait (`claimed_by_other`), so a prefix shared by
//    requests admitted together is
//    computed once and then served from the tree.
//  - KV tiers (optional, NanoFlow §4.4/§5.4): with a KvTiers and a KvPageIo, eviction does not
//    drop idle pages but gathers runs of them (a leaf and its single-child ancestors) into one
//    buffer for the host tier; their nodes stay in the tree, offloaded. A match through offloaded
//    nodes brings them back into fresh device pages when the cost model says loading is cheaper
//    than recomputing (`recompute_seconds_per_token`); otherwise the match stops there. Device
//    resident nodes always form a subtree at the root. Since a preempted sequence's pages stay in
//    the tree, this is also swap-out/swap-in preemption: the scheduler's choice between
//    recomputing and swapping is this cost comparison.
//  - Models (engine.h): each model has a tree of its own, so two models never share KV for the
//    same tokens; every call names the model (0 when the engine has one).
//  - Bookkeeping is per sequence id; forget(seq) drops a sequence's claims and cursor (call it
//    when the sequence finishes, is preempted or cancelled).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/types.h"
#include "kv/kv_tiers.h"
#include "kv/page_pool.h"

namespace blend {

struct PrefixMatch {
  std::vector<PageId> pages;      // full pages of the prefix, retained for the caller
  PageId partial_page = -1;       // retained for the caller when >= 0: copy it, then release it
  int32_t partial_tokens = 0;     // leading tokens of partial_page that extend the match
  bool claimed_by_other = false;  // a running sequence is computing the next page right now

  int32_t num_tokens(int32_t page_size) const {
    return static_cast<int32_t>(pages.size()) * page_size + partial_tokens;
  }
};

// Moves pages' K/V between the device's cache and one contiguous buffer (the engine adapts its
// backend to this).
class KvPageIo {
 public:
  virtual ~KvPageIo() = default;
  virtual void read_pages(std::span<const PageId> pages, std::byte* out) = 0;
  virtual void write_pages(std::span<const PageId> pages, const std::byte* in) = 0;
};

struct RadixCacheTiers {
  KvTiers* tiers = nullptr;  // null = evicted pages are dropped
  KvPageIo* io = nullptr;
  double recompute_seconds_per_token = 0;  // what a cache miss costs, per token
  int32_t max_run_pages = 64;              // longest run moved as one buffer
};

class RadixCache {
 public:
  // Allocates `count` fresh device pages into `out` (all or nothing), evicting as it must.
  using Allocate = std::function<bool(int64_t count, std::vector<PageId>& out)>;

  explicit RadixCache(PagePool& pool, RadixCacheTiers tiers = {});
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // Longest cached prefix of tokens[0, max_tokens), or `claimed_by_other` (and nothing
  // retained) when a sequence other than `self` is computing a longer one. Marks the path as
  // recently used.
  // `allocate` gives device pages for offloaded pages worth loading back (may be empty: then
  // the match stops at the first offloaded page).
  PrefixMatch match(std::span<const TokenId> tokens, int32_t max_tokens, SeqId self,
                    const Allocate& allocate = {}, ModelId model = 0);

  // Claims the pages of tokens[0, prompt_len) from page `first_page` on for `seq`.
  void claim(SeqId seq, std::span<const TokenId> tokens, int32_t first_page, int32_t prompt_len,
             ModelId model = 0);

  // Adds the sequence's computed pages (positions [0, num_computed)) to the tree, the partly
  // filled last one included. Where the tree already holds the same full page in another page,
  // the sequence switches to the tree's page and releases its own (`block_table` is updated),
  // so duplicates do not pile up.
  void insert(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed,
              std::vector<PageId>& block_table, ModelId model = 0);
  // insert(), then forget(): call when the sequence finishes, before it releases its pages.
  void insert_finished(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed,
                       std::vector<PageId>& block_table, ModelId model = 0);
  void forget(SeqId seq);

  // Evicts idle pages, least recently used leaves first, until `pages` were freed or no idle
  // page is left. Returns the number freed.
  int64_t evict(int64_t pages);

  int64_t num_nodes() const { return num_nodes_; }
  int64_t num_evicted() const { return num_evicted_; }  // device pages dropped or offloaded
  int64_t num_offloaded_pages() const { return num_offloaded_; }
  int64_t num_loaded_pages() const { return num_loaded_; }
  // Walks the tree and aborts when a node's page is not marked cached, a child's tokens do not
  // extend its parent's path, or the leaf set is out of date. For tests.
  void check_invariants() const;

 private:
  struct Node;
  struct Cursor {          // where a running sequence's inserted path ends
    Node* node = nullptr;  // its last full page in the tree (or the root)
    int32_t pages = 0;     // full pages inserted
    Node* tail = nullptr;  // its partly filled page in the tree, which it keeps extending
  };

  Node* find_child(Node* parent, std::span<const TokenId> page_tokens) const;
  // Calls visit(child, k) for the children sharing k >= max(at_least, 1) leading tokens with
  // `tokens`, nearest in sort order first, while it returns true; `visit` may raise at_least.
  template <typename Visit>
  void for_children_sharing(Node* parent, std::span<const TokenId> tokens, const size_t& at_least,
                            Visit visit) const;
  void set_tokens(Node* node, std::span<const TokenId> tokens);  // a tail page grew
  void offload_chain(Node* leaf);
  void make_resident(Node* node, PageId page);  // takes over one reference on `page`
  void leave_entry(Node* node);
  void remove_subtree(Node* node);  // a node with no device-resident descendants
  void mark_lost(const std::vector<KvTiers::EntryId>& dropped);
  void load_path(std::vector<Node*>& offloaded, const Allocate& allocate, PrefixMatch& m);
  Node* add_child(Node* parent, std::span<const TokenId> page_tokens, PageId page);
  void remove_leaf(Node* leaf);
  // Marks `node` used now. Only device leaves are ordered by use, and a node's use counts for
  // its ancestors only once it stops being a device child (absorb): a touch costs O(1), not
  // O(depth), and a 16K-token sequence no longer walks its thousand pages per new page.
  void touch(Node* node);
  void set_last_access(Node* node, uint64_t when);
  void absorb(Node* parent, const Node* child);  // parent keeps the child's last use
  void set_leaf(Node* node, bool is_leaf);
  void drop_claims(SeqId seq);

  PagePool& pool_;
  int32_t page_size_;
  // One tree per model, made on first use; roots hold no page and have no parent.
  std::vector<std::unique_ptr<Node>> roots_;
  Node* root(ModelId model);
  int64_t num_nodes_ = 0;
  uint64_t serial_ = 0;
  int64_t num_evicted_ = 0;
  int64_t num_offloaded_ = 0;
  int64_t num_loaded_ = 0;
  RadixCacheTiers tiers_;
  // Offloaded nodes of each tier entry; the entry is erased when the last one leaves it.
  std::unordered_map<KvTiers::EntryId, std::vector<Node*>> entry_nodes_;
  uint64_t clock_ = 0;
  std::set<std::pair<uint64_t, Node*>> leaves_;  // (last access, node): eviction order
  std::unordered_map<SeqId, Cursor> cursors_;
  struct Claim {
    SeqId seq;
    std::vector<TokenId> tokens;  // the prompt tokens it will compute in that page
  };
  // Hash chain of the full pages before a page -> the running sequences that will fill it.
  std::unordered_map<uint64_t, std::vector<Claim>> claims_;
  std::unordered_map<SeqId, std::vector<uint64_t>> claims_by_seq_;
};

// Tokens a prefix cache with unlimited memory could serve, over a set of prompts processed in
// the best order (a DFS of their trie, BlendServe §3 s_o): each prompt shares with its nearest
// neighbour in lexicographic order, at most all but its last token (one token is always
// computed to produce logits).
int64_t optimal_shared_tokens(std::vector<std::span<const TokenId>> prompts);

}  // namespace blend
