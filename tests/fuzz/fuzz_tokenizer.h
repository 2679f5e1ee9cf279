// libFuzzer harness helper: the real Llama-3 tokenizer and chat template that the harnesses of
// client input (prompts, requests, batch lines) run against, loaded once per process. The
// folder is $BLEND_TOKENIZER_DIR, else the one scripts/setup.sh fetched (BLEND_TOKENIZER_DIR at
// configure time), as for the tests. Harnesses load them in LLVMFuzzerInitialize: loading the
// 128K-token vocabulary takes seconds in an instrumented build, and inside the first input it
// counted against libFuzzer's per-input -timeout (a false "timeout" finding on a busy machine).
#pragma once

#include <cstdlib>
#include <filesystem>

#include "grammar/json_schema.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace blend::fuzz {

inline std::filesystem::path tokenizer_dir() {
  if (const char* env = std::getenv("BLEND_TOKENIZER_DIR"); env && *env) return env;
  return BLEND_FUZZ_TOKENIZER_DIR;
}

inline const Tokenizer& llama3_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_dir(tokenizer_dir());
  return tokenizer;
}

// response_format schemas in requests are client input too: compiled (and their masks built)
// by the real grammar compiler. The model's EOS ids are the Llama-3 instruct ones.
inline GrammarCompiler& llama3_grammars() {
  static GrammarCompiler grammars(llama3_tokenizer(), llama3_tokenizer().vocab_size(),
                                  {128001, 128008, 128009});
  return grammars;
}

inline const ChatTemplate& llama3_chat_template() {
  static const ChatTemplate chat_template = ChatTemplate::from_dir(tokenizer_dir());
  return chat_template;
}

}  // namespace blend::fuzz
