// Internal to the tokenizer: what a loaded Tokenizer holds (tokenizer_load.cc fills it,
// tokenizer.cc encodes and decodes with it).
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
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
  std::vector<tok::NormalForm> normal_forms;  // the normalizer: applied in order to each section
  tok::PostProcessor post_processor;          // add_special_tokens' prefix and suffix
  std::string bos, eos;
  uint64_t serial = tok::next_tokenizer_serial.fetch_add(1);

  // Loading steps, in this order (tokenizer_load.cc); each throws blend::Error naming `where`.
  void load_vocab(std::vector<std::pair<std::string, int64_t>> vocab, const nlohmann::json& added,
                  const std::string& where);
  void load_merges(std::vector<std::pair<std::string, std::string>> list, const std::string& where);
  void load_added_tokens(const nlohmann::json& added, const std::string& where);
  void load_pipeline(const nlohmann::json& tokenizer_json, const std::string& where);
  void load_normalizer(const nlohmann::json& normalizer, const std::string& where);

  void encode_section(std::string_view text, std::vector<int32_t>& out) const;
  void split_and_encode(std::string_view text, size_t step, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_small(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_large(std::string_view piece, std::vector<int32_t>& out) const;
};

}  // namespace blend
