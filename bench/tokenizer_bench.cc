// Tokenizer encode speed, single thread.
//
//   tokenizer_bench [TOKENIZER_DIR] [TEXT_FILE] [--mb N] [--runs N]
//
// Without TEXT_FILE it generates N MB (default 8) of English-like text that is deliberately
// varied, so the per-thread piece cache and the vocabulary hit rate are not flattered by
// repetition: words are drawn Zipf-style from the tokenizer's own whole-word tokens (about 40k
// of them), a quarter of the words are made up of two or three stems glued together (rare
// words that miss the vocabulary and go through the BPE merges), with numbers, punctuation,
// contractions, capitals and one paragraph in ten of indented code. The generator is seeded, so
// every run encodes the same text.
//
// "cold" is the first encode by a freshly loaded tokenizer (empty caches); "warm" repeats the
// encode on the same tokenizer. MB is 10^6 bytes of UTF-8 input. Prints one JSON line.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"
#include "text/tokenizer.h"

namespace {

using blend::bench::median;
using blend::bench::now;
using blend::bench::seconds_since;

class TextGenerator {
 public:
  TextGenerator(const blend::Tokenizer& tok, uint64_t seed) : rng_(seed) {
    // Whole-word tokens " word" (lower-case ASCII letters), in id order: BPE ids grow roughly
    // with decreasing frequency, so a Zipf draw over this order gives realistic word counts.
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      const std::string& b = tok.token_bytes(id);
      if (b.size() < 3 || b[0] != ' ' || tok.is_special(id)) continue;
      if (std::all_of(b.begin() + 1, b.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
        words_.push_back(b.substr(1));
    }
    if (words_.empty()) words_ = {"the", "of", "and", "token", "model", "serving"};
  }

  size_t distinct_words() const { return words_.size(); }

  std::string generate(size_t bytes) {
    std::string text;
    text.reserve(bytes + 4096);
    while (text.size() < bytes) {
      if (uniform() < 0.1) {
        code_paragraph(text);
      } else {
        prose_paragraph(text);
      }
      text += "\n\n";
    }
    return text;
  }

 private:
  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  size_t below(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  // Zipf (s = 1) over the word list: P(rank r) ~ 1 / r.
  const std::string& zipf_word() {
    const double n = static_cast<double>(words_.size());
    const auto r = static_cast<size_t>(std::exp(uniform() * std::log(n + 1)) - 1);
    return words_[std::min(r, words_.size() - 1)];
  }

  std::string word() {
    const double u = uniform();
    if (u < 0.25) {  // a rare word: two or three stems glued together
      std::string w = zipf_word();
      const size_t parts = 1 + (uniform() < 0.3 ? 2 : 1);
      for (size_t i = 0; i < parts; ++i) w += words_[below(words_.size())];
      return w;
    }
    if (u < 0.29) {  // a number
      switch (below(4)) {
        case 0:
          return std::to_string(below(100));
        case 1:
          return std::to_string(1900 + below(130));
        case 2:
          return std::to_string(below(1000)) + "." + std::to_string(below(100));
        default:
          return std::to_string(below(10000000));
      }
    }
    if (u < 0.31) {
      static const char* kContractions[] = {"don't", "it's",   "we'll", "they're", "I'm",
                                            "can't", "you've", "she'd", "DON'T",   "That's"};
      return kContractions[below(std::size(kContractions))];
    }
    return zipf_word();
  }

  static void capitalize(std::string& w) {
    if (!w.empty() && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 'a' + 'A');
  }

  void prose_paragraph(std::string& text) {
    const size_t sentences = 3 + below(5);
    for (size_t s = 0; s < sentences; ++s) {
      if (s > 0) text += ' ';
      const size_t n = 6 + below(20);
      for (size_t i = 0; i < n; ++i) {
        std::string w = word();
        if (i == 0 || uniform() < 0.05) capitalize(w);
        if (i > 0) text += ' ';
        const double q = uniform();
        if (q < 0.02) {
          text += "\"" + w + "\"";
        } else if (q < 0.03) {
          text += "(" + w + ")";
        } else {
          text += w;
        }
        if (i + 1 < n && uniform() < 0.08) text += uniform() < 0.8 ? "," : ";";
      }
      const double e = uniform();
      text += e < 0.8 ? "." : e < 0.9 ? "?" : e < 0.97 ? "!" : "...";
    }
  }

  std::string identifier() {
    std::string id = words_[below(std::min<size_t>(words_.size(), 5000))];
    if (uniform() < 0.5) {
      std::string second = words_[below(words_.size())];
      if (uniform() < 0.5) {
        id += "_" + second;
      } else {
        capitalize(second);
        id += second;
      }
    }
    return id;
  }

  void code_paragraph(std::string& text) {
    const size_t lines = 4 + below(10);
    size_t depth = 0;
    text += "int " + identifier() + "(const std::vector<float>& " + identifier() + ") {\n";
    for (size_t i = 0; i < lines; ++i) {
      depth = std::min<size_t>(3, depth + (uniform() < 0.3 ? 1 : 0));
      text += std::string(4 * (depth + 1), ' ');
      if (uniform() < 0.1) text += '\t';
      switch (below(4)) {
        case 0:
          text += "for (size_t i = 0; i < " + identifier() + ".size(); ++i) {";
          break;
        case 1:
          text +=
              identifier() + " += " + identifier() + "[i] * " + std::to_string(below(1000)) + ";";
          break;
        case 2:
          text += "if (" + identifier() + " == nullptr) return -" + std::to_string(below(10)) + ";";
          break;
        default:
          text += "// " + word() + " " + word() + " " + word();
          break;
      }
      text += '\n';
    }
    text += "}";
  }

  std::mt19937_64 rng_;
  std::vector<std::string> words_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir = BLEND_SOURCE_DIR "/.cache/tokenizer-llama3/package/models";
  std::string text_file;
  double mb = 8;
  int runs = 5;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--mb" && i + 1 < argc) {
      mb = std::atof(argv[++i]);
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else {
      positional.emplace_back(a);
    }
  }
  if (positional.size() > 0) dir = positional[0];
  if (positional.size() > 1) text_file = positional[1];

  try {
    auto t0 = now();
    auto tok = std::make_unique<blend::Tokenizer>(blend::Tokenizer::from_dir(dir));
    const double load_s = seconds_since(t0);

    std::string text;
    size_t vocabulary_words = 0;
    if (!text_file.empty()) {
      std::ifstream in(text_file, std::ios::binary);
      if (!in) throw std::runtime_error("cannot open " + text_file);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } else {
      TextGenerator gen(*tok, 20240601);
      vocabulary_words = gen.distinct_words();
      text = gen.generate(static_cast<size_t>(mb * 1e6));
    }
    const double text_mb = static_cast<double>(text.size()) / 1e6;

    // Cold: a freshly loaded tokenizer has a new identity, so no thread cache applies to it.
    std::vector<double> cold, warm;
    size_t tokens = 0;
    for (int r = 0; r < std::min(runs, 3); ++r) {
      if (r > 0) tok = std::make_unique<blend::Tokenizer>(blend::Tokenizer::from_dir(dir));
      t0 = now();
      tokens = tok->encode(text).size();
      cold.push_back(text_mb / seconds_since(t0));
    }
    std::vector<int32_t> ids;
    for (int r = 0; r < runs; ++r) {
      t0 = now();
      ids = tok->encode(text);
      warm.push_back(text_mb / seconds_since(t0));
    }
    std::vector<double> dec;
    for (int r = 0; r < runs; ++r) {
      t0 = now();
      const std::string back = tok->decode(ids);
      dec.push_back(static_cast<double>(back.size()) / 1e6 / seconds_since(t0));
      if (back.size() != text.size()) throw std::runtime_error("decode(encode(text)) != text");
    }
    std::printf(
        "{\"benchmark\":\"tokenizer_encode\",\"text\":\"%s\",\"bytes\":%zu,\"tokens\":%zu,"
        "\"bytes_per_token\":%.3f,\"word_list\":%zu,\"load_s\":%.3f,\"runs\":%d,"
        "\"cold_mb_s\":%.2f,\"warm_mb_s\":%.2f,\"decode_mb_s\":%.2f,\"threads\":1}\n",
        text_file.empty() ? "generated" : text_file.c_str(), text.size(), tokens,
        static_cast<double>(text.size()) / static_cast<double>(tokens), vocabulary_words, load_s,
        runs, median(cold), median(warm), median(dec));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
