// The tokenizer.json post-processors for a single sequence (text/post_processor.h).
#include "text/post_processor.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace blend::tok {
namespace {

using nlohmann::json;

std::optional<int32_t> ids_of(std::string_view token) {
  if (token == "<s>") return 0;
  if (token == "</s>") return 2;
  return std::nullopt;
}

PostProcessor load(const json& j) {
  return load_post_processor(j, ids_of, "tokenizer.json");
}

json special(const char* name) {
  return {{"SpecialToken", {{"id", name}, {"type_id", 0}}}};
}
const json kSequenceA = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
const json kSpecials = {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}},
                        {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}};

TEST(PostProcessor, TemplateProcessingAroundTheSequence) {
  const PostProcessor p = load({{"type", "TemplateProcessing"},
                                {"single", {special("<s>"), kSequenceA, special("</s>")}},
                                {"special_tokens", kSpecials}});
  EXPECT_EQ(p.apply({5, 6}), (std::vector<int32_t>{0, 5, 6, 2}));
  EXPECT_EQ(p.apply({}), (std::vector<int32_t>{0, 2}));
  // A prefix already there is not added twice.
  EXPECT_EQ(p.apply({0, 5}), (std::vector<int32_t>{0, 5, 2}));
}

TEST(PostProcessor, ByteLevelNullAndSequences) {
  EXPECT_FALSE(load(nullptr).adds_tokens());
  EXPECT_FALSE(load({{"type", "ByteLevel"}, {"trim_offsets", false}}).adds_tokens());
  const json bos_only = {{"type", "TemplateProcessing"},
                         {"single", {special("<s>"), kSequenceA}},
                         {"special_tokens", kSpecials}};
  const PostProcessor p =
      load({{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, bos_only}}});
  EXPECT_EQ(p.apply({7}), (std::vector<int32_t>{0, 7}));
  const PostProcessor roberta =
      load({{"type", "RobertaProcessing"}, {"cls", {"<s>", 0}}, {"sep", {"</s>", 2}}});
  EXPECT_EQ(roberta.apply({7}), (std::vector<int32_t>{0, 7, 2}));
}

TEST(PostProcessor, WhatIsNotSupportedIsRefusedByName) {
  auto refusal = [](const json& j) {
    try {
      load(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(refusal({{"type", "Whatever"}}).find("Whatever"), std::string::npos);
  EXPECT_NE(refusal({{"type", "TemplateProcessing"},
                     {"single", {special("<cls>"), kSequenceA}},
                     {"special_tokens", kSpecials}})
                .find("<cls>"),
            std::string::npos);
  EXPECT_NE(refusal({{"type", "TemplateProcessing"},
                     {"single", {kSequenceA, {{"Sequence", {{"id", "B"}}}}}},
                     {"special_tokens", kSpecials}})
                .find("sequence A once"),
            std::string::npos);
  // cls naming an id that is not the token's.
  EXPECT_NE(
      refusal({{"type", "BertProcessing"}, {"cls", {"<s>", 5}}, {"sep", {"</s>", 2}}}).find("cls"),
      std::string::npos);
}

}  // namespace
}  // namespace blend::tok
