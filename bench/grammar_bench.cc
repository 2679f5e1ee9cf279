// Structured output's own work, without a model: what one process pays to compile schemas,
// build their token tables and mask every step (issue 32).
//
//   grammar_bench [TOKENIZER_DIR] [--requests N] [--max-tokens N] [--rounds N] [--seed S]
//
// Each round loads nothing new but starts from a fresh vocabulary index (TokenVocab), so every
// table is built again, as in a fresh `blend batch` process. N requests (default 64) take
// schema i mod 8 of tests/grammar/data/schemas.json, as bench/structured_output.sh does; each
// decodes up to --max-tokens (128) tokens, drawing a seeded random token among those its mask
// allows (what sampling a random-weight model under the mask looks like: no preference for
// short or long tokens), the requests advancing in lock step like a batch. Prints one JSON
// line: the cold round's seconds (the median over rounds), split into index / compile / masks,
// and a warm round's (every table and mask cached) for comparison. Deterministic: the same
// tokens every round, so `valgrind --tool=callgrind` counts are repeatable.
#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "text/tokenizer.h"

namespace {

using blend::bench::median;
using blend::bench::now;
using blend::bench::seconds_since;

// std::popcount without the popcnt instruction is a library call per word; this is a few
// instructions, whatever the build's target.
size_t bit_count(uint64_t x) {
  x -= (x >> 1) & 0x5555555555555555ULL;
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
  return static_cast<size_t>((x * 0x0101010101010101ULL) >> 56);
}

// The k-th allowed token of a mask (k < the number allowed).
blend::TokenId kth_allowed(const blend::TokenMask& mask, size_t k) {
  for (size_t w = 0; w < mask.words.size(); ++w) {
    const size_t count = bit_count(mask.words[w]);
    if (k >= count) {
      k -= count;
      continue;
    }
    uint64_t bits = mask.words[w];
    for (; k > 0; --k) bits &= bits - 1;
    return static_cast<blend::TokenId>(w * 64 + static_cast<size_t>(std::countr_zero(bits)));
  }
  return -1;
}

struct Round {
  double index = 0, compile = 0, masks = 0;
  size_t tokens = 0, finished = 0;
};

Round run_round(const blend::Tokenizer& tok, const std::vector<blend::TokenId>& eos,
                const nlohmann::json& schemas, int requests, int max_tokens, uint64_t seed,
                std::shared_ptr<const blend::TokenVocab>* vocab) {
  Round r;
  auto t = now();
  if (!*vocab) *vocab = std::make_shared<blend::TokenVocab>(tok, tok.vocab_size(), eos);
  r.index = seconds_since(t);
  t = now();
  blend::GrammarCompiler compiler(*vocab);
  std::vector<std::unique_ptr<blend::TokenMatcher>> matchers;
  for (int i = 0; i < requests; ++i)
    matchers.push_back(
        compiler.json_schema(schemas[static_cast<size_t>(i) % schemas.size()])->start());
  r.compile = seconds_since(t);
  t = now();
  std::vector<std::mt19937_64> rngs;
  for (int i = 0; i < requests; ++i) rngs.emplace_back(seed + static_cast<uint64_t>(i));
  std::vector<bool> done(static_cast<size_t>(requests), false);
  std::map<std::shared_ptr<const blend::TokenMask>, size_t> allowed_of;
  for (int step = 0; step < max_tokens; ++step) {
    for (size_t i = 0; i < matchers.size(); ++i) {
      if (done[i]) continue;
      const auto mask = matchers[i]->mask();
      // Counted once per mask (masks are cached and shared): the bench's own work stays small
      // next to the grammar's.
      auto [it, fresh] = allowed_of.try_emplace(mask, 0);
      if (fresh)
        for (uint64_t w : mask->words) it->second += bit_count(w);
      const size_t allowed = it->second;
      if (allowed == 0) {
        done[i] = true;
        continue;
      }
      const blend::TokenId token = kth_allowed(*mask, rngs[i]() % allowed);
      if (!matchers[i]->accept(token)) {
        std::fprintf(stderr, "grammar_bench: the mask allowed a token the matcher refused\n");
        std::exit(1);
      }
      ++r.tokens;
      if (matchers[i]->finished() || std::find(eos.begin(), eos.end(), token) != eos.end()) {
        done[i] = true;
        ++r.finished;
      }
    }
  }
  r.masks = seconds_since(t);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = BLEND_SOURCE_DIR "/.cache/tokenizer-llama3/package/models";
  int requests = 64, max_tokens = 128, rounds = 5;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "grammar_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--requests") {
      requests = std::atoi(next().c_str());
    } else if (a == "--max-tokens") {
      max_tokens = std::atoi(next().c_str());
    } else if (a == "--rounds") {
      rounds = std::atoi(next().c_str());
    } else if (a == "--seed") {
      seed = std::strtoull(next().c_str(), nullptr, 10);
    } else if (!a.empty() && a[0] != '-') {
      dir = a;
    } else {
      std::fprintf(stderr, "grammar_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (requests < 1 || max_tokens < 1 || rounds < 1) {
    std::fprintf(stderr, "grammar_bench: --requests, --max-tokens and --rounds must be >= 1\n");
    return 2;
  }
  try {
    const blend::Tokenizer tok = blend::Tokenizer::from_dir(dir);
    std::vector<blend::TokenId> eos;
    if (auto id = tok.token_id(tok.eos_token())) eos.push_back(*id);
    std::ifstream in(BLEND_SOURCE_DIR "/tests/grammar/data/schemas.json");
    const nlohmann::json schemas = nlohmann::json::parse(in);
    std::vector<double> index, compile, masks, total;
    Round cold;
    for (int round = 0; round < rounds; ++round) {
      std::shared_ptr<const blend::TokenVocab> vocab;  // fresh: every table built again
      cold = run_round(tok, eos, schemas, requests, max_tokens, seed, &vocab);
      index.push_back(cold.index);
      compile.push_back(cold.compile);
      masks.push_back(cold.masks);
      total.push_back(cold.index + cold.compile + cold.masks);
    }
    std::shared_ptr<const blend::TokenVocab> vocab;
    run_round(tok, eos, schemas, requests, max_tokens, seed, &vocab);
    const Round warm = run_round(tok, eos, schemas, requests, max_tokens, seed, &vocab);
    std::printf(
        "{\"requests\": %d, \"tokens\": %zu, \"finished\": %zu, \"rounds\": %d, "
        "\"cold_s\": %.4f, \"cold_index_s\": %.4f, \"cold_compile_s\": %.4f, "
        "\"cold_masks_s\": %.4f, \"warm_masks_s\": %.4f}\n",
        requests, cold.tokens, cold.finished, rounds, median(total), median(index), median(compile),
        median(masks), warm.masks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grammar_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
