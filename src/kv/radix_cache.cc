#include "kv/radix_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>

namespace blend {

namespace {
// Children in lexicographic order of their tokens (ties by creation): an exact page is found in
// O(log n), and the children sharing the longest prefix with some tokens sit next to where those
// tokens would go. A hash of the first token was not enough: the page where thousands of
// few-shot prompts leave their shared prefix starts with the same tokens in all of them, and
// every lookup scanned them all (a 400K-request simulation spent minutes there).
struct ChildOrder {
  using is_transparent = void;
  static bool less(std::span<const TokenId> a, std::span<const TokenId> b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }
  template <typename N>
  bool operator()(const N* a, const N* b) const {
    if (less(a->tokens, b->tokens)) return true;
    if (less(b->tokens, a->tokens)) return false;
    return a->serial < b->serial;
  }
  template <typename N>
  bool operator()(const N* a, std::span<const TokenId> b) const {
    return less(a->tokens, b);
  }
  template <typename N>
  bool operator()(std::span<const TokenId> a, const N* b) const {
    return less(a, b->tokens);
  }
};
}  // namespace

struct RadixCache::Node {
  Node* parent = nullptr;
  PageId page = -1;
  // This page's tokens: page_size of them, fewer for a partial leaf. Change them only through
  // set_tokens(), which keeps the parent's `ordered` index sorted.
  std::vector<TokenId> tokens;
  uint64_t serial = 0;  // creation order: ties in `ordered`, independent of addresses
  std::vector<std::unique_ptr<Node>> children;  // owns them; unordered
  size_t index_in_parent = 0;
  std::set<Node*, ChildOrder> ordered;  // the same children, by tokens
  uint64_t last_access = 0;
  bool in_leaves = false;       // device resident with no device-resident children
  int32_t device_children = 0;  // children whose page is on the device
  KvTiers::EntryId entry = 0;   // offloaded: the tier entry holding this page (page < 0)
  int32_t entry_index = 0;      // page index within the entry

  bool resident() const { return page >= 0; }
  bool lost() const { return page < 0 && entry == 0; }  // its tier entry was dropped
};

namespace {

uint64_t hash_page(uint64_t h, std::span<const TokenId> tokens) {
  // FNV-1a over the token ids, chained from the previous page's hash.
  h ^= 0x9e3779b97f4a7c15ull;
  for (TokenId t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Where a model's claim hash chain starts: model 0's is 0, so one model hashes as it always did.
uint64_t claim_seed(ModelId model) {
  return static_cast<uint64_t>(model) * 0x9e3779b97f4a7c15ull;
}

size_t common_prefix(std::span<const TokenId> a, std::span<const TokenId> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "RadixCache: %s\n", what);
  std::abort();
}

}  // namespace

RadixCache::RadixCache(PagePool& pool, RadixCacheTiers tiers)
    : pool_(pool), page_size_(pool.page_size()), tiers_(tiers) {
  if (tiers_.tiers && (!tiers_.io || !tiers_.tiers->enabled())) tiers_.tiers = nullptr;
}

RadixCache::~RadixCache() {
  // Let go of every cached page so the pool balances (pages still held by sequences stay).
  std::vector<Node*> stack;
  for (auto& r : roots_) stack.push_back(r.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& c : n->children) stack.push_back(c.get());
    if (n->parent && n->resident()) {
      pool_.set_cached(n->page, false);
      pool_.release(n->page);
    }
  }
}

RadixCache::Node* RadixCache::root(ModelId model) {
  if (model < 0) std::abort();
  while (roots_.size() <= static_cast<size_t>(model)) roots_.push_back(std::make_unique<Node>());
  return roots_[static_cast<size_t>(model)].get();
}

RadixCache::Node* RadixCache::find_child(Node* parent, std::span<const TokenId> page_tokens) const {
  const auto it = parent->ordered.lower_bound(page_tokens);
  if (it == parent->ordered.end() || !std::ranges::equal((*it)->tokens, page_tokens))
    return nullptr;
  return *it;
}

template <typename Visit>
void RadixCache::for_children_sharing(Node* parent, std::span<const TokenId> tokens,
                                      const size_t& at_least, Visit visit) const {
  // In sorted order the common prefix with `tokens` only shrinks away from their position, so
  // each direction stops at the first child sharing too little.
  const auto start = parent->ordered.lower_bound(tokens);
  for (auto it = start; it != parent->ordered.end(); ++it) {
    const size_t k = common_prefix((*it)->tokens, tokens);
    if (k < std::max<size_t>(at_least, 1)) break;
    if (!visit(*it, k)) return;
  }
  for (auto it = start; it != parent->ordered.begin();) {
    --it;
    const size_t k = common_prefix((*it)->tokens, tokens);
    if (k < std::max<size_t>(at_least, 1)) break;
    if (!visit(*it, k)) return;
  }
}

void RadixCache::set_tokens(Node* node, std::span<const TokenId> tokens) {
  auto& ordered = node->parent->ordered;
  ordered.erase(node);
  node->tokens.assign(tokens.begin(), tokens.end());
  ordered.insert(node);
}

void RadixCache::set_leaf(Node* node, bool is_leaf) {
  if (!node->parent || node->in_leaves == is_leaf) return;  // a root is never a leaf
  if (is_leaf)
    leaves_.emplace(node->last_access, node);
  else
    leaves_.erase({node->last_access, node});
  node->in_leaves = is_leaf;
}

void RadixCache::set_last_access(Node* node, uint64_t when) {
  if (node->in_leaves) {
    leaves_.erase({node->last_access, node});
    leaves_.emplace(when, node);
  }
  node->last_access = when;
}

void RadixCache::absorb(Node* parent, const Node* child) {
  if (parent->parent && child->last_access > parent->last_access)
    set_last_access(parent, child->last_access);
}

void RadixCache::touch(Node* node) {
  // The last use of a subtree is what its root needs once it is a device leaf itself. A device
  // child hands its own to the parent when it stops being one (remove_leaf, offload_chain), so
  // the ancestors learn of a touch then. An offloaded node has already stopped: the resident
  // ancestors above it learn now.
  const uint64_t now = ++clock_;
  Node* n = node;
  set_last_access(n, now);
  while (n->parent && !n->resident()) {
    n = n->parent;
    if (n->parent) set_last_access(n, now);
  }
}

RadixCache::Node* RadixCache::add_child(Node* parent, std::span<const TokenId> page_tokens,
                                        PageId page) {
  auto child = std::make_unique<Node>();
  Node* c = child.get();
  c->parent = parent;
  c->page = page;
  c->tokens.assign(page_tokens.begin(), page_tokens.end());
  c->serial = ++serial_;
  c->index_in_parent = parent->children.size();
  parent->children.push_back(std::move(child));
  parent->ordered.insert(c);
  pool_.retain(page);
  pool_.set_cached(page, true);
  ++num_nodes_;
  ++parent->device_children;
  set_leaf(parent, false);
  set_leaf(c, true);
  touch(c);
  return c;
}

void RadixCache::remove_leaf(Node* leaf) {
  Node* parent = leaf->parent;
  set_leaf(leaf, false);
  absorb(parent, leaf);
  if (leaf->resident()) {
    pool_.set_cached(leaf->page, false);
    pool_.release(leaf->page);
    --parent->device_children;
  } else {
    leave_entry(leaf);
  }
  parent->ordered.erase(leaf);
  auto& siblings = parent->children;
  const size_t i = leaf->index_in_parent;
  if (i + 1 != siblings.size()) {
    siblings[i] = std::move(siblings.back());
    siblings[i]->index_in_parent = i;
  }
  siblings.pop_back();  // destroys `leaf`
  --num_nodes_;
  if (parent->resident() && parent->device_children == 0) set_leaf(parent, true);
}

void RadixCache::remove_subtree(Node* node) {
  while (!node->children.empty()) remove_subtree(node->children.back().get());
  remove_leaf(node);
}

void RadixCache::leave_entry(Node* node) {
  if (node->entry == 0) return;
  auto it = entry_nodes_.find(node->entry);
  if (it != entry_nodes_.end()) {
    std::erase(it->second, node);
    if (it->second.empty()) {
      tiers_.tiers->erase(it->first);
      entry_nodes_.erase(it);
    }
  }
  node->entry = 0;
}

void RadixCache::mark_lost(const std::vector<KvTiers::EntryId>& dropped) {
  for (KvTiers::EntryId id : dropped) {
    auto it = entry_nodes_.find(id);
    if (it == entry_nodes_.end()) continue;
    for (Node* n : it->second) n->entry = 0;  // removed lazily when a match walks into it
    entry_nodes_.erase(it);
  }
}

void RadixCache::make_resident(Node* node, PageId page) {
  leave_entry(node);
  node->page = page;
  pool_.set_cached(page, true);
  Node* parent = node->parent;
  ++parent->device_children;
  set_leaf(parent, false);
  set_leaf(node, node->device_children == 0);
}

// Gathers an idle leaf and its idle single-child ancestors into one buffer for the tiers
// (NanoFlow §4.4: KV moves in contiguous runs, not page by page); the nodes stay, offloaded.
void RadixCache::offload_chain(Node* leaf) {
  std::vector<Node*> chain{leaf};
  for (Node* p = leaf->parent;
       p->parent && p->resident() && p->device_children == 1 && pool_.refcount(p->page) == 1 &&
       static_cast<int32_t>(chain.size()) < tiers_.max_run_pages;
       p = p->parent)
    chain.push_back(p);
  std::reverse(chain.begin(), chain.end());  // root-ward first: the entry holds them in order
  std::vector<PageId> pages;
  for (Node* n : chain) pages.push_back(n->page);
  KvTiers::Blob blob =
      tiers_.tiers->make_blob(pages.size() * static_cast<size_t>(tiers_.tiers->buffer_bytes()));
  tiers_.io->read_pages(pages, blob.data());
  std::vector<KvTiers::EntryId> dropped;
  const KvTiers::EntryId id =
      tiers_.tiers->put(std::move(blob), static_cast<int32_t>(pages.size()), dropped);
  auto& members = entry_nodes_[id];
  for (size_t i = chain.size(); i-- > 0;) {  // bottom-up, so each parent loses its last child
    Node* n = chain[i];
    set_leaf(n, false);
    pool_.set_cached(n->page, false);
    pool_.release(n->page);
    n->page = -1;
    n->entry = id;
    n->entry_index = static_cast<int32_t>(i);
    members.push_back(n);
    absorb(n->parent, n);
    if (--n->parent->device_children == 0) set_leaf(n->parent, n->parent->resident());
  }
  num_offloaded_ += static_cast<int64_t>(chain.size());
  mark_lost(dropped);  // may include `id` itself when the run fits no tier
}

// Brings the offloaded nodes of a matched path back into device pages, in order, as far as
// the cost model, the tiers and the allocator allow; appends their pages to m.pages (retained
// for the caller) and truncates `offloaded` to what was loaded.
void RadixCache::load_path(std::vector<Node*>& offloaded, const Allocate& allocate,
                           PrefixMatch& m) {
  if (offloaded.empty()) return;
  if (!allocate || !tiers_.tiers) {
    offloaded.clear();
    return;
  }
  // Cost model: load time of the entries touched vs recomputing the tokens.
  std::map<KvTiers::EntryId, int64_t> pages_of;
  for (Node* n : offloaded) ++pages_of[n->entry];
  double load = 0;
  for (auto [id, count] : pages_of) load += tiers_.tiers->load_seconds(id, count);
  const double recompute = tiers_.recompute_seconds_per_token * static_cast<double>(page_size_) *
                           static_cast<double>(offloaded.size());
  if (load >= recompute) {
    offloaded.clear();
    return;
  }
  // Held, not copied: allocating below may evict and move or drop these entries.
  std::map<KvTiers::EntryId, std::shared_ptr<const KvTiers::Blob>> blobs;
  for (size_t i = 0; i < offloaded.size(); ++i) {
    const KvTiers::EntryId id = offloaded[i]->entry;
    if (blobs.count(id)) continue;
    auto data = tiers_.tiers->read(id);
    if (!data) {
      offloaded.resize(i);
      break;
    }
    blobs.emplace(id, std::move(data));
  }
  // Entry ids are remembered now: allocating may evict, and dropped entries reset node->entry.
  std::vector<std::pair<KvTiers::EntryId, int32_t>> where;
  for (Node* n : offloaded) where.emplace_back(n->entry, n->entry_index);
  std::vector<PageId> pages;
  if (offloaded.empty() || !allocate(static_cast<int64_t>(offloaded.size()), pages)) {
    offloaded.clear();
    return;
  }
  const auto buffer_bytes = static_cast<size_t>(tiers_.tiers->buffer_bytes());
  for (size_t i = 0; i < offloaded.size();) {
    // One write per run of consecutive pages of one entry.
    size_t j = i + 1;
    while (j < offloaded.size() && where[j].first == where[i].first &&
           where[j].second == where[j - 1].second + 1)
      ++j;
    // A backend whose pages hold nothing moves empty buffers (KvTiers::buffer_bytes 0).
    const std::byte* src = buffer_bytes == 0
                               ? nullptr
                               : blobs.at(where[i].first)->data() +
                                     static_cast<size_t>(where[i].second) * buffer_bytes;
    tiers_.io->write_pages(std::span<const PageId>(pages).subspan(i, j - i), src);
    i = j;
  }
  for (size_t i = 0; i < offloaded.size(); ++i) {
    make_resident(offloaded[i], pages[i]);  // the tree takes the allocation's reference
    pool_.retain(pages[i]);                 // and the caller one more
    m.pages.push_back(pages[i]);
  }
  num_loaded_ += static_cast<int64_t>(offloaded.size());
}

PrefixMatch RadixCache::match(std::span<const TokenId> tokens, int32_t max_tokens, SeqId self,
                              const Allocate& allocate, ModelId model) {
  PrefixMatch m;
  const size_t limit = std::min(tokens.size(), static_cast<size_t>(std::max(max_tokens, 0)));
  const size_t ps = static_cast<size_t>(page_size_);
  std::vector<Node*> path;       // matched full pages: resident ones, then offloaded ones
  std::vector<uint64_t> hashes;  // hash chain of the path up to each node
  std::vector<Node*> offloaded;
  Node* const tree = root(model);
  Node* node = tree;
  uint64_t h = claim_seed(model);
  while ((path.size() + 1) * ps <= limit) {
    const auto page_tokens = tokens.subspan(path.size() * ps, ps);
    Node* child = find_child(node, page_tokens);
    if (!child) break;
    if (child->lost()) {  // its KV is gone from every tier: forget it and what hangs below
      remove_subtree(child);
      break;
    }
    h = hash_page(h, page_tokens);
    path.push_back(child);
    hashes.push_back(h);
    if (child->resident())
      m.pages.push_back(child->page);
    else
      offloaded.push_back(child);
    node = child;
  }
  // Hold the resident part before anything can be evicted, then bring back what is worth it.
  for (PageId p : m.pages) pool_.retain(p);
  load_path(offloaded, allocate, m);
  path.resize(m.pages.size());  // the path ends at its last page now on the device
  node = path.empty() ? tree : path.back();
  h = path.empty() ? claim_seed(model) : hashes[path.size() - 1];
  const size_t pos = path.size() * ps;

  // Copy-on-write tail: the resident child sharing the most leading tokens with the rest.
  Node* partial = nullptr;
  size_t best = 0;
  const auto rest = tokens.subspan(pos, std::min(ps, limit - pos));
  if (!rest.empty()) {
    size_t longer = 1;  // only a resident child sharing more than `best` can do better
    for_children_sharing(node, rest, longer, [&](Node* c, size_t k) {
      if (c->resident() && k > best) best = k, partial = c, longer = k + 1;
      return true;
    });
  }
  // Intra-batch sharing: a running sequence is about to compute more of this page than the
  // tree holds; waiting for it beats computing the same tokens twice.
  if (auto it = claims_.find(h); !rest.empty() && it != claims_.end()) {
    for (const Claim& c : it->second)
      if (c.seq != self && common_prefix(c.tokens, rest) > best) m.claimed_by_other = true;
  }
  if (m.claimed_by_other) {
    for (PageId p : m.pages) pool_.release(p);
    m.pages.clear();
    return m;
  }
  if (partial) {
    m.partial_page = partial->page;
    m.partial_tokens = static_cast<int32_t>(best);
    pool_.retain(partial->page);
    touch(partial);
  } else if (node != tree) {
    touch(node);
  }
  return m;
}

void RadixCache::claim(SeqId seq, std::span<const TokenId> tokens, int32_t first_page,
                       int32_t prompt_len, ModelId model) {
  const size_t ps = static_cast<size_t>(page_size_);
  const size_t end = std::min(tokens.size(), static_cast<size_t>(std::max(prompt_len, 0)));
  uint64_t h = claim_seed(model);  // hash of the full pages before page i
  for (size_t i = 0; i * ps < end; ++i) {
    const auto page_tokens = tokens.subspan(i * ps, std::min(ps, end - i * ps));
    if (i >= static_cast<size_t>(first_page)) {
      claims_[h].push_back({seq, {page_tokens.begin(), page_tokens.end()}});
      claims_by_seq_[seq].push_back(h);
    }
    h = hash_page(h, page_tokens);
  }
}

void RadixCache::drop_claims(SeqId seq) {
  auto it = claims_by_seq_.find(seq);
  if (it == claims_by_seq_.end()) return;
  for (uint64_t h : it->second) {
    auto c = claims_.find(h);
    if (c == claims_.end()) continue;
    std::erase_if(c->second, [seq](const Claim& x) { return x.seq == seq; });
    if (c->second.empty()) claims_.erase(c);
  }
  claims_by_seq_.erase(it);
}

void RadixCache::insert(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed,
                        std::vector<PageId>& block_table, ModelId model) {
  Cursor& c = cursors_[seq];
  if (!c.node) c.node = root(model);
  const size_t ps = static_cast<size_t>(page_size_);
  const int32_t full =
      std::min<int32_t>(num_computed / page_size_, static_cast<int32_t>(block_table.size()));
  while (c.pages < full) {
    const size_t i = static_cast<size_t>(c.pages);
    const auto page_tokens = tokens.subspan(i * ps, ps);
    Node* child = nullptr;
    if (c.tail && c.tail->page == block_table[i]) {
      // Our own partly filled page, now full: it keeps its place in the tree.
      set_tokens(c.tail, page_tokens);
      child = c.tail;
    } else if ((child = find_child(c.node, page_tokens)) == nullptr) {
      child = add_child(c.node, page_tokens, block_table[i]);
    } else if (!child->resident()) {
      // Offloaded (or lost) copy of what we just computed: ours becomes the device copy.
      pool_.retain(block_table[i]);
      make_resident(child, block_table[i]);
      touch(child);
    } else if (child->page != block_table[i]) {
      // Same tokens computed twice (admitted before the other copy was cached): keep the
      // tree's page, free ours.
      pool_.retain(child->page);
      pool_.release(block_table[i]);
      block_table[i] = child->page;
    }
    c.tail = nullptr;
    c.node = child;
    ++c.pages;
  }
  // The computed part of the page being filled is shared too (copy-on-write sources only use
  // slots that are already computed, and the owner never rewrites them).
  const int32_t tail = num_computed - c.pages * page_size_;
  if (tail <= 0 || static_cast<size_t>(c.pages) >= block_table.size()) return;
  const auto rest = tokens.subspan(static_cast<size_t>(c.pages) * ps, static_cast<size_t>(tail));
  if (c.tail) {
    set_tokens(c.tail, rest);
    return;
  }
  // A child that already starts with these tokens serves them as well.
  bool served = false;
  const size_t all = rest.size();
  for_children_sharing(c.node, rest, all, [&](Node* k, size_t) {
    served = k->resident();
    return !served;
  });
  if (served) return;
  c.tail = add_child(c.node, rest, block_table[static_cast<size_t>(c.pages)]);
}

void RadixCache::insert_finished(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed,
                                 std::vector<PageId>& block_table, ModelId model) {
  insert(seq, tokens, num_computed, block_table, model);
  forget(seq);
}

void RadixCache::forget(SeqId seq) {
  drop_claims(seq);
  cursors_.erase(seq);
}

int64_t RadixCache::evict(int64_t pages) {
  int64_t freed = 0;
  auto it = leaves_.begin();
  while (freed < pages && it != leaves_.end()) {
    Node* leaf = it->second;
    if (pool_.refcount(leaf->page) != 1) {
      ++it;
      continue;
    }
    ++it;
    Node* parent = leaf->parent;
    if (tiers_.tiers) {
      const int64_t before = pool_.num_free();
      offload_chain(leaf);
      freed += pool_.num_free() - before;
      num_evicted_ += pool_.num_free() - before;
      (void)parent;
      it = leaves_.begin();  // the chain's top may have left an older device leaf above it
      continue;
    }
    remove_leaf(leaf);
    ++freed;
    ++num_evicted_;
    // The parent may have just become a leaf older than where the scan stands.
    if (parent->in_leaves && (it == leaves_.end() || parent->last_access < it->first))
      it = leaves_.find({parent->last_access, parent});
  }
  return freed;
}

void RadixCache::check_invariants() const {
  int64_t nodes = 0;
  size_t leaves = 0;
  std::vector<const Node*> stack;
  for (const auto& r : roots_) stack.push_back(r.get());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n->parent) {
      ++nodes;
      if (n->resident()) {
        if (!pool_.is_cached(n->page) || pool_.refcount(n->page) < 1) fail("node page not cached");
        if (!n->parent->resident() && n->parent->parent) fail("resident below offloaded");
      } else if (n->entry != 0) {
        auto it = entry_nodes_.find(n->entry);
        if (it == entry_nodes_.end() ||
            std::find(it->second.begin(), it->second.end(), n) == it->second.end())
          fail("offloaded node missing from its entry");
        if (!tiers_.tiers || !tiers_.tiers->tier_of(n->entry)) fail("entry gone from the tiers");
      }
      int32_t device_children = 0;
      for (const auto& c : n->children) device_children += c->resident() ? 1 : 0;
      if (device_children != n->device_children) fail("device child count out of date");
      if (n->ordered.size() != n->children.size() ||
          !std::is_sorted(n->ordered.begin(), n->ordered.end(), ChildOrder{}))
        fail("children index out of date");
      if (n->tokens.empty() || n->tokens.size() > static_cast<size_t>(page_size_))
        fail("node with a bad token count");
      if (n->tokens.size() < static_cast<size_t>(page_size_) && !n->children.empty())
        fail("partial page with children");
      if ((n->resident() && n->device_children == 0) != n->in_leaves) fail("leaf set out of date");
      if (n->in_leaves) {
        ++leaves;
        if (!leaves_.count({n->last_access, const_cast<Node*>(n)})) fail("leaf missing");
      }
    }
    for (size_t i = 0; i < n->children.size(); ++i) {
      const Node* c = n->children[i].get();
      if (c->parent != n || c->index_in_parent != i) fail("broken parent link");
      stack.push_back(c);
    }
  }
  if (nodes != num_nodes_) fail("node count out of date");
  if (leaves != leaves_.size()) fail("stale entries in the leaf set");
}

int64_t optimal_shared_tokens(std::vector<std::span<const TokenId>> prompts) {
  std::sort(prompts.begin(), prompts.end(), [](auto a, auto b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  });
  int64_t shared = 0;
  for (size_t i = 1; i < prompts.size(); ++i) {
    if (prompts[i].empty()) continue;
    const size_t k = common_prefix(prompts[i - 1], prompts[i]);
    shared += static_cast<int64_t>(std::min(k, prompts[i].size() - 1));
  }
  return shared;
}

}  // namespace blend
