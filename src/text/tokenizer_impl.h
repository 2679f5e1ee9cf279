// Internal to the tokenizer: what a loaded Tokenizer holds (tokenizer_load.cc fills it,
// tokenizer.cc encodes and decodes with it).
#pragma once

#include <algorithm>
#include <array>
#include <bitset>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/bpe_tables.h"
#include "text/post_processor.h"
#include "text/pretokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode_normalize.h"

namespace blend {

namespace tok {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

// Members of tokenizer.json read with their type checked: a wrong JSON type is an error naming
// the file and the field. `field` is where `obj` is ("model.").
bool flag(const nlohmann::json& obj, const char* key, bool dflt, const std::string& where,
          const std::string& field);
std::string text(const nlohmann::json& obj, const char* key, const std::string& where,
                 const std::string& field);

// SentencePiece-style pipeline steps (sentencepiece.cc). Normalizers run in order on each
// section of text between added tokens.
struct NormalizeStep {
  enum class Kind { kReplace, kPrepend, kStrip } kind;
  std::string from, to;  // kReplace: every `from` becomes `to`; kPrepend: `to` goes first
  bool left = false, right = false;  // kStrip: which ends lose their white space
};

// The Metaspace pre-tokenizer: spaces become `replacement`, which is prepended to the first
// section of the input (kFirst), to every section (kAlways) or never; with `split`, each
// piece starts at a replacement character.
struct Metaspace {
  enum class Prepend { kFirst, kAlways, kNever } prepend = Prepend::kAlways;
  std::string replacement = "\xe2\x96\x81";  // U+2581
  bool split = true;
};

// A decoder step applied to each token's text before the tokens are fused (Replace, ByteFallback,
// Strip, Metaspace).
struct TokenDecodeStep {
  enum class Kind { kReplace, kByteFallback, kStrip, kMetaspace } kind;
  std::string from, to;               // kReplace; kMetaspace: from = the replacement
  std::string content;                // kStrip: the character stripped
  size_t start = 0, stop = 0;         // kStrip: at most this many from each end
  bool metaspace_drops_first = true;  // kMetaspace: the first token loses its replacements
};

}  // namespace tok

struct Tokenizer::Impl {
  std::vector<std::string> id_to_bytes;  // raw bytes of every id (added tokens: content)
  std::vector<std::string> id_to_text;   // as tokenizer.json writes it
  tok::StringIdTable vocab_by_bytes;     // model vocabulary only, by raw bytes
  tok::StringIdTable by_text;            // vocabulary and added tokens, by id_to_text
  tok::PairTable merges;
  int32_t byte_ids[256] = {};
  // The merges of every byte pair, dense: the first round of BPE looks up every adjacent pair of
  // bytes, and a 512 KiB array stays in cache where the 8 MiB hash table does not.
  std::vector<std::pair<int32_t, int32_t>> byte_pair_merges;  // [a * 256 + b] = (rank, merged)
  std::vector<tok::AddedToken> added;                         // longest first
  // Added tokens by their first byte. `second` holds their second bytes, so that the scan over
  // the text rejects most candidates ("<" in code is seldom "<|") without comparing strings.
  struct AddedBucket {
    std::vector<uint16_t> tokens;  // indexes into `added`, longest first
    std::bitset<256> second;
    bool single_byte = false;
  };
  std::array<AddedBucket, 256> added_by_first_byte;
  std::vector<bool> special;
  std::vector<std::unique_ptr<tok::Regex>> splits;  // applied in order; none: one piece per section
  bool ignore_merges = false;
  // Split steps with behavior MergedWithPrevious (the match ends its piece); parallel to splits.
  std::vector<bool> split_merges_with_previous;
  std::vector<tok::NormalForm> normal_forms;  // the normalizer: applied in order to each section
  tok::PostProcessor post_processor;          // add_special_tokens' prefix and suffix
  std::string bos, eos;

  // SentencePiece-style BPE (sentencepiece.cc): a vocabulary of text pieces (spaces as U+2581)
  // instead of GPT-2's byte alphabet, BPE over characters, characters outside the vocabulary
  // as <0xNN> byte tokens (byte_fallback) or the unknown token, normalizers and decoders that
  // rewrite spaces.
  bool sentencepiece = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  int32_t unk_id = -1;
  std::string unk_token;  // model.unk_token, looked up once the added tokens are in
  std::vector<tok::NormalizeStep> normalizers;
  std::unique_ptr<tok::Metaspace> metaspace;  // null: no Metaspace pre-tokenizer
  std::vector<tok::TokenDecodeStep> token_decoders;
  // Strip after Fuse: up to text_strip_start copies of text_strip_content leave the start of
  // the decoded text.
  std::string text_strip_content;
  size_t text_strip_start = 0;
  bool first_token_decodes_differently = false;  // a Metaspace decoder that drops the prefix
  tok::StringIdTable vocab_by_text;              // model vocabulary only, by its text
  std::vector<int32_t> bmp_char_ids;             // [code point < 0x10000] -> id, or -1
  // Characters (below 0x10000) that some vocabulary entry holds right before U+2581: BPE never
  // merges across any other "c▁" boundary, so encode() cuts long pieces there (words, cached).
  std::vector<bool> precedes_space_in_vocab;
  bool cut_at_spaces = false;

  void load_sentencepiece_vocab(std::vector<std::pair<std::string, int64_t>> vocab,
                                const std::string& where);
  void load_sentencepiece_model(const nlohmann::json& model, const std::string& where);
  void load_normalizers(const nlohmann::json& normalizer, const std::string& where);
  void load_metaspace(const nlohmann::json& pre, const std::string& field,
                      const std::string& where);
  void load_decoders(const nlohmann::json& decoder, const std::string& where);
  void finish_sentencepiece(const std::string& where);
  std::string normalize(std::string_view text) const;
  void sp_encode_section(std::string_view text, bool first_section,
                         std::vector<int32_t>& out) const;
  void sp_encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void sp_encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void sp_initial_symbols(std::string_view word, std::vector<int32_t>& sym) const;
  bool has_byte_tokens(std::string_view bytes) const;
  // The text of a token once the per-token decoders ran; `first`: as the sequence's first token.
  std::string decode_token_text(std::string_view text, bool first) const;
  // Appends what `id` adds to a decoded text. `first` and `strip_left` carry the state of the
  // sequence (its first token, the leading characters a Strip decoder still removes).
  void append_decoded(int32_t id, bool& first, size_t& strip_left, std::string& out) const;
  uint64_t serial = tok::next_tokenizer_serial.fetch_add(1);

  // Loading steps, in this order (tokenizer_load.cc); each throws blend::Error naming `where`.
  void load_vocab(std::vector<std::pair<std::string, int64_t>> vocab, const nlohmann::json& added,
                  const std::string& where);
  void load_merges(std::vector<std::pair<std::string, std::string>> list, const std::string& where);
  void load_added_tokens(const nlohmann::json& added, const std::string& where);
  void load_pipeline(const nlohmann::json& tokenizer_json, const std::string& where);
  void load_normalizer(const nlohmann::json& normalizer, const std::string& where);

  // first_section: the text starts the input (Metaspace's prepend_scheme "first").
  void encode_section(std::string_view text, std::vector<int32_t>& out, bool first_section) const;
  void split_and_encode(std::string_view text, size_t step, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // encode(piece, out), through this thread's cache when the piece is short enough.
  template <typename F>
  void cached_encode(std::string_view piece, std::vector<int32_t>& out, F&& encode) const {
    if (piece.size() > tok::kMaxCachedKey) {
      encode(piece, out);
      return;
    }
    const uint64_t h = tok::hash_bytes(piece);
    tok::CacheSlot& slot = tok::thread_cache(serial)[h & (tok::kCacheSlots - 1)];
    if (slot.hash == h && slot.key_len == piece.size() &&
        std::memcmp(slot.key, piece.data(), piece.size()) == 0) {
      out.insert(out.end(), slot.ids, slot.ids + slot.n_ids);
      return;
    }
    const size_t first = out.size();
    encode(piece, out);
    const size_t n = out.size() - first;
    if (n <= tok::kMaxCachedIds) {
      slot.hash = h;
      slot.key_len = static_cast<uint8_t>(piece.size());
      slot.n_ids = static_cast<uint8_t>(n);
      std::memcpy(slot.key, piece.data(), piece.size());
      std::copy(out.begin() + static_cast<ptrdiff_t>(first), out.end(), slot.ids);
    }
  }
  void merge_small(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_large(std::string_view piece, std::vector<int32_t>& out) const;
  // BPE over symbols already chosen (ids): the loops of merge_small and merge_large.
  void merge_ranked(int32_t* sym, int32_t* rank, int32_t* merged, size_t n,
                    std::vector<int32_t>& out) const;
  void merge_symbols(std::vector<int32_t> sym, std::vector<int32_t>& out) const;
};

}  // namespace blend
