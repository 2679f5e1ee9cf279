#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "text/tokenizer.h"

namespace blend {
namespace {

void set_bit(std::vector<uint64_t>& w, TokenId t) {
  w[static_cast<size_t>(t) / 64] |= uint64_t{1} << (static_cast<size_t>(t) % 64);
}

void append_shape(std::string& key, const Grammar::NodeShape& shape) {
  key.append(reinterpret_cast<const char*>(&shape.rule_shape), sizeof shape.rule_shape);
  key.append(reinterpret_cast<const char*>(&shape.index), sizeof shape.index);
}

// Every byte: the follow set of a table that leaves context-dependent every token that leaves
// its rule.
const ByteSet kAnyByte = [] {
  ByteSet all;
  all.bits.fill(~uint64_t{0});
  return all;
}();

void append_bytes(std::string& key, const ByteSet& set) {
  key.append(reinterpret_cast<const char*>(set.bits.data()), sizeof set.bits);
}

std::string state_key(const std::vector<GrammarStack>& state) {
  std::string key;
  for (const GrammarStack& s : state) {
    const int32_t n = static_cast<int32_t>(s.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof n);
    key.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(int32_t));
  }
  return key;
}

class GrammarMatcher : public TokenMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> g)
      : g_(std::move(g)), state_(g_->grammar().initial()) {
    update_finished();
  }

  std::shared_ptr<const TokenMask> mask() override { return g_->mask_for(state_); }

  bool accept(TokenId token) override {
    const Grammar& gr = g_->grammar();
    if (ended_) return false;
    if (g_->vocab().is_eos(token)) {
      if (!can_finish()) return false;
      ended_ = finished_ = true;
      return true;
    }
    if (token < 0 || token >= g_->vocab().vocab_size()) return false;
    const std::string& bytes = g_->vocab().bytes(token);
    if (bytes.empty()) return false;
    std::vector<GrammarStack> next = state_;
    for (char c : bytes) {
      next = gr.advance(next, static_cast<uint8_t>(c));
      if (next.empty()) return false;
    }
    state_ = std::move(next);
    update_finished();
    return true;
  }

  bool finished() const override { return finished_; }
  bool complete() const override { return ended_ || can_finish(); }

 private:
  bool can_finish() const {
    return std::any_of(state_.begin(), state_.end(),
                       [&](const GrammarStack& s) { return g_->grammar().can_finish(s); });
  }
  void update_finished() {
    finished_ = can_finish() &&
                std::none_of(state_.begin(), state_.end(),
                             [&](const GrammarStack& s) { return g_->grammar().can_continue(s); });
  }

  std::shared_ptr<const CompiledGrammar> g_;
  std::vector<GrammarStack> state_;
  bool ended_ = false, finished_ = false;
};

// Counts the characters of a JSON string from some place inside it (json_schema's string
// characters: one plain byte, a backslash escape, or a UTF-8 sequence). Only good for bytes the
// grammar accepted: it tells characters apart, it does not validate them.
struct StringLexer {
  int pending = 0;      // bytes still to come of the current character
  bool escape = false;  // the last byte was the backslash that starts an escape
  int chars = 0;        // characters started
  bool closed = false;  // met the closing quote (and stopped there)
  void feed(std::string_view bytes) {
    for (char ch : bytes) {
      const auto b = static_cast<uint8_t>(ch);
      if (escape) {
        escape = false;
        pending = b == 'u' ? 4 : 0;
      } else if (pending > 0) {
        --pending;
      } else if (b == '"') {
        closed = true;
        return;
      } else {
        ++chars;
        escape = b == '\\';
        pending = b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc0 ? 1 : 0;
      }
    }
  }
};

}  // namespace

TokenVocab::TokenVocab(const Tokenizer& tokenizer, int32_t model_vocab_size,
                       std::vector<TokenId> eos_ids)
    : vocab_size_(model_vocab_size), eos_(std::move(eos_ids)) {
  bytes_.resize(static_cast<size_t>(vocab_size_));
  const int32_t n = std::min(vocab_size_, tokenizer.vocab_size());
  for (int32_t t = 0; t < n; ++t)
    if (!tokenizer.is_special(t)) bytes_[static_cast<size_t>(t)] = tokenizer.token_bytes(t);
  index();
}

TokenVocab::TokenVocab(std::vector<std::string> bytes, std::vector<TokenId> eos_ids)
    : vocab_size_(static_cast<int32_t>(bytes.size())),
      bytes_(std::move(bytes)),
      eos_(std::move(eos_ids)) {
  index();
}

void TokenVocab::index() {
  for (TokenId e : eos_) {
    if (e < 0 || e >= vocab_size_) throw Error("end-of-sequence id outside the vocabulary");
    bytes_[static_cast<size_t>(e)].clear();  // an EOS token's text is never part of the output
  }
  // Sorted by (first 8 bytes as a big-endian integer, zero-padded, then all bytes): the
  // integers order the tokens as their strings do, so only tokens with the same first 8
  // bytes (or a shorter token and one padded with zeros) need their strings compared.
  std::vector<std::pair<uint64_t, TokenId>> keyed;
  for (TokenId t = 0; t < vocab_size_; ++t) {
    const std::string& b = bytes_[static_cast<size_t>(t)];
    if (b.empty()) continue;
    uint64_t key = 0;
    for (size_t i = 0; i < 8; ++i)
      key = key << 8 | (i < b.size() ? static_cast<uint8_t>(b[i]) : uint64_t{0});
    keyed.emplace_back(key, t);
  }
  // A radix sort on the integers (four passes of 16 bits, least significant first: stable),
  // then each run of equal integers by its strings (tokens longer than 8 bytes, or with zeros).
  std::vector<std::pair<uint64_t, TokenId>> scratch(keyed.size());
  std::vector<uint32_t> counts(size_t{1} << 16);
  for (int shift = 0; shift < 64; shift += 16) {
    std::fill(counts.begin(), counts.end(), 0);
    for (const auto& [key, t] : keyed) ++counts[(key >> shift) & 0xffff];
    uint32_t at = 0;
    for (uint32_t& c : counts) at += std::exchange(c, at);
    for (const auto& e : keyed) scratch[counts[(e.first >> shift) & 0xffff]++] = e;
    keyed.swap(scratch);
  }
  for (size_t i = 0; i < keyed.size();) {
    size_t j = i + 1;
    while (j < keyed.size() && keyed[j].first == keyed[i].first) ++j;
    if (j - i > 1)
      std::sort(keyed.begin() + static_cast<ptrdiff_t>(i),
                keyed.begin() + static_cast<ptrdiff_t>(j),
                [&](const auto& a, const auto& b) { return bytes(a.second) < bytes(b.second); });
    i = j;
  }
  sorted_.reserve(keyed.size());
  for (const auto& [key, t] : keyed) sorted_.push_back(t);
  position_.assign(bytes_.size(), 0);
  for (size_t i = 0; i < sorted_.size(); ++i)
    position_[static_cast<size_t>(sorted_[i])] = static_cast<uint32_t>(i);
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string& a = bytes(sorted_[i - 1]);
    const std::string& b = bytes(sorted_[i]);
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    lcp_[i] = static_cast<int32_t>(k);
  }
  next_shorter_.assign(sorted_.size(), static_cast<uint32_t>(sorted_.size()));
  std::vector<uint32_t> open;  // positions whose next shorter prefix is not found yet
  for (size_t j = 0; j < sorted_.size(); ++j) {
    while (!open.empty() && lcp_[j] < lcp_[open.back()]) {
      next_shorter_[open.back()] = static_cast<uint32_t>(j);
      open.pop_back();
    }
    open.push_back(static_cast<uint32_t>(j));
  }
  for (size_t d = 0; d < 2; ++d) {
    std::vector<uint32_t>& end = run_end_[d];
    end.assign(sorted_.size(), 0);
    for (size_t i = sorted_.size(); i-- > 0;)
      end[i] = i + 1 < sorted_.size() && static_cast<size_t>(lcp_[i + 1]) > d
                   ? end[i + 1]
                   : static_cast<uint32_t>(i + 1);
  }
}

size_t TokenVocab::run_end(size_t i, size_t len) const {
  if (len == 0) return sorted_.size();
  if (len <= 2) return run_end_[len - 1][i];
  // Every position before next_shorter_[j] shares at least lcp_[j] >= len bytes: still in the
  // run. A run of thousands (" the..." tokens under a dead " the") takes a few jumps, where a
  // scan took a step per token.
  size_t j = i + 1;
  while (j < sorted_.size() && static_cast<size_t>(lcp_[j]) >= len) j = next_shorter_[j];
  return j;
}

bool TokenVocab::is_eos(TokenId t) const {
  return std::find(eos_.begin(), eos_.end(), t) != eos_.end();
}

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar,
                                 std::shared_ptr<const TokenVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  tables_.resize(static_cast<size_t>(grammar_->num_nodes()));
  grammar_bytes_ =
      sizeof(*this) + grammar_->memory_bytes() + tables_.capacity() * sizeof(tables_[0]);
}

std::unique_ptr<TokenMatcher> CompiledGrammar::start() const {
  return std::make_unique<GrammarMatcher>(shared_from_this());
}

namespace {

// The end of the run of tokens after `from` that start with the same `len` bytes as
// tokens[from]: they are sorted, so such tokens are neighbours. In the whole sorted vocabulary
// that is TokenVocab::run_end; `tokens` being in the same order, its run ends before the first
// token whose position is past that end: a galloping search over integers, so a short run
// costs a few comparisons and a long one (every " x..." token under a dead " x") a logarithm.
size_t prefix_run_end(const TokenVocab& v, const std::vector<TokenId>& tokens,
                      const std::vector<int32_t>* common_prefix, size_t from, size_t len) {
  if (common_prefix) return v.run_end(from, len);  // `tokens` is the whole sorted vocabulary
  const uint32_t end = static_cast<uint32_t>(v.run_end(v.position(tokens[from]), len));
  auto shares = [&](size_t j) { return v.position(tokens[j]) < end; };
  size_t lo = from, step = 1;  // tokens (from, lo] share the prefix
  while (lo + step < tokens.size() && shares(lo + step)) {
    lo += step;
    step *= 2;
  }
  size_t hi = std::min(tokens.size(), lo + step);  // tokens[hi] does not (or is past the end)
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    (shares(mid) ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace

template <typename OnAccept>
void CompiledGrammar::classify(const GrammarStack& start, const std::vector<TokenId>& tokens,
                               const std::vector<int32_t>* common_prefix, const ByteSet& follow,
                               OnAccept on_accept, std::vector<TokenId>& context_dependent) const {
  const TokenVocab& v = *vocab_;
  // levels[k]: the stacks after the first k bytes of the current token; outside[k]: some way
  // popped onto kOutside on the way (the rest of the token is for callers not known here).
  std::vector<std::vector<GrammarStack>> levels{{start}};
  std::vector<size_t> sizes{1};  // levels[k]'s stacks are levels[k][0, sizes[k])
  std::vector<char> outside{0};
  int32_t valid = 0;         // levels[0..valid] belong to the previous token's bytes
  int32_t dead = INT32_MAX;  // the previous token's prefix of this length matches nothing
  const std::string* prev = nullptr;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenId t = tokens[i];
    const std::string& bytes = v.bytes(t);
    int32_t common = 0;
    if (common_prefix) {
      common = (*common_prefix)[i];
    } else if (prev) {
      while (static_cast<size_t>(common) < prev->size() &&
             static_cast<size_t>(common) < bytes.size() &&
             (*prev)[static_cast<size_t>(common)] == bytes[static_cast<size_t>(common)])
        ++common;
    }
    prev = &bytes;
    if (dead <= common) continue;  // shares a rejected prefix
    dead = INT32_MAX;
    const int32_t len = static_cast<int32_t>(bytes.size());
    if (static_cast<int32_t>(levels.size()) < len + 1) {
      levels.resize(static_cast<size_t>(len) + 1);
      sizes.resize(static_cast<size_t>(len) + 1);
      outside.resize(static_cast<size_t>(len) + 1);
    }
    int32_t k = std::min(common, valid);
    // Stops at a prefix no stack survives: dead, or (outside set) left for the callers.
    for (; k < len; ++k) {
      const size_t at = static_cast<size_t>(k);
      if (sizes[at] == 0) break;
      const auto byte = static_cast<uint8_t>(bytes[at]);
      if (sizes[at] == 1) {
        // One stack whose top node has one way at most per byte (a string's interior): only
        // the top changes, with nothing to sort or pop. Most of a string table's walk.
        const GrammarStack& from = levels[at][0];
        const int32_t next = grammar_->deterministic_step(from.back(), byte);
        if (next != Grammar::kNotDeterministic) {
          std::vector<GrammarStack>& to = levels[at + 1];
          if (next == Grammar::kNoEdge) {
            sizes[at + 1] = 0;
          } else {
            if (to.empty()) to.emplace_back();
            to[0].assign(from.begin(), from.end());
            to[0].back() = next;
            sizes[at + 1] = 1;
          }
          outside[at + 1] = outside[at];
          continue;
        }
      }
      bool out = false;
      grammar_->advance_into(levels[at], sizes[at], byte, levels[at + 1], sizes[at + 1], &out);
      // A pop before the token's first byte is not context: mask_for() adds the popped stack
      // to the state it masks, and that stack's own tables decide such tokens. A pop with a
      // byte that nothing after the rule takes is a dead way, whatever the callers.
      outside[at + 1] = outside[at] || (out && at > 0 && follow.has(byte));
    }
    valid = k;
    const size_t at = static_cast<size_t>(k);
    if (k == len && sizes[at] > 0) {
      on_accept(t);
      continue;
    }
    // Every token under this prefix ends the same way (no stack left to tell them apart):
    // decided as a run, which is what makes whitespace-like nodes (tens of thousands of
    // " word" tokens that leave the rule after one byte) and dead prefixes cheap.
    const size_t end = prefix_run_end(v, tokens, common_prefix, i, at);
    if (outside[at]) {
      context_dependent.insert(context_dependent.end(), tokens.begin() + static_cast<ptrdiff_t>(i),
                               tokens.begin() + static_cast<ptrdiff_t>(end));
    } else {
      dead = k;
    }
    i = end - 1;
    prev = &v.bytes(tokens[i]);
  }
}

const NodeTokenTable& CompiledGrammar::node_table(int32_t node) const {
  {
    std::lock_guard lock(mu_);
    if (tables_[static_cast<size_t>(node)]) return *tables_[static_cast<size_t>(node)];
  }
  std::shared_ptr<const NodeTokenTable> table =
      shared_node_table(node, grammar_->follow(grammar_->node_rule(node)));
  std::lock_guard lock(mu_);
  auto& slot = tables_[static_cast<size_t>(node)];
  if (!slot) {  // another thread may have set it meanwhile
    slot = std::move(table);
    table_bytes_ += slot->accepted.capacity() * sizeof(uint64_t) +
                    slot->context_dependent.capacity() * sizeof(TokenId);
    held_bytes_ = table_bytes_ + mask_bytes_;
  }
  return *slot;
}

std::shared_ptr<const NodeTokenTable> CompiledGrammar::shared_node_table(
    int32_t node, const ByteSet& follow) const {
  std::string key;
  append_shape(key, grammar_->node_shape(node));
  append_bytes(key, follow);
  if (auto table = vocab_->node_tables.find(key)) return table;
  auto built = std::make_shared<NodeTokenTable>();
  if (follow == kAnyByte) {
    // The walk of the whole vocabulary, once per node shape.
    built->accepted.assign((static_cast<size_t>(vocab_->vocab_size()) + 63) / 64, 0);
    if (!counted_string_table(node, *built))
      classify(
          {Grammar::kOutside, node}, vocab_->sorted(), &vocab_->common_prefix(), kAnyByte,
          [&](TokenId t) { set_bit(built->accepted, t); }, built->context_dependent);
  } else {
    // The follow set changes only which tokens that leave the rule stay context-dependent
    // (the accepted ones never leave it): the unfiltered table's few, walked again. Rules
    // shared by grammars whose follow sets differ (a string before ',' or '}') share the walk.
    std::shared_ptr<const NodeTokenTable> any = shared_node_table(node, kAnyByte);
    if (any->context_dependent.empty())  // nothing leaves the rule: the same table
      return vocab_->node_tables.keep(std::move(key), std::move(any));
    built->accepted = any->accepted;
    classify(
        {Grammar::kOutside, node}, any->context_dependent, nullptr, follow,
        [&](TokenId t) { set_bit(built->accepted, t); }, built->context_dependent);
  }
  return vocab_->node_tables.keep(std::move(key), std::move(built));
}

bool CompiledGrammar::counted_string_table(int32_t node, NodeTokenTable& out) const {
  // From position p of `"` char{min,max} `"`, a token is what it is from the same place in
  // `"` char* `"`, as long as it starts at most max - p characters (a partial one counts) and,
  // when it closes the string, at least min - p: one filter over the unbounded node's table,
  // where a fresh table would walk the whole vocabulary for every position.
  const Grammar& g = *grammar_;
  const Grammar::CountedString* counted = g.counted_string(g.node_rule(node));
  std::string path;
  if (!counted || !g.witness(node, path) || path.empty() || path[0] != '"') return false;
  StringLexer at;  // where `node` is: characters started, and inside which one
  at.feed(std::string_view(path).substr(1));
  if (at.closed) return false;
  const int32_t same = g.walk_bytes(g.rule_start(counted->unbounded_rule), path);
  if (same < 0) return false;
  // The unbounded table at that place, split by characters: once per place and process.
  std::string key;
  append_shape(key, g.node_shape(same));
  key += static_cast<char>(at.pending);
  key += static_cast<char>(at.escape);
  std::shared_ptr<const CountedStringPlace> place = vocab_->counted_places.find(key);
  if (!place) {
    const std::shared_ptr<const NodeTokenTable> from_table = shared_node_table(same, kAnyByte);
    const NodeTokenTable& from = *from_table;
    auto fresh = std::make_shared<CountedStringPlace>();
    auto lex = [&](TokenId t) {
      StringLexer lx = at;
      lx.chars = 0;
      lx.feed(vocab_->bytes(t));
      return std::pair{lx.chars, lx.closed};
    };
    constexpr int32_t kIndexed = CountedStringPlace::kIndexed;
    fresh->open.assign(kIndexed + 1, std::vector<uint64_t>(from.accepted.size(), 0));
    for (size_t w = 0; w < from.accepted.size(); ++w)
      for (uint64_t bits = from.accepted[w]; bits; bits &= bits - 1) {
        const auto t = static_cast<TokenId>(w * 64 + static_cast<size_t>(std::countr_zero(bits)));
        const auto [chars, closed] = lex(t);
        if (closed)
          fresh->closing.push_back({chars, t});
        else if (chars > kIndexed)
          fresh->long_open.push_back({chars, t});
        else
          set_bit(fresh->open[static_cast<size_t>(chars)], t);
      }
    for (size_t c = 1; c < fresh->open.size(); ++c)  // at most c: a running union
      for (size_t w = 0; w < from.accepted.size(); ++w) fresh->open[c][w] |= fresh->open[c - 1][w];
    for (TokenId t : from.context_dependent) fresh->context_dependent.push_back({lex(t).first, t});
    place = vocab_->counted_places.keep(std::move(key), std::move(fresh));
  }
  const int64_t room = counted->max < 0 ? INT64_MAX : int64_t{counted->max} - at.chars;
  const int64_t need = int64_t{counted->min} - at.chars;
  if (room < 0) return true;  // not a place the rule reaches; nothing fits
  out.accepted = place->open[static_cast<size_t>(std::min<int64_t>(room, place->open.size() - 1))];
  for (const auto& [chars, t] : place->long_open)
    if (chars <= room) set_bit(out.accepted, t);
  for (const auto& [chars, t] : place->closing)
    if (chars >= need && chars <= room) set_bit(out.accepted, t);
  for (const auto& [chars, t] : place->context_dependent)
    if (chars >= need && chars <= room) out.context_dependent.push_back(t);
  return true;
}

std::shared_ptr<const SuffixTokenTable> CompiledGrammar::suffix_table(
    const GrammarStack& stack, size_t k, const std::vector<TokenId>& candidates) const {
  GrammarStack start{Grammar::kOutside};
  start.insert(start.end(), stack.end() - static_cast<ptrdiff_t>(k), stack.end());
  // The candidates are the k - 1 top nodes' context-dependent tokens, each table's filtered by
  // its bottom rule's follow set: the k shapes and follow sets are key enough.
  std::string key;
  for (size_t i = 1; i < start.size(); ++i) {
    append_shape(key, grammar_->node_shape(start[i]));
    append_bytes(key, grammar_->follow(grammar_->node_rule(start[i])));
  }
  if (auto table = vocab_->suffix_tables.find(key)) return table;
  auto table = std::make_shared<SuffixTokenTable>();
  // Popping onto kOutside leaves the rule of the bottom frame (start[1]).
  classify(
      start, candidates, nullptr, grammar_->follow(grammar_->node_rule(start[1])),
      [&](TokenId t) { table->accepted.push_back(t); }, table->context_dependent);
  return vocab_->suffix_tables.keep(std::move(key), std::move(table));
}

std::shared_ptr<const TokenMask> CompiledGrammar::mask_for(
    const std::vector<GrammarStack>& state) const {
  std::string key = state_key(state);
  {
    std::lock_guard lock(mu_);
    auto it = masks_.find(key);
    if (it != masks_.end()) return it->second;
  }
  auto mask = std::make_shared<TokenMask>();
  std::vector<uint64_t>& w = mask->words;
  w.assign((static_cast<size_t>(vocab_->vocab_size()) + 63) / 64, 0);
  // The state with every pop that needs no input made: a token may start in any of these
  // stacks (the tables do not follow pops before a token's first byte; see classify).
  std::vector<GrammarStack> expanded;
  for (const GrammarStack& s : state) {
    GrammarStack t = s;
    expanded.push_back(t);
    while (t.size() > 1 && grammar_->node_completes(t.back())) {
      t.pop_back();
      expanded.push_back(t);
    }
  }
  std::sort(expanded.begin(), expanded.end());
  expanded.erase(std::unique(expanded.begin(), expanded.end()), expanded.end());
  bool finish = false;
  for (const GrammarStack& s : expanded) {
    const NodeTokenTable& table = node_table(s.back());
    for (size_t i = 0; i < w.size(); ++i) w[i] |= table.accepted[i];
    finish = finish || grammar_->can_finish(s);
  }
  // Context-dependent tokens are decided with one more caller known at a time (tables cached
  // by the stack's top nodes); what still pops past the root is not allowed.
  for (const GrammarStack& s : expanded) {
    const std::vector<TokenId>* candidates = &node_table(s.back()).context_dependent;
    std::shared_ptr<const SuffixTokenTable> t;  // holds *candidates from k = 3 on
    for (size_t k = 2; k <= s.size() && !candidates->empty(); ++k) {
      t = suffix_table(s, k, *candidates);
      for (TokenId a : t->accepted) set_bit(w, a);
      candidates = &t->context_dependent;
    }
  }
  if (finish)
    for (TokenId e : vocab_->eos_ids()) set_bit(w, e);
  const size_t bytes = key.capacity() + w.capacity() * sizeof(uint64_t) + sizeof(TokenMask);
  std::lock_guard lock(mu_);
  if (mask_bytes_ + bytes > kMaxMaskBytes) {
    masks_.clear();
    mask_bytes_ = 0;
  }
  auto [it, added] = masks_.emplace(std::move(key), std::move(mask));
  if (added) mask_bytes_ += bytes;
  held_bytes_ = table_bytes_ + mask_bytes_;
  return it->second;
}

TokenMask CompiledGrammar::brute_force_mask(const std::vector<GrammarStack>& state) const {
  TokenMask mask;
  mask.words.assign((static_cast<size_t>(vocab_->vocab_size()) + 63) / 64, 0);
  bool finish = false;
  for (const GrammarStack& s : state) finish = finish || grammar_->can_finish(s);
  for (TokenId t = 0; t < vocab_->vocab_size(); ++t) {
    if (vocab_->is_eos(t)) {
      if (finish) set_bit(mask.words, t);
      continue;
    }
    if (vocab_->bytes(t).empty()) continue;
    std::vector<GrammarStack> cur = state;
    for (char c : vocab_->bytes(t)) {
      cur = grammar_->advance(cur, static_cast<uint8_t>(c));
      if (cur.empty()) break;
    }
    if (!cur.empty()) set_bit(mask.words, t);
  }
  return mask;
}

size_t CompiledGrammar::cached_masks() const {
  std::lock_guard lock(mu_);
  return masks_.size();
}

}  // namespace blend
