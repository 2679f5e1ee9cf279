// One Batch API input line -> a generation request, or the error result that line gets. Both
// `blend batch` and the server's Batch API run lines through this, so they check the same
// things (issue 24; they had drifted: only the server checked the model and the context, and
// a bad number in one line aborted the whole CLI run). The checks, in order:
//   the line itself: valid JSON within the depth bound, custom_id, method POST, url, body
//     (api/batch_file.cc reads these; custom_ids unique across the file is refused there,
//     for the whole file, before anything runs);
//   the url names a supported endpoint, and the batch's endpoint when the batch has one
//     (OpenAI refuses lines whose url differs from the batch's);
//   the body's model is one of the served models (api/served_models.h);
//   not a streaming request;
//   the body parses as an OpenAI request (api/openai.h: every field audited, numbers in
//     range, prompt text within what the context can hold before tokenizing);
//   the prompt and an explicit max_tokens fit the context (check_context).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/batch_file.h"
#include "api/openai.h"
#include "api/served_models.h"
#include "core/request.h"

namespace blend {

class ChatTemplate;
class GrammarCompiler;
class Tokenizer;

// What every line of one batch is checked against.
struct BatchLineContext {
  // The models lines may name, by ModelId: names, chat templates, sampling defaults, and the
  // text each reads lines with (tokenizer, schema compiler, prompt limit: attach_model_text).
  std::vector<ServedModel> models;
  bool any_model_name = false;       // one model, taken whatever name a line gives
  int64_t max_sequence_tokens = 0;   // the engine's (context and KV memory)
  std::optional<Endpoint> endpoint;  // the batch's; unset = each line's url decides
  RequestClass request_class = RequestClass::kBestEffort;
};

struct PreparedBatchLine {
  std::string custom_id;
  std::optional<ApiError> error;  // set: the line's result is this error, nothing runs
  // Else: submit this (id = custom_id) api.n times, with index 0 .. n - 1 (OpenAI's n: one
  // result line with n choices) ...
  GenerationRequest generation;
  ApiRequest api;  // ... and build the response with this (prompt moved out)
};

PreparedBatchLine prepare_batch_line(const BatchInputLine& line, const BatchLineContext& context);

}  // namespace blend
