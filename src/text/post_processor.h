// The tokenizer.json post-processor for a single sequence: the special tokens transformers adds
// around a text's ids when add_special_tokens is true (Meta's Llama-3.x files: BOS first).
//
// Supported: null; ByteLevel (it only trims offsets: adds nothing); TemplateProcessing (its
// "single" template: SpecialToken items before and after the one Sequence "A"); RobertaProcessing
// and BertProcessing (cls before, sep after); a Sequence of these, applied in order. Anything
// else, or a single template that names the pair's "B", is a blend::Error naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace blend::tok {

struct PostProcessor {
  std::vector<int32_t> prefix, suffix;  // added before and after the sequence's ids

  bool adds_tokens() const { return !prefix.empty() || !suffix.empty(); }
  // ids with prefix and suffix around them; a prefix the ids already start with (a prompt whose
  // text writes BOS itself) is not added again, so BOS is never doubled.
  std::vector<int32_t> apply(std::vector<int32_t> ids) const;
};

// `token_id` finds a token by its text (for RobertaProcessing's and BertProcessing's cls/sep
// pairs, whose ids are checked against it). `where` names the file in errors.
PostProcessor load_post_processor(
    const nlohmann::json& post_processor,
    const std::function<std::optional<int32_t>(std::string_view)>& token_id,
    const std::string& where);

}  // namespace blend::tok
