// Constraint — what a request's structured-output rule (a JSON schema compiled by grammar/)
// looks like to the engine: a shared, immutable TokenConstraint per rule, and one TokenMatcher
// per sequence that follows the tokens sampled so far and says which tokens may come next.
// core only names the interface, so the engine and sampler need no grammar code.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/types.h"

namespace blend {

// Allowed next tokens: bit t of words[t / 64] set = token t allowed. Sized for the model's
// vocabulary (ids past the tokenizer's are never allowed).
struct TokenMask {
  std::vector<uint64_t> words;
  bool allows(TokenId t) const {
    const size_t w = static_cast<size_t>(t) / 64;
    return t >= 0 && w < words.size() && ((words[w] >> (static_cast<size_t>(t) % 64)) & 1);
  }
};

class TokenMatcher {
 public:
  virtual ~TokenMatcher() = default;
  // The tokens allowed next: those whose bytes keep the output a prefix of a valid one, and
  // the end-of-sequence ids when the output is already complete. A function of the tokens
  // accepted so far only (never of other sequences), so masking keeps batch invariance.
  virtual std::shared_ptr<const TokenMask> mask() = 0;
  // Advances over a sampled token; false (and no change) when the token is not allowed.
  virtual bool accept(TokenId token) = 0;
  // The output so far is a complete value, and no token could extend it: nothing but the end
  // of sequence may follow, so the engine stops the sequence here (finish reason "stop").
  virtual bool finished() const = 0;
  // The output so far is a complete value (more may still follow it): ending here leaves
  // output the grammar accepts.
  virtual bool complete() const = 0;
};

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // A matcher at the start of the output.
  virtual std::unique_ptr<TokenMatcher> start() const = 0;
};

}  // namespace blend
