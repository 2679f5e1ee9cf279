#include "text/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <queue>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace blend {

using namespace tok;

void Tokenizer::Impl::encode_section(std::string_view text, std::vector<int32_t>& out,
                                     bool first_section) const {
  if (text.empty()) return;
  if (sentencepiece) {
    sp_encode_section(text, first_section, out);
    return;
  }
  if (normal_forms.empty()) {
    split_and_encode(text, 0, out);
    return;
  }
  // Text already in the form (all ASCII, most text) passes the quick-check without a copy.
  std::string normalized;
  std::string_view current = text;
  for (const NormalForm form : normal_forms) {
    if (is_normalized_quick(current, form)) continue;
    normalized = tok::normalize(current, form);
    current = normalized;
  }
  split_and_encode(current, 0, out);
}

void Tokenizer::Impl::split_and_encode(std::string_view text, size_t step,
                                       std::vector<int32_t>& out) const {
  if (step == splits.size()) {
    if (sentencepiece) {
      sp_encode_piece(text, out);
    } else {
      encode_piece(text, out);
    }
    return;
  }
  const auto next = [&](size_t b, size_t e) {
    split_and_encode(text.substr(b, e - b), step + 1, out);
  };
  if (split_merges_with_previous[step]) {
    splits[step]->for_each_piece<true>(text, next);
  } else {
    splits[step]->for_each_piece(text, next);
  }
}

void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_ids[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges) {
    const int32_t id = vocab_by_bytes.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (piece.size() > kMaxCachedKey) {
    // Long pieces are rare (runs of spaces, long numbers or identifiers) and seldom repeat.
    if (piece.size() <= 64) {
      merge_small(piece, out);
    } else {
      merge_large(piece, out);
    }
    return;
  }
  cached_encode(piece, out,
                [this](std::string_view p, std::vector<int32_t>& o) { merge_small(p, o); });
}

// BPE for pieces of at most 64 bytes: symbols in an array, the rank of each adjacent pair next
// to it, a linear scan for the lowest (leftmost on ties). Quadratic, but on tiny arrays that
// stay in L1 this beats a heap.
void Tokenizer::Impl::merge_small(std::string_view piece, std::vector<int32_t>& out) const {
  int32_t sym[64], rank[64], merged[64];
  const size_t n = piece.size();
  for (size_t i = 0; i < n; ++i) sym[i] = byte_ids[static_cast<unsigned char>(piece[i])];
  for (size_t i = 0; i + 1 < n; ++i) {
    const auto& m = byte_pair_merges[static_cast<unsigned char>(piece[i]) * 256 +
                                     static_cast<unsigned char>(piece[i + 1])];
    rank[i] = m.first;
    merged[i] = m.second;
  }
  merge_ranked(sym, rank, merged, n, out);
}

// sym[0..n) with rank/merged of each adjacent pair filled in (the last entry is set here).
void Tokenizer::Impl::merge_ranked(int32_t* sym, int32_t* rank, int32_t* merged, size_t n,
                                   std::vector<int32_t>& out) const {
  auto lookup = [&](size_t i) {
    const PairTable::Entry* e = merges.find(sym[i], sym[i + 1]);
    rank[i] = e ? e->rank : kNoRank;
    merged[i] = e ? e->merged : -1;
  };
  rank[n - 1] = kNoRank;  // not a pair; keeps the shifts below from copying garbage
  merged[n - 1] = -1;
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNoRank) break;
    sym[best] = merged[best];
    const size_t tail = n - best - 2;  // entries after the removed symbol best+1
    std::memmove(sym + best + 1, sym + best + 2, tail * sizeof(int32_t));
    std::memmove(rank + best + 1, rank + best + 2, tail * sizeof(int32_t));
    std::memmove(merged + best + 1, merged + best + 2, tail * sizeof(int32_t));
    --n;
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
  out.insert(out.end(), sym, sym + n);
}

// BPE for long pieces: a linked list of symbols and a min-heap of candidate merges ordered by
// (rank, position). Stale heap entries are recognised by their ids no longer being adjacent.
void Tokenizer::Impl::merge_large(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_ids[static_cast<unsigned char>(piece[i])];
  merge_symbols(std::move(sym), out);
}

void Tokenizer::Impl::merge_symbols(std::vector<int32_t> sym, std::vector<int32_t>& out) const {
  if (sym.empty()) return;
  const auto n = static_cast<int32_t>(sym.size());
  std::vector<int32_t> next(sym.size()), prev(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
    prev[static_cast<size_t>(i)] = i - 1;
  }
  struct Candidate {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t pos) {
    const int32_t r = next[static_cast<size_t>(pos)];
    if (r < 0) return;
    const int32_t a = sym[static_cast<size_t>(pos)], b = sym[static_cast<size_t>(r)];
    if (const PairTable::Entry* e = merges.find(a, b)) heap.push({e->rank, pos, a, b, e->merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto pos = static_cast<size_t>(c.pos);
    const int32_t r = next[pos];
    if (sym[pos] != c.left || r < 0 || sym[static_cast<size_t>(r)] != c.right) continue;
    sym[pos] = c.merged;
    sym[static_cast<size_t>(r)] = -1;
    next[pos] = next[static_cast<size_t>(r)];
    if (next[pos] >= 0) prev[static_cast<size_t>(next[pos])] = c.pos;
    if (prev[pos] >= 0) consider(prev[pos]);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[static_cast<size_t>(i)])
    out.push_back(sym[static_cast<size_t>(i)]);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& im = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 8);
  size_t start = 0;  // beginning of the section not yet encoded
  for (size_t i = 0; i < text.size();) {
    const Impl::AddedBucket& bucket = im.added_by_first_byte[static_cast<unsigned char>(text[i])];
    if (bucket.tokens.empty() ||
        (!bucket.single_byte &&
         (i + 1 == text.size() || !bucket.second[static_cast<unsigned char>(text[i + 1])]))) {
      ++i;
      continue;
    }
    const AddedToken* hit = nullptr;
    for (uint16_t k : bucket.tokens) {
      const AddedToken& t = im.added[k];
      if ((parse_special || !t.special) && text.compare(i, t.content.size(), t.content) == 0) {
        hit = &t;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    const size_t end = hit->lstrip ? trim_white_space_end(text, start, i) : i;
    im.encode_section(text.substr(start, end - start), out, start == 0);
    out.push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip) i = skip_white_space(text, i);
    start = i;
  }
  im.encode_section(text.substr(start), out, start == 0);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  bool first = true;
  size_t strip_left = impl_->text_strip_start;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    impl_->append_decoded(id, first, strip_left, bytes);
  }
  return sanitize_utf8(bytes);
}

std::vector<int32_t> Tokenizer::add_special_tokens(std::vector<int32_t> ids) const {
  return impl_->post_processor.apply(std::move(ids));
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_text.size()) return {};
  return impl_->id_to_text[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  static const std::string empty;
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_bytes.size()) return empty;
  return impl_->id_to_bytes[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  const int32_t id = impl_->by_text.find(token);
  if (id < 0) return std::nullopt;
  return id;
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->id_to_bytes.size());
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() &&
         impl_->special[static_cast<size_t>(id)];
}

const std::string& Tokenizer::bos_token() const {
  return impl_->bos;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool valid, incomplete;
    const size_t n = utf8_unit(bytes, i, valid, incomplete);
    if (valid) {
      out.append(bytes.substr(i, n));
    } else {
      append_replacement(out);
    }
    i += n;
  }
  return out;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special,
                                               bool from_sequence_start)
    : tokenizer_(&tokenizer),
      skip_special_(skip_special),
      first_(from_sequence_start),
      strip_left_(from_sequence_start ? tokenizer.impl_->text_strip_start : 0) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return "";
  tokenizer_->impl_->append_decoded(id, first_, strip_left_, pending_);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    bool valid, incomplete;
    const size_t n = utf8_unit(pending_, i, valid, incomplete);
    if (incomplete) break;  // wait for the rest of the character
    if (valid) {
      out.append(pending_, i, n);
    } else {
      append_replacement(out);
    }
    i += n;
  }
  pending_.erase(0, i);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace blend
