#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
#include <cstring>
#include <fstream>
#include <limits>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend {
namespace {

using nlohmann::json;

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = direct ? b : next++;
  }
  return table;
}

// The WHATWG UTF-8 decoder's view of the bytes at s[i..]: the length of a valid character,
// or of the maximal ill-formed subpart (to be replaced by one U+FFFD). `incomplete` is set when
// the bytes are a valid prefix cut short by the end of the buffer.
size_t utf8_unit(std::string_view s, size_t i, bool& valid, bool& incomplete) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  valid = false;
  incomplete = false;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    valid = true;
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;  // invalid lead byte
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      incomplete = true;
      return k;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return k;  // the subpart ends before this byte
    lo = 0x80;
    hi = 0xBF;
  }
  valid = true;
  return need + 1;
}

// Decodes the character at s[i..] (or U+FFFD for an ill-formed subpart) and advances i.
uint32_t next_code_point(std::string_view s, size_t& i) {
  bool valid, incomplete;
  const size_t n = utf8_unit(s, i, valid, incomplete);
  uint32_t cp = 0xFFFD;
  if (valid) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    cp = n == 1 ? b0 : b0 & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  }
  i += n;
  return cp;
}

void append_replacement(std::string& out) {
  out += "\xEF\xBF\xBD";
}

// Unicode White_Space (what lstrip/rstrip of added tokens strip, as Rust's char::is_whitespace).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

size_t skip_white_space(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t j = i;
    if (!is_white_space(next_code_point(s, j))) break;
    i = j;
  }
  return i;
}

// End of s[begin, end) once trailing white space is removed.
size_t trim_white_space_end(std::string_view s, size_t begin, size_t end) {
  while (end > begin) {
    // The last character starts at the last byte that is not a continuation byte.
    size_t k = end - 1;
    while (k > begin && end - k < 4 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t after = k;
    const uint32_t cp = next_code_point(s, after);
    if (after != end || !is_white_space(cp)) break;
    end = k;
  }
  return end;
}

// ---------------------------------------------------------------------------------------------
// Hashing and flat tables: the vocabulary and merge lookups are the inner loop of BPE, so they
// avoid std::string temporaries and node-based maps.

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 32;
  return x;
}

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix64(h ^ w) + 0x9E3779B97F4A7C15ull;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  return mix64(h ^ w);
}

size_t table_capacity(size_t n) {
  size_t cap = 16;
  while (cap < n + n / 2 + 1) cap <<= 1;
  return cap;
}

// String -> id, open addressing; the keys live in a vector owned by the caller (indexed by id).
class StringIdTable {
 public:
  void init(const std::vector<std::string>* keys, size_t expected) {
    keys_ = keys;
    slots_.assign(table_capacity(expected), 0);
    mask_ = slots_.size() - 1;
  }
  // Inserts id under (*keys_)[id]; an existing entry with the same key is replaced.
  void insert(int32_t id) {
    const std::string& key = (*keys_)[static_cast<size_t>(id)];
    const uint64_t h = hash_bytes(key);
    const uint64_t tag = h >> 32;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      uint64_t& slot = slots_[i];
      if (slot == 0 || ((slot >> 32) == tag && (*keys_)[static_cast<uint32_t>(slot) - 1] == key)) {
        slot = (tag << 32) | (static_cast<uint64_t>(id) + 1);
        return;
      }
    }
  }
  int32_t find(std::string_view key) const {
    const uint64_t h = hash_bytes(key);
    const uint64_t tag = h >> 32;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const uint64_t slot = slots_[i];
      if (slot == 0) return -1;
      const auto id = static_cast<uint32_t>(slot) - 1;
      if ((slot >> 32) == tag && (*keys_)[id] == key) return static_cast<int32_t>(id);
    }
  }

 private:
  const std::vector<std::string>* keys_ = nullptr;
  std::vector<uint64_t> slots_;  // (hash >> 32) << 32 | (id + 1); 0 = empty
  size_t mask_ = 0;
};

// (left id, right id) -> (merge rank, merged id), open addressing.
class PairTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = kNoRank;
    int32_t merged = -1;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  void init(size_t expected) {
    entries_.assign(table_capacity(expected), Entry{});
    mask_ = entries_.size() - 1;
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // A pair listed twice keeps its last rank (as the Rust and JavaScript tokenizers do).
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t k = key(a, b);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      Entry& e = entries_[i];
      if (e.key == kEmpty || e.key == k) {
        e = Entry{k, rank, merged};
        return;
      }
    }
  }
  const Entry* find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = mix64(k) & mask_;; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == k) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }

 private:
  std::vector<Entry> entries_;
  size_t mask_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Per-thread cache of piece -> ids. Direct-mapped fixed-size slots: no allocation after the
// first use, bounded memory (256 KiB per thread and tokenizer), no locks. Tokenizers are told
// apart by a serial number that is never reused, so a cache never outlives its meaning.

constexpr size_t kMaxCachedKey = 22;
constexpr size_t kMaxCachedIds = 8;
constexpr size_t kCacheSlots = 4096;
struct CacheSlot {
  uint64_t hash = 0;
  uint8_t key_len = 0;  // 0 = empty (empty pieces are never cached)
  uint8_t n_ids = 0;
  char key[kMaxCachedKey] = {};
  int32_t ids[kMaxCachedIds] = {};
};
static_assert(sizeof(CacheSlot) == 64);

std::atomic<uint64_t> next_tokenizer_serial{1};

CacheSlot* thread_cache(uint64_t serial) {
  struct Entry {
    uint64_t serial = 0;
    uint64_t last_use = 0;
    std::unique_ptr<CacheSlot[]> slots;
  };
  thread_local std::array<Entry, 4> entries;
  thread_local uint64_t clock = 0;
  ++clock;
  Entry* victim = &entries[0];
  for (Entry& e : entries) {
    if (e.serial == serial) {
      e.last_use = clock;
      return e.slots.get();
    }
    if (e.last_use < victim->last_use) victim = &e;
  }
  if (!victim->slots) victim->slots = std::make_unique<CacheSlot[]>(kCacheSlots);
  std::fill(victim->slots.get(), victim->slots.get() + kCacheSlots, CacheSlot{});
  victim->serial = serial;
  victim->last_use = clock;
  return victim->slots.get();
}

// ---------------------------------------------------------------------------------------------
// The pre-tokenizer regex.

// `\s` / `\S` -> Unicode White_Space. PCRE2's UCP `\s` also takes U+180E, which Unicode no longer
// counts as white space and neither tiktoken (Llama-3's own tokenizer) nor the Rust tokenizers do.
std::string translate_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char c = pattern[++i];
    if (c == 's') {
      out += "\\p{White_Space}";
    } else if (c == 'S') {
      out += "\\P{White_Space}";
    } else {
      out.push_back('\\');
      out.push_back(c);
    }
  }
  return out;
}

// Owns a compiled PCRE2 pattern; each thread gets its own match data and JIT stack.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    // UCP is not allowed (nor needed) with LITERAL.
    const uint32_t flags =
        PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    const std::string source = literal ? pattern : translate_pattern(pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), flags, &err,
                          &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(where + ": pre-tokenizer regex does not compile: " +
                  reinterpret_cast<char*>(msg) + " (in " + pattern + ")");
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(begin, end) for every piece of text in order: the matches and, since Split's
  // behaviour is Isolated, the non-empty gaps between them.
  template <typename F>
  void for_each_piece(std::string_view text, F&& f) const {
    Thread& t = thread_state();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0, last = 0;
    while (start < text.size()) {
      int rc = PCRE2_ERROR_NOMATCH;
      if (jit_) rc = pcre2_jit_match(code_, subject, text.size(), start, 0, t.data, t.context);
      // The interpreter takes over when the JIT is unavailable or ran out of stack.
      if (!jit_ || (rc < 0 && rc != PCRE2_ERROR_NOMATCH))
        rc = pcre2_match(code_, subject, text.size(), start, 0, t.data, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw Error(std::string("tokenizer: pre-tokenizer regex failed: ") +
                    reinterpret_cast<char*>(msg));
      }
      // Copied out: f may run the next pre-tokenizer step, which reuses this thread's match data.
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(t.data);
      const size_t begin = ov[0], end = ov[1];
      if (begin == end) {  // empty match: step over one character
        start = begin + 1;
        while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
          ++start;
        continue;
      }
      if (begin > last) f(last, begin);
      f(begin, end);
      start = last = end;
    }
    if (last < text.size()) f(last, text.size());
  }

 private:
  struct Thread {
    pcre2_match_data* data = nullptr;
    pcre2_jit_stack* stack = nullptr;
    pcre2_match_context* context = nullptr;
    Thread() {
      data = pcre2_match_data_create(1, nullptr);
      // The default 32 KiB JIT stack is too small for very long runs of one character class.
      stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
      context = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~Thread() {
      pcre2_match_context_free(context);
      pcre2_jit_stack_free(stack);
      pcre2_match_data_free(data);
    }
  };
  static Thread& thread_state() {
    thread_local Thread t;
    return t;
  }

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ---------------------------------------------------------------------------------------------
// Loading

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path.string());
  std::string text;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size > 0) {
    text.resize(static_cast<size_t>(size));
    in.seekg(0);
    in.read(text.data(), size);
  }
  if (!in) throw Error("cannot read " + path.string());
  return text;
}

json read_json(const std::filesystem::path& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw Error(path.string() + ": invalid JSON: " + e.what());
  }
}

// tokenizer.json with its two big members, model.vocab (object) and model.merges (array), read
// straight into vectors by a SAX parser: building them as a DOM first took four times longer
// than parsing (nlohmann keeps objects in std::map). Everything else becomes an ordinary DOM.
struct TokenizerFile {
  json rest;  // the document without model.vocab / model.merges when those were captured
  bool has_vocab = false, has_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

class TokenizerSax : public json::json_sax_t {
 public:
  explicit TokenizerSax(TokenizerFile& out) : out_(out) {}
  std::string error;

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(json::number_integer_t v) override { return integer(v); }
  bool number_unsigned(json::number_unsigned_t v) override {
    return integer(v > static_cast<json::number_unsigned_t>(INT64_MAX) ? -1
                                                                       : static_cast<int64_t>(v));
  }
  bool number_float(json::number_float_t v, const json::string_t&) override {
    return value(json(v));
  }
  bool binary(json::binary_t&) override { return fail("unexpected binary value"); }
  bool string(json::string_t& v) override {
    if (mode() == Mode::kMerges) {
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        return fail("malformed merge '" + v + "'");
      out_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (mode() == Mode::kMergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return value(json(std::move(v)));
  }
  bool start_object(std::size_t) override {
    if (at_model_member("vocab")) {
      out_.has_vocab = true;
      frames_.push_back({nullptr, {}, Mode::kVocab});
      return true;
    }
    if (mode() != Mode::kDom) return fail("unexpected object in model.vocab or model.merges");
    frames_.push_back({place(json::object()), {}, Mode::kDom});
    return true;
  }
  bool key(json::string_t& k) override {
    frames_.back().key = std::move(k);
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (at_model_member("merges")) {
      out_.has_merges = true;
      frames_.push_back({nullptr, {}, Mode::kMerges});
      return true;
    }
    if (mode() == Mode::kMerges) {
      pair_.clear();
      frames_.push_back({nullptr, {}, Mode::kMergePair});
      return true;
    }
    if (mode() != Mode::kDom) return fail("unexpected array in model.vocab or model.merges");
    frames_.push_back({place(json::array()), {}, Mode::kDom});
    return true;
  }
  bool end_array() override {
    if (mode() == Mode::kMergePair) {
      if (pair_.size() != 2) return fail("a merge is not a pair of strings");
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
    }
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(std::string("invalid JSON: ") + e.what());
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };
  struct Frame {
    json* node;       // the DOM container being filled (kDom only)
    std::string key;  // the current key, in objects
    Mode mode;
  };

  Mode mode() const { return frames_.empty() ? Mode::kDom : frames_.back().mode; }
  bool fail(std::string message) {
    if (error.empty()) error = std::move(message);
    return false;
  }
  // True when the next value is the top-level "model" object's member `name`.
  bool at_model_member(const char* name) const {
    return frames_.size() == 2 && frames_[0].mode == Mode::kDom && frames_[0].node->is_object() &&
           frames_[0].key == "model" && frames_[1].mode == Mode::kDom &&
           frames_[1].node->is_object() && frames_[1].key == name;
  }
  bool integer(int64_t v) {
    if (mode() == Mode::kVocab) {
      out_.vocab.emplace_back(std::move(frames_.back().key), v);
      return true;
    }
    return value(json(v));
  }
  bool value(json v) {
    if (mode() != Mode::kDom) return fail("unexpected value in model.vocab or model.merges");
    place(std::move(v));
    return true;
  }
  // Puts v where the parser is (the root, the end of an array, or under the current key).
  json* place(json v) {
    if (frames_.empty()) {
      out_.rest = std::move(v);
      return &out_.rest;
    }
    Frame& top = frames_.back();
    if (top.node->is_array()) {
      top.node->push_back(std::move(v));
      return &top.node->back();
    }
    json& slot = (*top.node)[top.key];
    slot = std::move(v);
    return &slot;
  }

  TokenizerFile& out_;
  std::vector<Frame> frames_;
  std::vector<std::string> pair_;
};

TokenizerFile read_tokenizer_file(const std::filesystem::path& path) {
  const std::string text = read_file(path);
  TokenizerFile file;
  TokenizerSax sax(file);
  bool ok = false;
  try {
    ok = json::sax_parse(text, &sax);
  } catch (const json::exception& e) {
    sax.error = std::string("invalid JSON: ") + e.what();
  }
  if (!ok) throw Error(path.string() + ": " + (sax.error.empty() ? "invalid JSON" : sax.error));
  return file;
}

std::string token_string(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex=true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> id_to_bytes;  // raw bytes of every id (added tokens: content)
  std::vector<std::string> id_to_text;   // as tokenizer.json writes it
  StringIdTable vocab_by_bytes;          // model vocabulary only, by raw bytes
  StringIdTable by_text;                 // vocabulary and added tokens, by id_to_text
  PairTable merges;
  int32_t byte_ids[256] = {};
  // The merges of every byte pair, dense: the first round of BPE looks up every adjacent pair of
  // bytes, and a 512 KiB array stays in cache where the 8 MiB hash table does not.
  std::vector<std::pair<int32_t, int32_t>> byte_pair_merges;  // [a * 256 + b] = (rank, merged)
  std::vector<AddedToken> added;                              // longest first
  // Added tokens by their first byte. `second` holds their second bytes, so that the scan over
  // the text rejects most candidates ("<" in code is seldom "<|") without comparing strings.
  struct AddedBucket {
    std::vector<uint16_t> tokens;  // indexes into `added`, longest first
    std::bitset<256> second;
    bool single_byte = false;
  };
  std::array<AddedBucket, 256> added_by_first_byte;
  std::vector<bool> special;
  std::vector<std::unique_ptr<Regex>> splits;  // applied in order; none: one piece per section
  bool ignore_merges = false;
  std::string bos, eos;
  uint64_t serial = next_tokenizer_serial.fetch_add(1);

  void encode_section(std::string_view text, std::vector<int32_t>& out) const;
  void split_and_encode(std::string_view text, size_t step, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_small(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_large(std::string_view piece, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::encode_section(std::string_view text, std::vector<int32_t>& out) const {
  if (!text.empty()) split_and_encode(text, 0, out);
}

void Tokenizer::Impl::split_and_encode(std::string_view text, size_t step,
                                       std::vector<int32_t>& out) const {
  if (step == splits.size()) {
    encode_piece(text, out);
    return;
  }
  splits[step]->for_each_piece(
      text, [&](size_t b, size_t e) { split_and_encode(text.substr(b, e - b), step + 1, out); });
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
  const uint64_t h = hash_bytes(piece);
  CacheSlot& slot = thread_cache(serial)[h & (kCacheSlots - 1)];
  if (slot.hash == h && slot.key_len == piece.size() &&
      std::memcmp(slot.key, piece.data(), piece.size()) == 0) {
    out.insert(out.end(), slot.ids, slot.ids + slot.n_ids);
    return;
  }
  const size_t first = out.size();
  merge_small(piece, out);
  const size_t n = out.size() - first;
  if (n <= kMaxCachedIds) {
    slot.hash = h;
    slot.key_len = static_cast<uint8_t>(piece.size());
    slot.n_ids = static_cast<uint8_t>(n);
    std::memcpy(slot.key, piece.data(), piece.size());
    std::copy(out.begin() + static_cast<ptrdiff_t>(first), out.end(), slot.ids);
  }
}

// BPE for pieces of at most 64 bytes: symbols in an array, the rank of each adjacent pair next
// to it, a linear scan for the lowest (leftmost on ties). Quadratic, but on tiny arrays that
// stay in L1 this beats a heap.
void Tokenizer::Impl::merge_small(std::string_view piece, std::vector<int32_t>& out) const {
  int32_t sym[64], rank[64], merged[64];
  size_t n = piece.size();
  for (size_t i = 0; i < n; ++i) sym[i] = byte_ids[static_cast<unsigned char>(piece[i])];
  auto lookup = [&](size_t i) {
    const PairTable::Entry* e = merges.find(sym[i], sym[i + 1]);
    rank[i] = e ? e->rank : kNoRank;
    merged[i] = e ? e->merged : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) {
    const auto& m = byte_pair_merges[static_cast<unsigned char>(piece[i]) * 256 +
                                     static_cast<unsigned char>(piece[i + 1])];
    rank[i] = m.first;
    merged[i] = m.second;
  }
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
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<int32_t> sym(piece.size()), next(piece.size()), prev(piece.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)] =
        byte_ids[static_cast<unsigned char>(piece[static_cast<size_t>(i)])];
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

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  const auto config = dir / "tokenizer_config.json";
  return from_files(dir / "tokenizer.json",
                    std::filesystem::exists(config) ? config : std::filesystem::path());
}

Tokenizer Tokenizer::from_files(const std::filesystem::path& tokenizer_json,
                                const std::filesystem::path& tokenizer_config_json) {
  const std::string where = tokenizer_json.string();
  TokenizerFile file = read_tokenizer_file(tokenizer_json);
  const json& j = file.rest;
  auto impl = std::make_unique<Impl>();
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw Error(where + ": missing 'model'");
  const json& model = j["model"];
  if (model.contains("type") && model["type"] != "BPE")
    throw Error(where + ": only BPE tokenizers are supported, not " + model["type"].dump());
  if (!file.has_vocab) throw Error(where + ": missing model.vocab");
  if (model.contains("merges") && !model["merges"].is_null())
    throw Error(where + ": model.merges is not an array");
  if (model.value("byte_fallback", false))
    throw Error(where + ": BPE with byte_fallback (SentencePiece style) is not supported");
  impl->ignore_merges = model.value("ignore_merges", false);
  const json empty_array = json::array();
  const json& added_json =
      j.contains("added_tokens") && !j["added_tokens"].is_null() ? j["added_tokens"] : empty_array;
  if (!added_json.is_array()) throw Error(where + ": 'added_tokens' is not an array");

  // Ids: the vocabulary's and the added tokens'; the largest one sizes the tables.
  int64_t max_id = -1;
  auto check_id = [&](int64_t id) {
    if (id < 0 || id >= (1 << 30)) throw Error(where + ": bad token id " + std::to_string(id));
    max_id = std::max(max_id, id);
  };
  for (const auto& entry : file.vocab) check_id(entry.second);
  for (const auto& a : added_json) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string())
      throw Error(where + ": malformed added token " + a.dump());
    check_id(a["id"].get<int64_t>());
  }
  const auto n_ids = static_cast<size_t>(max_id + 1);
  impl->id_to_bytes.resize(n_ids);
  impl->id_to_text.resize(n_ids);
  impl->special.assign(n_ids, false);
  impl->vocab_by_bytes.init(&impl->id_to_bytes, file.vocab.size());
  impl->by_text.init(&impl->id_to_text, file.vocab.size() + added_json.size());

  // The vocabulary is stored in GPT-2's byte-to-unicode alphabet; keep the raw bytes too.
  const std::array<uint32_t, 256> b2u = bytes_to_unicode();
  std::array<int16_t, 512> u2b;
  u2b.fill(-1);
  for (size_t b = 0; b < 256; ++b) u2b[b2u[b]] = static_cast<int16_t>(b);
  for (auto& [tok, id64] : file.vocab) {
    const auto id = static_cast<size_t>(id64);
    std::string raw;
    raw.reserve(tok.size());
    for (size_t i = 0; i < tok.size();) {
      const uint32_t cp = next_code_point(tok, i);
      if (cp >= u2b.size() || u2b[cp] < 0)
        throw Error(where + ": vocabulary entry '" + tok +
                    "' is not byte-level (only byte-level BPE is supported)");
      raw.push_back(static_cast<char>(u2b[cp]));
    }
    if (!impl->id_to_bytes[id].empty())
      throw Error(where + ": token id " + std::to_string(id) + " is used twice");
    impl->id_to_text[id] = std::move(tok);
    impl->id_to_bytes[id] = std::move(raw);
    impl->vocab_by_bytes.insert(static_cast<int32_t>(id));
    impl->by_text.insert(static_cast<int32_t>(id));
  }
  file.vocab = {};
  for (int b = 0; b < 256; ++b) {
    const int32_t id =
        impl->vocab_by_bytes.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (id < 0)
      throw Error(where + ": the vocabulary lacks the token of byte " + std::to_string(b));
    impl->byte_ids[b] = id;
  }

  impl->merges.init(file.merges.size());
  int32_t rank = 0;
  std::string joined;
  for (const auto& [a, b] : file.merges) {
    joined.assign(a).append(b);
    const int32_t ia = impl->by_text.find(a), ib = impl->by_text.find(b),
                  im = impl->by_text.find(joined);
    if (ia < 0 || ib < 0 || im < 0)
      throw Error(where + ": merge '" + a + " " + b + "' names tokens outside the vocabulary");
    impl->merges.insert(ia, ib, rank++, im);
  }
  file.merges = {};
  impl->byte_pair_merges.resize(256 * 256);
  for (size_t a = 0; a < 256; ++a) {
    for (size_t b = 0; b < 256; ++b) {
      const PairTable::Entry* e = impl->merges.find(impl->byte_ids[a], impl->byte_ids[b]);
      impl->byte_pair_merges[a * 256 + b] =
          e ? std::make_pair(e->rank, e->merged) : std::make_pair(kNoRank, int32_t{-1});
    }
  }

  for (const auto& a : added_json) {
    AddedToken t;
    t.content = a["content"].get<std::string>();
    t.id = static_cast<int32_t>(a["id"].get<int64_t>());
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    const auto id = static_cast<size_t>(t.id);
    impl->id_to_bytes[id] = t.content;
    impl->id_to_text[id] = t.content;
    impl->special[id] = t.special;
    impl->by_text.insert(t.id);
    if (!t.content.empty()) impl->added.push_back(std::move(t));
  }
  if (impl->added.size() > std::numeric_limits<uint16_t>::max())
    throw Error(where + ": too many added tokens");
  std::stable_sort(
      impl->added.begin(), impl->added.end(),
      [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const std::string& c = impl->added[i].content;
    Impl::AddedBucket& bucket = impl->added_by_first_byte[static_cast<unsigned char>(c[0])];
    bucket.tokens.push_back(static_cast<uint16_t>(i));
    if (c.size() == 1) {
      bucket.single_byte = true;
    } else {
      bucket.second.set(static_cast<unsigned char>(c[1]));
    }
  }

  // Normalizer: none, or NFC (taken as already applied; see the header).
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& norm = j["normalizer"];
    if (!norm.is_object() || norm.value("type", "") != "NFC")
      throw Error(where + ": unsupported normalizer " + norm.dump().substr(0, 200));
  }

  // Pre-tokenizer: Split(regex or string, Isolated), Digits, ByteLevel; alone or in a Sequence.
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
      throw Error(where + ": Sequence pre-tokenizer without 'pretokenizers'");
    for (const auto& p : pre["pretokenizers"]) steps.push_back(p);
  } else if (pre.is_object()) {
    steps.push_back(pre);
  } else if (!pre.is_null()) {
    throw Error(where + ": malformed pre_tokenizer");
  }
  for (const auto& p : steps) {
    const std::string type = p.is_object() ? p.value("type", "") : "";
    if (type == "Split") {
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
        throw Error(where + ": only Split with behavior Isolated (not inverted) is supported");
      const json& pat = p.contains("pattern") ? p["pattern"] : json();
      if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
        impl->splits.push_back(
            std::make_unique<Regex>(pat["Regex"].get<std::string>(), false, where));
      } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
        impl->splits.push_back(
            std::make_unique<Regex>(pat["String"].get<std::string>(), true, where));
      } else {
        throw Error(where + ": Split pre-tokenizer without a Regex or String pattern");
      }
    } else if (type == "Digits") {
      const bool each = p.value("individual_digits", false);
      impl->splits.push_back(std::make_unique<Regex>(each ? "\\p{N}" : "\\p{N}+", false, where));
    } else if (type == "ByteLevel") {
      if (p.value("add_prefix_space", false))
        throw Error(where + ": ByteLevel pre-tokenizer with add_prefix_space is not supported");
      if (p.value("use_regex", true))
        impl->splits.push_back(std::make_unique<Regex>(kGpt2Pattern, false, where));
    } else {
      throw Error(where + ": unsupported pre-tokenizer '" + (type.empty() ? p.dump() : type) + "'");
    }
  }
  if (j.contains("decoder") && !j["decoder"].is_null() &&
      (!j["decoder"].is_object() || j["decoder"].value("type", "") != "ByteLevel"))
    throw Error(where + ": unsupported decoder " + j["decoder"].dump().substr(0, 200));

  if (!tokenizer_config_json.empty()) {
    const json c = read_json(tokenizer_config_json);
    if (!c.is_object()) throw Error(tokenizer_config_json.string() + ": not a JSON object");
    if (c.contains("bos_token")) impl->bos = token_string(c["bos_token"]);
    if (c.contains("eos_token")) impl->eos = token_string(c["eos_token"]);
  }
  return Tokenizer(std::move(impl));
}

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
    im.encode_section(text.substr(start, end - start), out);
    out.push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip) i = skip_white_space(text, i);
    start = i;
  }
  im.encode_section(text.substr(start), out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return sanitize_utf8(bytes);
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

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return "";
  pending_ += tokenizer_->token_bytes(id);
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
