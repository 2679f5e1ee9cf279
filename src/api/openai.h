// OpenAI wire format: parsing /v1/completions and /v1/chat/completions request bodies into
// engine requests, and building the response objects (text_completion, chat.completion) from
// engine results. Shared by `blend batch` (Batch API files) and `blend serve` (HTTP).
// Field names, defaults and error shapes follow the OpenAI API reference; vLLM's extensions
// top_k, min_p, ignore_eos and stop_token_ids are accepted too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/tools.h"
#include "core/request.h"
#include "core/types.h"
#include "text/tool_calls.h"

namespace blend {

class ChatTemplate;
class GrammarCompiler;
class Tokenizer;

enum class Endpoint { kCompletions, kChatCompletions };

// "/v1/completions" or "/v1/chat/completions" (with or without the /v1 prefix); else ApiError.
Endpoint parse_endpoint(const std::string& url);

// The most choices one request may ask for: n, or the prompts of a list times n (each choice
// is an engine sequence of its own).
inline constexpr int32_t kMaxChoices = 128;

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;     // as the body says
  ModelId model_id = 0;  // the served model it picks (ServedModel below), set by the caller
  std::vector<TokenId> prompt;
  // /v1/completions given a list of prompts (only where RequestLimits::prompt_lists): the
  // prompts after `prompt`, in order. Prompt k's samples are the choices k * n to k * n + n - 1,
  // as OpenAI and vLLM index them.
  std::vector<std::vector<TokenId>> more_prompts;
  // echo (completions): each prompt's text, prepended to the text of its choices (a prompt
  // given as token ids: their decoded text); empty without echo.
  std::vector<std::string> echo;
  // echo with logprobs (completions): each choice's logprobs start with its prompt's tokens,
  // scored through params.prompt_logprobs (the first token's logprob null, as OpenAI's).
  bool echo_logprobs = false;
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // stream_options.continuous_usage_stats with include_usage (vLLM's rule): every chunk
  // carries its choice's usage so far.
  bool continuous_usage = false;
  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>" (api/logprobs.h).
  bool tokens_as_ids = false;
  // Samples of the prompt (OpenAI's n; best_of equal to it): submitted as n GenerationRequests
  // with index 0..n-1, which share the prompt's KV through the prefix cache.
  int32_t n = 1;
  // Extension fields (seconds): latency targets of a real-time request (BROS §4.1); unset =
  // the server's defaults.
  std::optional<double> ttft_slo, tpot_slo;
  // Extension field: whether the request may run through equivalent blocks of another model
  // (BlockLLM §5.3 adaptive serving; Engine::add_adaptive_chain); unset = the server's default.
  std::optional<bool> adaptive_blocks;
  // Tool calling (api/tools.h): set when the output is to be read for calls in this format,
  // keeping at most max_tool_calls of them (parallel_tool_calls false: 1).
  std::optional<ToolCallFormat> tool_format;
  size_t max_tool_calls = static_cast<size_t>(-1);

  size_t prompt_count() const { return 1 + more_prompts.size(); }
  const std::vector<TokenId>& prompt_at(size_t k) const {
    return k == 0 ? prompt : more_prompts[k - 1];
  }
};

// What the caller knows about the engine that bounds a request before any costly work.
struct RequestLimits {
  // A prompt text longer than this many UTF-8 bytes cannot fit the context whatever its
  // tokens (see max_prompt_bytes); it is refused before tokenizing. 0 = no bound.
  int64_t max_prompt_bytes = 0;
  // The model's sampling defaults (generation_config.json) for the fields a request leaves
  // unset; null = OpenAI's defaults (vLLM's --generation-config vllm).
  const SamplingDefaults* sampling_defaults = nullptr;
  // Compiles response_format schemas for this model's vocabulary; null = response_format other
  // than text is refused.
  GrammarCompiler* grammars = nullptr;
  // When set, the prompt is checked against this context (check_context) before any grammar
  // is compiled: a request refused for its length does not pay for its schema (issue 54: a
  // 4,096-value enum compiled 27 s before its prompt was refused). 0 = the caller checks.
  int64_t max_sequence_tokens = 0;
  // Polled while a response_format schema compiles: true (the client left) stops it.
  std::function<bool()> cancelled;
  // The caller answers every prompt of a /v1/completions list (ApiRequest::more_prompts);
  // otherwise a list of several prompts is refused (param "prompt").
  bool prompt_lists = false;
};

// The longest prompt text, in bytes, that could still tokenize to fewer than
// `max_sequence_tokens` tokens: every token stands for at most the longest token's bytes of
// the text (byte-level BPE consumes its input without normalizing it away), so a text of more
// than (max_sequence_tokens - 1) x longest-token bytes needs at least max_sequence_tokens
// tokens. A 60 MB prompt is refused in microseconds instead of tokenized in 24 s (issue 26).
int64_t max_prompt_bytes(const Tokenizer& tokenizer, int64_t max_sequence_tokens);

// The text a chat request body renders to through the model's chat template: content parts
// joined, assistant tool calls' arguments made objects, `tools` in the client's key order (from
// `raw_body`, when given), the generation prompt unless "add_generation_prompt" is false. The one
// rendering path of the server, the Batch API and `blend template`. Throws ApiError (400) naming
// the field, "this model has no chat template" when `chat_template` is null, and the template's
// own errors as "chat template: ...".
struct ChatPrompt {
  std::string text;
  ToolRequest tools;  // parsed from the body, for the caller that then reads calls
};
ChatPrompt render_chat_prompt(const nlohmann::json& body, const ChatTemplate* chat_template,
                              std::string_view raw_body = {});

// Parses a request body; tokenizes the prompt (rendering `messages`, and `tools`, through the
// chat template).
// Throws ApiError (status 400) naming the parameter on bad input, on fields this engine does
// not implement (api/request_fields.h) and on a prompt text over limits.max_prompt_bytes.
// `raw_body`: the text `body` was parsed from, when the caller has it; tools are then rendered
// in the client's key order (api/tools.h tools_in_client_order).
ApiRequest parse_api_request(Endpoint endpoint, const nlohmann::json& body,
                             const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                             const RequestLimits& limits = {}, std::string_view raw_body = {});

// The context check OpenAI makes, on every prompt of the request: a prompt of max_sequence_tokens
// or more tokens is refused (param "prompt" or "messages"), and so is a max_tokens /
// max_completion_tokens the client set that, with the prompt, passes the context (param
// "max_tokens"). An unset max_tokens is clamped by the engine instead.
void check_context(const ApiRequest& request, const nlohmann::json& body,
                   int64_t max_sequence_tokens);

// The response body for a finished request: one choice per result, ordered by index (with
// echo, its prompt's text first). Usage counts as OpenAI does: each prompt once, the completion
// tokens of every choice. With
// request.tool_format, calls in the text become message.tool_calls (finish_reason "tool_calls"
// when the model stopped by itself).
nlohmann::json make_response(const ApiRequest& request, std::span<const GenerationResult> results,
                             const std::string& response_id, const std::string& model,
                             int64_t created, const Tokenizer& tokenizer);
inline nlohmann::json make_response(const ApiRequest& request, const GenerationResult& result,
                                    const std::string& response_id, const std::string& model,
                                    int64_t created, const Tokenizer& tokenizer) {
  return make_response(request, std::span<const GenerationResult>(&result, 1), response_id, model,
                       created, tokenizer);
}
// OpenAI's usage object over a request's results, `n` samples per prompt (result index
// k * n + i is prompt k's sample i): each prompt's tokens counted once.
nlohmann::json make_usage(std::span<const GenerationResult> results, int32_t n);

const char* finish_reason_name(FinishReason reason);
// vLLM's stop_reason of a choice: the stop string (a JSON string), the stop_token_ids token (a
// JSON integer), or null.
nlohmann::json stop_reason_json(const StopReason& reason);

// The models a server or a batch run answers to, by ModelId (engine/engine.h: several models in
// one engine), and which of them a request body names with its "model" field.
struct ServedModel {
  std::string name;                             // what "model" says to pick it
  const ChatTemplate* chat_template = nullptr;  // null: chat requests fail with a clear message
  const SamplingDefaults* sampling_defaults = nullptr;  // its generation_config.json
  std::string root;                   // its folder (a LoRA model's: the adapter's), as vLLM lists
  std::optional<std::string> parent;  // a LoRA model's base model, when that is served too
  std::vector<std::string> aliases;   // other names "model" may give (--served-model-name A B)
  // Its text (attach_model_text): the tokenizer its requests are read and answered with, the
  // compiler of its response_format schemas, and the longest prompt text it takes before
  // tokenizing (max_prompt_bytes of that tokenizer).
  const Tokenizer* tokenizer = nullptr;
  GrammarCompiler* grammars = nullptr;
  int64_t max_prompt_bytes = 0;
};

// What a served model's text is made of: its tokenizer, the size of the model's vocabulary, its
// EOS ids, and the first model with the same tokenizer and EOS ids (Engine::tokenizer_owner).
struct ModelText {
  const Tokenizer* tokenizer = nullptr;
  int64_t vocab_size = 0;
  std::vector<TokenId> eos_token_ids;
  ModelId owner = 0;
};

// Gives each of `served` its text from `text` (by ModelId): models with one owner share one
// grammar compiler, and with it the token tables built over their vocabulary. The returned
// compilers must outlive `served`.
std::vector<std::unique_ptr<GrammarCompiler>> attach_model_text(std::span<ServedModel> served,
                                                                std::span<const ModelText> text,
                                                                int64_t max_sequence_tokens);

// The model called `name`, if one is.
std::optional<ModelId> find_served_model(std::span<const ServedModel> models,
                                         std::string_view name);

// The model a request body names: the one called body["model"], or model 0 when the body names
// none. An unknown name is ApiError 404 (param "model"), as OpenAI and vLLM answer; with `any_name`
// and a single model, every name picks it (`blend batch` without
// --served-model-name). A "model" that is not a string is left to the request parser.
ModelId resolve_model(const nlohmann::json& body, std::span<const ServedModel> models,
                      bool any_name = false);

}  // namespace blend
