#include "api/request_fields.h"

#include <string>
#include <string_view>

#include "api/api_error.h"
#include "api/openai.h"

namespace blend {
namespace {

using nlohmann::json;

enum : unsigned { kCompletions = 1, kChat = 2, kBoth = 3 };

enum class Kind {
  kImplemented,  // parsed and honoured (api/openai.cc, the server for service_tier)
  kHarmless,     // cannot change the tokens or text: ignored on purpose
  kRefused,      // would change the result and is not implemented: 400 unless `is_default`
};

bool null_only(const json& v) {
  return v.is_null();
}
bool null_or_false(const json& v) {
  return v.is_null() || v == false;
}
bool null_or_empty(const json& v) {
  return v.is_null() || ((v.is_array() || v.is_object() || v.is_string()) && v.empty());
}
bool null_or_zero(const json& v) {
  return v.is_null() || (v.is_number() && v == 0);
}
bool null_or_one(const json& v) {
  return v.is_null() || (v.is_number() && v == 1);
}
bool null_or_bool(const json& v) {
  return v.is_null() || v.is_boolean();
}
bool no_tool_choice(const json& v) {
  return v.is_null() || v == "none";
}
bool text_modality(const json& v) {
  return v.is_null() || v == json::array({"text"});
}
bool any_value(const json&) {
  return true;
}
bool null_or_string(const json& v) {
  return v.is_null() || v.is_string();
}
bool service_tier(const json& v) {
  return v.is_null() || (v.is_string() && (v == "auto" || v == "default" || v == "flex" ||
                                           v == "scale" || v == "priority"));
}

// Refusals several fields share.
constexpr const char* kNoStructuredOutput =
    "only JSON output can be constrained: send 'response_format' (or vLLM's 'guided_json')";
constexpr const char* kNoLora = "LoRA adapters are not supported";

struct Field {
  const char* name;
  unsigned endpoints;
  Kind kind;
  // kRefused: the values that change nothing; kHarmless/kImplemented: the values accepted
  // (the type check of a field nothing else reads).
  bool (*accepts)(const json&);
  const char* refusal;  // why, for the error message
};

// clang-format off
constexpr Field kFields[] = {
    // --- implemented (values checked in api/openai.cc) ---
    {"model", kBoth, Kind::kImplemented, null_or_string, nullptr},
    {"prompt", kCompletions, Kind::kImplemented, any_value, nullptr},
    {"messages", kChat, Kind::kImplemented, any_value, nullptr},
    {"max_tokens", kBoth, Kind::kImplemented, any_value, nullptr},
    {"max_completion_tokens", kChat, Kind::kImplemented, any_value, nullptr},
    {"temperature", kBoth, Kind::kImplemented, any_value, nullptr},
    {"top_p", kBoth, Kind::kImplemented, any_value, nullptr},
    {"top_k", kBoth, Kind::kImplemented, any_value, nullptr},          // vLLM
    {"min_p", kBoth, Kind::kImplemented, any_value, nullptr},          // vLLM
    {"seed", kBoth, Kind::kImplemented, any_value, nullptr},
    {"stop", kBoth, Kind::kImplemented, any_value, nullptr},
    {"stop_token_ids", kBoth, Kind::kImplemented, any_value, nullptr}, // vLLM
    {"ignore_eos", kBoth, Kind::kImplemented, any_value, nullptr},     // vLLM
    {"min_tokens", kBoth, Kind::kImplemented, any_value, nullptr},     // vLLM
    {"include_stop_str_in_output", kBoth, Kind::kImplemented, any_value, nullptr},  // vLLM
    {"skip_special_tokens", kBoth, Kind::kImplemented, any_value, nullptr},         // vLLM
    {"logprobs", kBoth, Kind::kImplemented, any_value, nullptr},
    {"top_logprobs", kChat, Kind::kImplemented, any_value, nullptr},
    {"presence_penalty", kBoth, Kind::kImplemented, any_value, nullptr},
    {"frequency_penalty", kBoth, Kind::kImplemented, any_value, nullptr},
    {"repetition_penalty", kBoth, Kind::kImplemented, any_value, nullptr},  // vLLM
    {"logit_bias", kBoth, Kind::kImplemented, any_value, nullptr},
    {"n", kBoth, Kind::kImplemented, any_value, nullptr},              // 1 only
    {"best_of", kCompletions, Kind::kImplemented, any_value, nullptr}, // 1 only
    {"echo", kBoth, Kind::kImplemented, any_value, nullptr},  // completions only
    {"stream", kBoth, Kind::kImplemented, any_value, nullptr},
    {"stream_options", kBoth, Kind::kImplemented, any_value, nullptr},
    {"add_generation_prompt", kChat, Kind::kImplemented, any_value, nullptr},  // vLLM
    {"ttft_slo", kBoth, Kind::kImplemented, any_value, nullptr},       // blend: BROS targets
    {"tpot_slo", kBoth, Kind::kImplemented, any_value, nullptr},
    // blend: BlockLLM adaptive serving (Engine::add_adaptive_chain)
    {"adaptive_blocks", kBoth, Kind::kImplemented, any_value, nullptr},
    {"return_tokens_as_token_ids", kBoth, Kind::kImplemented, any_value, nullptr},  // vLLM
    // The server runs "flex" as best-effort (BROS §4) and the others as real-time.
    {"service_tier", kBoth, Kind::kImplemented, service_tier, nullptr},
    // text, json_object, json_schema (grammar/json_schema.h); on completions too, as vLLM.
    {"response_format", kBoth, Kind::kImplemented, any_value, nullptr},
    // vLLM's spellings of a JSON response_format (api/openai.cc, vllm_response_format).
    {"guided_json", kBoth, Kind::kImplemented, any_value, nullptr},
    {"structured_outputs", kBoth, Kind::kImplemented, any_value, nullptr},
    // Tool calling (api/tools.h): tools rendered by the chat template, calls parsed from the
    // output in the template's format; "required"/named enforced by a grammar.
    {"tools", kChat, Kind::kImplemented, any_value, nullptr},
    {"tool_choice", kChat, Kind::kImplemented, any_value, nullptr},
    {"parallel_tool_calls", kChat, Kind::kImplemented, any_value, nullptr},

    // --- harmless: bookkeeping, caching hints and latency-only features ---
    {"user", kBoth, Kind::kHarmless, null_or_string, nullptr},
    {"metadata", kChat, Kind::kHarmless, any_value, nullptr},
    {"store", kChat, Kind::kHarmless, any_value, nullptr},
    {"safety_identifier", kBoth, Kind::kHarmless, null_or_string, nullptr},
    {"prompt_cache_key", kBoth, Kind::kHarmless, null_or_string, nullptr},
    {"request_id", kBoth, Kind::kHarmless, null_or_string, nullptr},   // vLLM
    // blend workload files: the output length `blend simulate` and the planner assume.
    {"estimated_output", kBoth, Kind::kHarmless, any_value, nullptr},
    // Predicted outputs only speed decoding up; the text is the model's either way.
    {"prediction", kChat, Kind::kHarmless, any_value, nullptr},
    // vLLM reads it only for slow (non-tokenizer.json) tokenizers; its fast ones decode
    // through the tokenizer's ByteLevel decoder, which puts no space between added tokens
    // either way. Every tokenizer blend loads is such a one.
    {"spaces_between_special_tokens", kBoth, Kind::kHarmless, null_or_bool, nullptr},

    // --- refused: would change the result and is not implemented ---
    {"suffix", kCompletions, Kind::kRefused, null_or_empty, "'suffix' (insertion) is not supported"},
    {"functions", kChat, Kind::kRefused, null_or_empty,
     "the deprecated 'functions' is not supported; send 'tools'"},
    {"function_call", kChat, Kind::kRefused, no_tool_choice,
     "the deprecated 'function_call' is not supported; send 'tool_choice'"},
    {"modalities", kChat, Kind::kRefused, text_modality, "only the text modality is supported"},
    {"audio", kChat, Kind::kRefused, null_or_empty, "audio output is not supported"},
    {"reasoning_effort", kChat, Kind::kRefused, null_only, "'reasoning_effort' is not supported"},
    {"verbosity", kChat, Kind::kRefused, null_only, "'verbosity' is not supported"},
    {"web_search_options", kChat, Kind::kRefused, null_only, "web search is not supported"},
    // vLLM / SGLang extensions
    {"continue_final_message", kChat, Kind::kRefused, null_or_false,
     "'continue_final_message' is not supported"},
    {"add_special_tokens", kBoth, Kind::kImplemented, null_or_bool, nullptr},
    {"use_beam_search", kBoth, Kind::kRefused, null_or_false, "beam search is not supported"},
    {"length_penalty", kBoth, Kind::kRefused, null_or_one, "'length_penalty' is not supported"},
    // Every prompt row through the head (SeqChunk::all_logits); refused on a backend that keeps
    // the sampled rows only (Engine::check_request).
    {"prompt_logprobs", kBoth, Kind::kImplemented, any_value, nullptr},
    {"allowed_token_ids", kBoth, Kind::kRefused, null_or_empty,
     "'allowed_token_ids' is not supported"},
    {"bad_words", kBoth, Kind::kRefused, null_or_empty, "'bad_words' is not supported"},
    {"truncate_prompt_tokens", kBoth, Kind::kRefused, null_only,
     "'truncate_prompt_tokens' is not supported"},
    {"return_token_ids", kBoth, Kind::kRefused, null_or_false,
     "'return_token_ids' is not supported"},
    // A cache salt isolates tenants' cached prefixes: accepting it silently would promise an
    // isolation this engine does not give.
    {"cache_salt", kBoth, Kind::kRefused, null_or_empty, "'cache_salt' is not supported"},
    {"priority", kBoth, Kind::kRefused, null_or_zero,
     "'priority' is not supported (use service_tier \"flex\" for best-effort requests)"},
    {"guided_regex", kBoth, Kind::kRefused, null_or_empty, kNoStructuredOutput},
    {"guided_choice", kBoth, Kind::kRefused, null_or_empty, kNoStructuredOutput},
    {"guided_grammar", kBoth, Kind::kRefused, null_or_empty, kNoStructuredOutput},
    {"json_schema", kBoth, Kind::kRefused, null_or_empty, kNoStructuredOutput},
    {"regex", kBoth, Kind::kRefused, null_or_empty, kNoStructuredOutput},
    {"ebnf", kBoth, Kind::kRefused, null_or_empty, kNoStructuredOutput},
    {"chat_template", kChat, Kind::kRefused, null_or_empty,
     "a per-request 'chat_template' is not supported"},
    {"chat_template_kwargs", kChat, Kind::kRefused, null_or_empty,
     "'chat_template_kwargs' is not supported"},
    {"documents", kChat, Kind::kRefused, null_or_empty, "'documents' is not supported"},
    {"logits_processors", kBoth, Kind::kRefused, null_or_empty,
     "'logits_processors' is not supported"},
    {"lora_path", kBoth, Kind::kRefused, null_or_empty, kNoLora},
    {"lora_request", kBoth, Kind::kRefused, null_or_empty, kNoLora},
};
// clang-format on

const Field* find_field(std::string_view name) {
  for (const Field& f : kFields)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

void check_request_fields(Endpoint endpoint, const json& body) {
  const unsigned mask = endpoint == Endpoint::kCompletions ? kCompletions : kChat;
  const char* route =
      endpoint == Endpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions";
  for (const auto& [name, value] : body.items()) {
    const Field* f = find_field(name);
    if (!f || !(f->endpoints & mask))
      throw ApiError(400, "Unrecognized request argument supplied: '" + name + "' (" + route + ")",
                     name);
    if (f->accepts(value)) continue;
    if (f->kind == Kind::kRefused) throw ApiError(400, f->refusal, name);
    throw ApiError(400, "'" + name + "' has an invalid value " + value.dump().substr(0, 80), name);
  }
}

}  // namespace blend
