// Tokenizer — byte-level BPE from a Hugging Face tokenizer.json (Llama-3, Qwen2, GPT-2 style).
//
// encode() runs the same pipeline as the Hugging Face and transformers.js tokenizers:
//   1. added tokens (tokenizer.json "added_tokens") are cut out of the text first, leftmost and
//      longest match first, honouring their lstrip/rstrip flags. With parse_special=false the
//      *special* ones are left as plain text (so user text cannot forge "<|eot_id|>"); added
//      tokens that are not special still match, as in Hugging Face's split_special_tokens.
//   2. the pre-tokenizer splits each remaining section: Split(Regex, Isolated) steps (PCRE2, UTF +
//      UCP, JIT), Digits, or ByteLevel(use_regex=true) with GPT-2's pattern. `\s` in a pattern
//      means Unicode White_Space, as in tiktoken and the Rust tokenizers (transformers.js differs
//      on U+0085 and U+FEFF; see tests/text/tokenizer_test.cc).
//   3. each piece becomes ids by BPE over its raw bytes: a piece that is itself in the vocabulary
//      is emitted as is when the model says `ignore_merges` (Llama-3); otherwise the adjacent pair
//      of lowest merge rank (leftmost on ties) is merged until none is left.
// Invalid UTF-8 in the input does not stop encode(): the regex skips such bytes
// (PCRE2_MATCH_INVALID_UTF) and they become their single-byte tokens, so decode() gives U+FFFD
// for them and nothing else is lost or shifted.
//
// decode() concatenates the tokens' bytes (added tokens verbatim) and replaces ill-formed UTF-8
// the way the WHATWG TextDecoder does (one U+FFFD per maximal ill-formed subpart). It applies no
// `clean_up_tokenization_spaces`, so decode(encode(text)) == text for valid UTF-8 text. Ids with no
// token (out of range, or holes in the id space) decode to nothing. SentencePiece-style files
// decode each token by their decoders (U+2581 -> space, <0xNN> -> its byte; an ill-formed run of
// byte tokens gets the TextDecoder's U+FFFDs, as in transformers.js, where Rust's tokenizers put
// one per byte) and strip the sequence's leading space where the file says so (Strip after Fuse,
// Metaspace). There decode(encode(text)) != text where the text holds U+2581 itself or, with a
// Prepend normalizer, where an added token starts a new section: so in the reference tokenizers.
//
// A Tokenizer is immutable after loading; encode() and decode() may run on many threads at once.
// Each thread keeps a small private cache of recent pieces per tokenizer (no locks).
//
// Supported tokenizer.json shapes: model.type BPE with a byte-level vocabulary; normalizer null,
// NFC, NFD, NFKC or NFKD, alone or in a Sequence (text/unicode_normalize.h; applied to each
// section between added tokens, as Hugging Face does for added tokens with normalized=false);
// pre_tokenizer Split (Isolated or MergedWithPrevious) / Digits / ByteLevel(add_prefix_space=
// false) alone or in a Sequence; decoder ByteLevel or null; post_processor as
// text/post_processor.h says. And SentencePiece-style BPE (Llama 2, Mistral 7B v0.x, Gemma;
// sentencepiece.cc): a vocabulary of text pieces with spaces as U+2581, BPE over characters,
// `byte_fallback` to <0xNN> tokens, `unk_token` and `fuse_unk`; normalizers Replace (String
// pattern) / Prepend / Strip in a Sequence (a Unicode form among them is refused); the Metaspace
// pre-tokenizer (replacement, prepend_scheme, split); decoders Replace / ByteFallback / Fuse /
// Strip / Metaspace in a Sequence. Anything else is a blend::Error naming the file and what it
// uses (and the field, for a wrong JSON type).
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
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static Tokenizer from_dir(const std::filesystem::path& dir);
  // tokenizer_config_json may be empty (then bos/eos strings are empty).
  static Tokenizer from_files(const std::filesystem::path& tokenizer_json,
                              const std::filesystem::path& tokenizer_config_json);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // parse_special: special tokens written in the text ("<|eot_id|>") become their ids.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // ids with the special tokens tokenizer.json's post-processor adds to a single sequence, as
  // transformers' add_special_tokens=True does (text/post_processor.h: Meta's Llama-3.x files
  // put BOS first). A BOS the ids already start with is not added twice.
  std::vector<int32_t> add_special_tokens(std::vector<int32_t> ids) const;

  // The token as tokenizer.json writes it: byte-level form for the vocabulary ("Ġhello"), the
  // content for added tokens. Empty for ids with no token.
  std::string_view token_text(int32_t id) const;
  // The raw bytes a token stands for (" hello"; added tokens: their content).
  const std::string& token_bytes(int32_t id) const;
  // By the token_text() form: vocabulary entries and added tokens.
  std::optional<int32_t> token_id(std::string_view token) const;
  // One past the largest id, added tokens included (128256 for Llama-3).
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;
  // From tokenizer_config.json; empty when it names none.
  const std::string& bos_token() const;
  const std::string& eos_token() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static Tokenizer load(const std::filesystem::path& tokenizer_json,
                        const std::filesystem::path& tokenizer_config_json);
  std::unique_ptr<Impl> impl_;
  friend class IncrementalDetokenizer;
};

// Replaces ill-formed UTF-8 with U+FFFD (WHATWG "maximal subpart" rule, as TextDecoder does).
std::string sanitize_utf8(std::string_view bytes);

// Streaming detokenizer: push ids one at a time; the returned text never ends inside a UTF-8
// character (incomplete bytes wait for the next token, e.g. the <0xNN> byte tokens of one
// character); bytes that can no longer become valid are emitted as U+FFFD.
// from_sequence_start: the ids start a sequence, and concatenating every push() and flush()
// equals decode() of all ids. Otherwise (the default: the engine's generated tokens, which
// continue a prompt) the first id is not the sequence's first token, so the decoders that treat
// that one specially (SentencePiece's Metaspace, a Strip of the leading space) leave it alone:
// "▁Hello" after a prompt is " Hello", as vLLM streams it.
// The tokenizer must outlive the detokenizer.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false,
                                  bool from_sequence_start = false);
  std::string push(int32_t id);
  // Emits what is held back (an incomplete character becomes U+FFFD) and resets.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  bool first_;           // the next token is the sequence's first
  size_t strip_left_;    // leading characters a Strip decoder still removes
  std::string pending_;  // bytes of an incomplete trailing character
};

}  // namespace blend
