// Token masks — which tokens keep a grammar's output valid, computed cheaply enough to run
// every decoding step next to the forward pass.
//
// The idea is XGrammar's (adaptive token mask cache), in our own form:
//  * The vocabulary's byte strings are sorted, so tokens sharing a prefix are neighbours and a
//    walk over them advances the matcher only over the bytes after the common prefix (a trie
//    walk without a trie), and skips every token under a prefix the grammar rejects.
//  * Per automaton node, once: which tokens are accepted from that node whatever its callers
//    are (the token's bytes stay inside the node's rule and the rules it calls), which are
//    rejected whatever they are, and the few "context-dependent" ones that run past the end of
//    the rule (a string's closing quote and what follows it, say). Most of a JSON vocabulary is
//    decided there.
//  * Per matcher state (its set of stacks), the mask is that node's accepted set plus the
//    context-dependent tokens checked against the real stack, and is itself cached: the states
//    of a schema's output repeat from one request, step and row to the next.
//  * Tables are keyed by node shape (Grammar::node_shape), not node id, and kept in the
//    TokenVocab: whitespace, strings and numbers are tabled once per process for every schema.
//  * A bounded string's positions differ only in how many characters remain, so their tables
//    are the unbounded string's split by each token's character count (one bitset per count),
//    not a walk of the vocabulary per position.
// A mask depends on nothing but the sequence's own state, so masking keeps batch invariance.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/constraint.h"
#include "core/types.h"
#include "grammar/grammar.h"

namespace blend {

class Tokenizer;

// What a token does from an automaton node whatever its callers (see CompiledGrammar).
struct NodeTokenTable {
  std::vector<uint64_t> accepted;          // bits: valid from this node in any context
  std::vector<TokenId> context_dependent;  // must be checked against the callers' stack
};
// The context-dependent tokens of a stack's top k nodes, decided with those k nodes known:
// accepted, or still dependent on the nodes below (checked with k + 1).
struct SuffixTokenTable {
  std::vector<TokenId> accepted, context_dependent;
};

// The unbounded string's table at one place inside a string, by the characters each token
// starts from there (a partial one counts), for the tables of bounded strings
// (Grammar::CountedString).
struct CountedStringPlace {
  static constexpr int32_t kIndexed = 64;  // open[c] for c up to this
  // open[c]: the accepted tokens that start at most c characters and do not close the string.
  std::vector<std::vector<uint64_t>> open;
  // (characters, token): accepted tokens with more than kIndexed; those that end with the
  // closing quote; and the context-dependent ones (characters before the quote), in order.
  std::vector<std::pair<int32_t, TokenId>> long_open, closing, context_dependent;
};

// A bounded, thread-safe map from a key to an immutable value.
template <typename T>
class SharedCache {
 public:
  explicit SharedCache(size_t max_entries) : max_(max_entries) {}
  std::shared_ptr<const T> find(const std::string& key) const {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  // Keeps `value` unless another thread kept one first; returns the one kept. Starts over when
  // full (values stay alive in whoever holds them).
  std::shared_ptr<const T> keep(std::string key, std::shared_ptr<const T> value) {
    std::lock_guard lock(mu_);
    if (map_.size() >= max_) map_.clear();
    return map_.emplace(std::move(key), std::move(value)).first->second;
  }
  size_t size() const {
    std::lock_guard lock(mu_);
    return map_.size();
  }

 private:
  mutable std::mutex mu_;
  size_t max_;
  std::unordered_map<std::string, std::shared_ptr<const T>> map_;
};

// The tokens a grammar may choose from: every id below the model's vocabulary size with a
// non-empty byte string that is not a special token, sorted by bytes; and the end-of-sequence
// ids, allowed only when the output is complete.
class TokenVocab {
 public:
  TokenVocab(const Tokenizer& tokenizer, int32_t model_vocab_size, std::vector<TokenId> eos_ids);
  // For tests: token i has bytes[i] (empty = never allowed).
  TokenVocab(std::vector<std::string> bytes, std::vector<TokenId> eos_ids);

  int32_t vocab_size() const { return vocab_size_; }
  const std::vector<TokenId>& eos_ids() const { return eos_; }
  const std::string& bytes(TokenId t) const { return bytes_[static_cast<size_t>(t)]; }
  bool is_eos(TokenId t) const;
  // Usable tokens in byte order, and each one's common prefix length with the one before.
  const std::vector<TokenId>& sorted() const { return sorted_; }
  const std::vector<int32_t>& common_prefix() const { return lcp_; }
  // The end of the run of sorted tokens from position i on that share its first `len` bytes
  // (i's bytes must be that long). Runs of one and two bytes are indexed (a rejected first
  // byte skips its whole group at once), longer ones found by jumps over next_shorter_.
  size_t run_end(size_t i, size_t len) const;
  // Token t's position in sorted() (usable tokens only).
  uint32_t position(TokenId t) const { return position_[static_cast<size_t>(t)]; }

  // Token tables shared by every grammar over this vocabulary, keyed by node shapes
  // (Grammar::node_shape): a rule that two schemas have in common (whitespace, strings,
  // numbers, a bounded string's character positions) is tabled once per process, not once
  // per schema. Each node table is vocab/8 bytes (16 KB for Llama-3): at most 64 MB.
  mutable SharedCache<NodeTokenTable> node_tables{4096};
  mutable SharedCache<SuffixTokenTable> suffix_tables{16384};
  mutable SharedCache<CountedStringPlace> counted_places{256};

 private:
  void index();
  int32_t vocab_size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<TokenId> eos_, sorted_;
  std::vector<int32_t> lcp_;
  std::vector<uint32_t> position_;    // per token id
  std::vector<uint32_t> run_end_[2];  // for lengths 1 and 2
  // Position j's next position with a shorter common prefix (lcp_[k] < lcp_[j]; the end if
  // none): the tokens between share at least lcp_[j] bytes with their neighbours.
  std::vector<uint32_t> next_shorter_;
};

// A grammar bound to a vocabulary: the TokenConstraint a request carries.
class CompiledGrammar : public TokenConstraint,
                        public std::enable_shared_from_this<CompiledGrammar> {
 public:
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenVocab> vocab);
  std::unique_ptr<TokenMatcher> start() const override;

  const Grammar& grammar() const { return *grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }
  // The mask of a matcher state (cached).
  std::shared_ptr<const TokenMask> mask_for(const std::vector<GrammarStack>& state) const;
  // The same mask without any cache: every token's bytes run through the matcher (tests).
  TokenMask brute_force_mask(const std::vector<GrammarStack>& state) const;
  // States whose masks are cached, and node tables built (statistics, tests).
  size_t cached_masks() const;
  // Bytes it holds: the grammar, the node tables it refers to (shared ones counted as its
  // own: an over-estimate) and its cached masks, whose cache starts over past kMaxMaskBytes.
  // Grows as masks are asked for (GrammarCompiler's cache reads it on every use).
  size_t memory_bytes() const { return grammar_bytes_ + held_bytes_.load(); }
  static constexpr size_t kMaxMaskBytes = size_t{16} << 20;  // 1,024 Llama-3 masks

 private:
  const NodeTokenTable& node_table(int32_t node) const;
  // The table of `node` where a token that leaves its rule is context-dependent only when it
  // leaves with a byte of `follow` (the rule's Grammar::follow; every byte: the walk of the
  // vocabulary that the others filter), shared through the vocabulary by node shape and
  // follow set.
  std::shared_ptr<const NodeTokenTable> shared_node_table(int32_t node,
                                                          const ByteSet& follow) const;
  // The table of a counted string's node (Grammar::CountedString), derived from the unbounded
  // string's node in the same place (follow sets not applied); false (nothing done) for any
  // other node.
  bool counted_string_table(int32_t node, NodeTokenTable& out) const;
  std::shared_ptr<const SuffixTokenTable> suffix_table(
      const GrammarStack& stack, size_t k, const std::vector<TokenId>& candidates) const;
  // Runs `tokens` (in byte order) from `start` (kOutside at its bottom): accepted ones to
  // on_accept, those that pop onto kOutside with a byte of `follow` to context_dependent, the
  // rest are rejected.
  template <typename OnAccept>
  void classify(const GrammarStack& start, const std::vector<TokenId>& tokens,
                const std::vector<int32_t>* common_prefix, const ByteSet& follow,
                OnAccept on_accept, std::vector<TokenId>& context_dependent) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  mutable std::mutex mu_;
  mutable std::vector<std::shared_ptr<const NodeTokenTable>> tables_;  // per node
  mutable std::unordered_map<std::string, std::shared_ptr<const TokenMask>> masks_;
  size_t grammar_bytes_ = 0;
  mutable size_t mask_bytes_ = 0, table_bytes_ = 0;  // mu_ held
  mutable std::atomic<size_t> held_bytes_{0};        // their sum, readable without mu_
};

}  // namespace blend
