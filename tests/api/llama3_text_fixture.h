// The fixture of the api tests that parse requests: the Llama-3 tokenizer and chat template of
// BLEND_TEST_TOKENIZER_DIR, loaded once per test suite.
#pragma once

#include <gtest/gtest.h>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace blend {

class Llama3TextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = new Tokenizer(Tokenizer::from_dir(BLEND_TEST_TOKENIZER_DIR));
    template_ = new ChatTemplate(ChatTemplate::from_dir(BLEND_TEST_TOKENIZER_DIR));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete template_;
    tokenizer_ = nullptr;
    template_ = nullptr;
  }
  inline static Tokenizer* tokenizer_ = nullptr;
  inline static ChatTemplate* template_ = nullptr;
};

}  // namespace blend
