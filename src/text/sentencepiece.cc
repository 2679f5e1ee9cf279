// SentencePiece-style BPE from a tokenizer.json (Llama 2, Mistral 7B v0.x, Gemma): loading the
// model's byte fallback and unknown token, the Replace / Prepend / Strip normalizers, the
// Metaspace pre-tokenizer and the decoders; encoding over characters; decoding a token's text.
// Semantics as Hugging Face tokenizers (Rust); where its JavaScript port (our parity reference)
// differs, the comment says which one is followed.
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace blend {

using nlohmann::json;
using namespace tok;

namespace {

constexpr const char* kSpaceMark = "\xe2\x96\x81";  // U+2581, SentencePiece's space
constexpr uint32_t kSpaceMarkCp = 0x2581;
constexpr uint32_t kBmpSize = 0x10000;

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t last = 0;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, last)) {
    out.append(s, last, at - last).append(to);
    last = at + from.size();
  }
  if (last == 0) return;
  out.append(s, last);
  s = std::move(out);
}

// A decoded code point if s[at..] starts with one valid character, else nothing.
bool single_code_point(std::string_view s, uint32_t& cp) {
  bool valid, incomplete;
  if (s.empty() || utf8_unit(s, 0, valid, incomplete) != s.size() || !valid) return false;
  size_t i = 0;
  cp = next_code_point(s, i);
  return true;
}

// `pattern` of a Replace step: only the String form (a Regex is refused by name).
std::string string_pattern(const json& step, const std::string& field, const std::string& where) {
  const json& pat = step.contains("pattern") ? step["pattern"] : json();
  if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
    std::string s = pat["String"].get<std::string>();
    if (s.empty()) throw Error(where + ": " + field + "pattern.String is empty");
    return s;
  }
  if (pat.is_object() && pat.contains("Regex"))
    throw Error(where + ": " + field + "pattern.Regex is not supported (only String patterns)");
  throw Error(where + ": " + field + "pattern must be {\"String\": ...}");
}

// Metaspace's prepend_scheme, or the add_prefix_space of files written before it existed.
Metaspace::Prepend prepend_scheme(const json& m, const std::string& field,
                                  const std::string& where) {
  const std::string scheme = text(m, "prepend_scheme", where, field);
  if (scheme == "first") return Metaspace::Prepend::kFirst;
  if (scheme == "always") return Metaspace::Prepend::kAlways;
  if (scheme == "never") return Metaspace::Prepend::kNever;
  if (!scheme.empty())
    throw Error(where + ": " + field + "prepend_scheme '" + scheme +
                "' is not one of first, always, never");
  return flag(m, "add_prefix_space", true, where, field) ? Metaspace::Prepend::kAlways
                                                         : Metaspace::Prepend::kNever;
}

// The one character m[key] ("replacement" of Metaspace, "content" of Strip).
std::string one_char(const json& m, const char* key, const std::string& field,
                     const std::string& where) {
  const std::string r = text(m, key, where, field);
  uint32_t cp;
  if (!single_code_point(r, cp)) throw Error(where + ": " + field + key + " must be one character");
  return r;
}

size_t count(const json& step, const char* key, const std::string& field,
             const std::string& where) {
  const auto it = step.find(key);
  if (it == step.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1024)
    throw Error(where + ": " + field + key + " must be a count from 0 to 1024");
  return it->get<size_t>();
}

// A component and the members of its Sequences, in order, each with where it is.
void flatten(const json& c, const char* list, const std::string& field,
             std::vector<std::pair<const json*, std::string>>& out, const std::string& where) {
  if (!c.is_object()) throw Error(where + ": " + field + " is not an object");
  if (text(c, "type", where, field + ".") != "Sequence") {
    out.emplace_back(&c, field + ".");
    return;
  }
  if (!c.contains(list) || !c[list].is_array())
    throw Error(where + ": " + field + " is a Sequence without '" + list + "'");
  for (size_t k = 0; k < c[list].size(); ++k)
    flatten(c[list][k], list, field + "." + list + "[" + std::to_string(k) + "]", out, where);
}

bool is_byte_token(std::string_view t, unsigned char& byte) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return false;
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return false;
  byte = static_cast<unsigned char>(hi * 16 + lo);
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

void Tokenizer::Impl::load_sentencepiece_model(const json& model, const std::string& where) {
  byte_fallback = flag(model, "byte_fallback", false, where, "model.");
  fuse_unk = flag(model, "fuse_unk", false, where, "model.");
  unk_token = text(model, "unk_token", where, "model.");
}

void Tokenizer::Impl::load_sentencepiece_vocab(std::vector<std::pair<std::string, int64_t>> vocab,
                                               const std::string& where) {
  vocab_by_text.init(&id_to_text, vocab.size());
  for (auto& [piece, id64] : vocab) {
    const auto id = static_cast<size_t>(id64);
    if (piece.empty()) throw Error(where + ": model.vocab has an empty token");
    if (!id_to_text[id].empty())
      throw Error(where + ": token id " + std::to_string(id) + " is used twice");
    id_to_text[id] = piece;
    id_to_bytes[id] = std::move(piece);  // decoded in finish_sentencepiece
    vocab_by_text.insert(static_cast<int32_t>(id));
    by_text.insert(static_cast<int32_t>(id));
  }
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_ids[b] = byte_fallback ? vocab_by_text.find(name) : -1;
  }
}

void Tokenizer::Impl::load_normalizers(const json& normalizer, const std::string& where) {
  std::vector<std::pair<const json*, std::string>> steps;
  flatten(normalizer, "normalizers", "normalizer", steps, where);
  for (const auto& [n, field] : steps) {
    const std::string type = text(*n, "type", where, field);
    NormalizeStep step{NormalizeStep::Kind::kReplace, {}, {}};
    if (type == "Replace") {
      step.from = string_pattern(*n, field, where);
      step.to = text(*n, "content", where, field);
    } else if (type == "Prepend") {
      step.kind = NormalizeStep::Kind::kPrepend;
      step.to = text(*n, "prepend", where, field);
    } else if (type == "Strip") {
      step.kind = NormalizeStep::Kind::kStrip;
      step.left = flag(*n, "strip_left", false, where, field);
      step.right = flag(*n, "strip_right", false, where, field);
    } else {
      throw Error(
          where + ": unsupported normalizer '" + type + "' at " +
          field.substr(0, field.size() - 1) +
          " (supported with a SentencePiece-style model: Replace, Prepend, Strip, Sequence)");
    }
    normalizers.push_back(std::move(step));
  }
}

void Tokenizer::Impl::load_metaspace(const json& pre, const std::string& field,
                                     const std::string& where) {
  metaspace = std::make_unique<Metaspace>();
  metaspace->replacement = one_char(pre, "replacement", field, where);
  metaspace->prepend = prepend_scheme(pre, field, where);
  metaspace->split = flag(pre, "split", true, where, field);
}

void Tokenizer::Impl::load_decoders(const json& decoder, const std::string& where) {
  if (decoder.is_null()) return;
  std::vector<std::pair<const json*, std::string>> steps;
  flatten(decoder, "decoders", "decoder", steps, where);
  bool fused = false;
  for (const auto& [d, field] : steps) {
    const std::string type = text(*d, "type", where, field);
    // After Fuse the steps see the whole text; only a Strip of its start is supported there
    // (a Strip of its end could not stream: the end is not known until the last token).
    if (fused && type != "Strip")
      throw Error(where + ": " + field + "type " + type + " after Fuse is not supported");
    TokenDecodeStep step{TokenDecodeStep::Kind::kReplace, {}, {}, {}};
    if (type == "Replace") {
      step.from = string_pattern(*d, field, where);
      step.to = text(*d, "content", where, field);
    } else if (type == "ByteFallback") {
      step.kind = TokenDecodeStep::Kind::kByteFallback;
    } else if (type == "Fuse") {
      fused = true;
      continue;
    } else if (type == "Strip") {
      step.kind = TokenDecodeStep::Kind::kStrip;
      step.content = one_char(*d, "content", field, where);
      step.start = count(*d, "start", field, where);
      step.stop = count(*d, "stop", field, where);
      if (fused) {
        if (step.stop > 0 || !text_strip_content.empty())
          throw Error(where + ": " + field + "stop after Fuse is not supported");
        text_strip_content = step.content;
        text_strip_start = step.start;
        continue;
      }
    } else if (type == "Metaspace") {
      step.kind = TokenDecodeStep::Kind::kMetaspace;
      step.from = one_char(*d, "replacement", field, where);
      step.metaspace_drops_first = prepend_scheme(*d, field, where) != Metaspace::Prepend::kNever;
      first_token_decodes_differently |= step.metaspace_drops_first;
    } else {
      throw Error(where + ": unsupported decoder '" + type + "' at " +
                  field.substr(0, field.size() - 1) +
                  " (supported with a SentencePiece-style model: Replace, ByteFallback, Fuse, "
                  "Strip, Metaspace, Sequence)");
    }
    token_decoders.push_back(std::move(step));
  }
}

void Tokenizer::Impl::finish_sentencepiece(const std::string& where) {
  if (!unk_token.empty()) {
    unk_id = by_text.find(unk_token);
    if (unk_id < 0) throw Error(where + ": model.unk_token '" + unk_token + "' is not a token");
  }
  bool every_byte = byte_fallback;
  for (int32_t id : byte_ids) every_byte &= id >= 0;
  if (unk_id < 0 && !every_byte)
    throw Error(where + ": model.unk_token is null and model.byte_fallback does not cover every " +
                "byte: text outside the vocabulary would have no token");

  bmp_char_ids.assign(kBmpSize, -1);
  precedes_space_in_vocab.assign(kBmpSize, false);
  for (size_t id = 0; id < id_to_text.size(); ++id) {
    const std::string& t = id_to_text[id];
    uint32_t cp;
    if (single_code_point(t, cp) && cp < kBmpSize &&
        vocab_by_text.find(t) == static_cast<int32_t>(id))
      bmp_char_ids[cp] = static_cast<int32_t>(id);
    // Added tokens too: the JavaScript tokenizer merges into them as well.
    uint32_t prev = kSpaceMarkCp;
    for (size_t i = 0; i < t.size();) {
      const uint32_t c = next_code_point(t, i);
      if (c == kSpaceMarkCp && prev != kSpaceMarkCp && prev < kBmpSize)
        precedes_space_in_vocab[prev] = true;
      prev = c;
    }
    id_to_bytes[id] = decode_token_text(t, false);
  }
  cut_at_spaces = vocab_by_text.find(kSpaceMark) >= 0;
}

// ---------------------------------------------------------------------------------------------
// Encoding

// Whether every byte has its <0xNN> token (byte_ids holds -1 without byte_fallback).
bool Tokenizer::Impl::has_byte_tokens(std::string_view bytes) const {
  for (char b : bytes)
    if (byte_ids[static_cast<unsigned char>(b)] < 0) return false;
  return true;
}

std::string Tokenizer::Impl::normalize(std::string_view in) const {
  std::string s(in);
  for (const NormalizeStep& step : normalizers) {
    switch (step.kind) {
      case NormalizeStep::Kind::kReplace:
        replace_all(s, step.from, step.to);
        break;
      case NormalizeStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.to);  // Rust prepends to non-empty text only
        break;
      case NormalizeStep::Kind::kStrip: {
        const size_t begin = step.left ? skip_white_space(s, 0) : 0;
        const size_t end = step.right ? trim_white_space_end(s, begin, s.size()) : s.size();
        s = s.substr(begin, end - begin);
        break;
      }
    }
  }
  return s;
}

void Tokenizer::Impl::sp_encode_section(std::string_view section, bool first_section,
                                        std::vector<int32_t>& out) const {
  std::string normalized;
  std::string_view s = section;
  if (!normalizers.empty()) {
    normalized = normalize(section);
    s = normalized;
  }
  if (s.empty()) return;
  if (!metaspace) {
    split_and_encode(s, 0, out);
    return;
  }
  const Metaspace& m = *metaspace;
  std::string spaced(s);
  replace_all(spaced, " ", m.replacement);
  const bool prepend = m.prepend == Metaspace::Prepend::kAlways ||
                       (m.prepend == Metaspace::Prepend::kFirst && first_section);
  if (prepend && spaced.compare(0, m.replacement.size(), m.replacement) != 0)
    spaced.insert(0, m.replacement);
  if (!m.split) {
    sp_encode_piece(spaced, out);
    return;
  }
  // Split MergedWithNext on the replacement: each piece starts at one.
  const std::string_view v = spaced;
  size_t begin = 0;
  for (size_t at = v.find(m.replacement, 1); at != std::string_view::npos;
       at = v.find(m.replacement, at + m.replacement.size())) {
    sp_encode_piece(v.substr(begin, at - begin), out);
    begin = at;
  }
  sp_encode_piece(v.substr(begin), out);
}

// A pre-tokenized piece. Without a pre-tokenizer (Llama 2) it is the whole section, which BPE
// would take whole, uncached and in a heap. But a merge across "c▁" makes a token holding "c▁",
// and few characters c appear so in the vocabulary (none in Llama 2's, '>' in Gemma 3's): at
// every other such boundary the piece is cut into words, which is exact and lets the per-thread
// cache and the small-array BPE work.
void Tokenizer::Impl::sp_encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    const int32_t id = vocab_by_text.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (!cut_at_spaces) {
    sp_encode_word(piece, out);
    return;
  }
  size_t begin = 0;
  for (size_t at = piece.find(kSpaceMark, 1); at != std::string_view::npos;
       at = piece.find(kSpaceMark, at + 3)) {
    size_t lead = at - 1;  // the character before: back over its continuation bytes
    while (lead > begin && at - lead < 4 &&
           (static_cast<unsigned char>(piece[lead]) & 0xC0) == 0x80)
      --lead;
    uint32_t cp;
    if (at > begin && single_code_point(piece.substr(lead, at - lead), cp) && cp < kBmpSize &&
        cp != kSpaceMarkCp && bmp_char_ids[cp] >= 0 && !precedes_space_in_vocab[cp]) {
      sp_encode_word(piece.substr(begin, at - begin), out);
      begin = at;
    }
  }
  sp_encode_word(piece.substr(begin), out);
}

void Tokenizer::Impl::sp_encode_word(std::string_view word, std::vector<int32_t>& out) const {
  cached_encode(word, out, [&](std::string_view w, std::vector<int32_t>& o) {
    thread_local std::vector<int32_t> sym;
    sp_initial_symbols(w, sym);
    if (sym.empty()) return;
    if (sym.size() > 64) {
      merge_symbols(sym, o);
      return;
    }
    int32_t rank[64], merged[64];
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const PairTable::Entry* e = merges.find(sym[i], sym[i + 1]);
      rank[i] = e ? e->rank : kNoRank;
      merged[i] = e ? e->merged : -1;
    }
    merge_ranked(sym.data(), rank, merged, sym.size(), o);
  });
}

// One symbol per character in the vocabulary; a character outside it becomes its UTF-8 bytes'
// <0xNN> tokens (byte_fallback) or the unknown token, consecutive unknowns as one (fuse_unk).
// Bytes that are not valid UTF-8 take the same way, so decode() shows them as U+FFFD.
void Tokenizer::Impl::sp_initial_symbols(std::string_view word, std::vector<int32_t>& sym) const {
  sym.clear();
  bool last_unknown = false;
  for (size_t i = 0; i < word.size();) {
    bool valid, incomplete;
    const size_t n = utf8_unit(word, i, valid, incomplete);
    int32_t id = -1;
    if (valid) {
      size_t j = i;
      const uint32_t cp = next_code_point(word, j);
      id = cp < kBmpSize ? bmp_char_ids[cp] : vocab_by_text.find(word.substr(i, n));
    }
    if (id >= 0) {
      sym.push_back(id);
      last_unknown = false;
    } else if (has_byte_tokens(word.substr(i, n))) {
      for (size_t k = i; k < i + n; ++k)
        sym.push_back(byte_ids[static_cast<unsigned char>(word[k])]);
      last_unknown = false;
    } else {
      if (!(fuse_unk && last_unknown)) sym.push_back(unk_id);
      last_unknown = true;
    }
    i += n;
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::string Tokenizer::Impl::decode_token_text(std::string_view token, bool first) const {
  std::string t(token);
  for (const TokenDecodeStep& step : token_decoders) {
    switch (step.kind) {
      case TokenDecodeStep::Kind::kReplace:
        replace_all(t, step.from, step.to);
        break;
      case TokenDecodeStep::Kind::kByteFallback: {
        unsigned char byte;
        // The byte alone: a run of byte tokens is decoded (U+FFFD for what is ill-formed) with
        // the rest of the text, as the JavaScript tokenizer's TextDecoder does. (Rust's gives one
        // U+FFFD per byte of an ill-formed run instead.)
        if (is_byte_token(t, byte)) t.assign(1, static_cast<char>(byte));
        break;
      }
      case TokenDecodeStep::Kind::kStrip: {
        size_t begin = 0, end = t.size();
        const std::string& c = step.content;
        for (size_t k = 0; k < step.start && t.compare(begin, c.size(), c) == 0; ++k)
          begin += c.size();
        for (size_t k = 0; k < step.stop && end >= begin + c.size() &&
                           t.compare(end - c.size(), c.size(), c) == 0;
             ++k)
          end -= c.size();
        t = t.substr(begin, end - begin);
        break;
      }
      case TokenDecodeStep::Kind::kMetaspace:
        // Rust: the first token loses every replacement character, the others become spaces.
        replace_all(t, step.from, first && step.metaspace_drops_first ? "" : " ");
        break;
    }
  }
  return t;
}

void Tokenizer::Impl::append_decoded(int32_t id, bool& first, size_t& strip_left,
                                     std::string& out) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_bytes.size()) return;
  std::string first_text;
  std::string_view bytes = id_to_bytes[static_cast<size_t>(id)];
  if (first && first_token_decodes_differently) {
    first_text = decode_token_text(id_to_text[static_cast<size_t>(id)], true);
    bytes = first_text;
  }
  first = false;
  const std::string& c = text_strip_content;
  while (strip_left > 0 && !bytes.empty() && bytes.substr(0, c.size()) == c) {
    bytes.remove_prefix(c.size());
    --strip_left;
  }
  if (!bytes.empty()) strip_left = 0;
  out.append(bytes);
}

}  // namespace blend
