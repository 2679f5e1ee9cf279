// Fuzzes the OpenAI request path a server body takes: parse_client_json (depth bound), then
// parse_api_request for both endpoints with the real Llama-3 tokenizer and chat template, then
// the context check. Either an ApiError (a 400 naming a parameter) or a request whose fields
// are in range; never a crash, a JSON exception escaping as a 500, or a hang. The first byte
// picks the endpoint.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/json_limits.h"
#include "api/openai.h"
#include "core/error.h"
#include "fuzz_tokenizer.h"

namespace {

constexpr int64_t kMaxSequenceTokens = 4096;

// max_prompt_bytes walks the vocabulary: once per process, not per input.
const blend::RequestLimits& request_limits() {
  static const blend::RequestLimits limits = [] {
    blend::RequestLimits l;
    l.grammars = &blend::fuzz::llama3_grammars();
    l.prompt_lists = true;  // as the server's /v1/completions reads them
    l.max_prompt_bytes =
        blend::max_prompt_bytes(blend::fuzz::llama3_tokenizer(), kMaxSequenceTokens);
    return l;
  }();
  return limits;
}

}  // namespace

// Before libFuzzer's clock starts (see fuzz_tokenizer.h).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)blend::fuzz::llama3_chat_template();
  (void)request_limits();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const blend::Endpoint endpoint =
      (data[0] & 1) ? blend::Endpoint::kChatCompletions : blend::Endpoint::kCompletions;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const blend::Tokenizer& tokenizer = blend::fuzz::llama3_tokenizer();
  const blend::RequestLimits& limits = request_limits();
  try {
    const nlohmann::json body = blend::parse_client_json(text, "the request body");
    const blend::ApiRequest request = blend::parse_api_request(
        endpoint, body, tokenizer, &blend::fuzz::llama3_chat_template(), limits);
    blend::check_context(request, body, kMaxSequenceTokens);
    // Ids past the vocabulary are the engine's to refuse (Engine::check_request, against the
    // model's vocab_size, which may exceed the tokenizer's); a negative one never gets past
    // the parser.
    if (static_cast<int64_t>(request.prompt_count()) * request.n > blend::kMaxChoices) {
      std::fprintf(stderr, "openai_request_fuzz: %zu prompts of %d choices accepted\n",
                   request.prompt_count(), request.n);
      std::abort();
    }
    for (size_t k = 0; k < request.prompt_count(); ++k)
      for (int32_t id : request.prompt_at(k))
        if (id < 0) {
          std::fprintf(stderr, "openai_request_fuzz: negative prompt id %d accepted\n", id);
          std::abort();
        }
  } catch (const blend::ApiError&) {
  } catch (const blend::Error&) {
    // A chat template's raise_exception() (e.g. roles that do not alternate) is a blend::Error
    // the server turns into a 400 too.
  }
  return 0;
}
