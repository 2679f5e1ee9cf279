// Tokenizer — byte-level BPE from a Hugging Face tokenizer.json (Llama-3, Qwen2, GPT-2 style):
// added/special tokens matched first, then the pre-tokenizer's Split regex (PCRE2, UTF + UCP,
// JIT), then BPE merges by rank over raw bytes, honouring `ignore_merges` (a whole pre-token
// found in the vocabulary is emitted as is). decode() maps ids back to bytes and replaces
// invalid UTF-8 the way WHATWG TextDecoder does (one U+FFFD per maximal ill-formed subpart).
// decode() applies no `clean_up_tokenization_spaces`: text round-trips exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace blend {

class Tokenizer {
 public:
  static Tokenizer from_dir(const std::filesystem::path& dir);
  // tokenizer_config_json may be empty (then bos/eos strings are empty).
  static Tokenizer from_files(const std::filesystem::path& tokenizer_json,
                              const std::filesystem::path& tokenizer_config_json);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // parse_special: added tokens written in the text ("<|eot_id|>") become their ids.
  // Invalid UTF-8 bytes are encoded as their byte tokens (no crash, no loss).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Raw bytes of a token (added tokens: their content). Empty for ids out of range.
  const std::string& token_bytes(int32_t id) const;
  std::optional<int32_t> token_id(std::string_view token) const;  // by vocab/added string
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Replaces ill-formed UTF-8 with U+FFFD (WHATWG "maximal subpart" rule).
std::string sanitize_utf8(std::string_view bytes);

// Streaming detokenizer: push ids one at a time; the returned text never ends inside a UTF-8
// character (incomplete bytes wait for the next token); bytes that can no longer become valid
// are emitted as U+FFFD. Concatenating every push() and flush() equals decode() of all ids.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete trailing character
};

}  // namespace blend
