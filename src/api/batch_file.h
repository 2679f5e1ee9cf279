// OpenAI Batch API files (DESIGN.md §1): input JSONL lines {custom_id, method, url, body} and
// result lines {id, custom_id, response: {status_code, request_id, body}, error}. Results are
// appended one line per write(2) as requests finish, so a killed job leaves whole lines behind
// (at worst a torn last line, which reopening removes); rerunning skips custom_ids already done.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/openai.h"
#include "core/request.h"

namespace blend {

struct BatchInputLine {
  int64_t line_number = 0;  // 1-based
  std::string custom_id;
  std::string url;
  nlohmann::json body;
  std::optional<std::string> error;  // why the line cannot run (reported as its result)
  std::string error_param;           // the field at fault ("custom_id", "body.temperature")
};

// Reads every non-blank line. Malformed lines (not JSON, nested deeper than
// kMaxClientJsonDepth, a number out of range, no custom_id/url/body) become entries with
// `error` set (their custom_id is "line-N" when none can be read). Throws blend::Error if the file
// cannot be read or two lines share a custom_id (the Batch API requires them unique).
std::vector<BatchInputLine> read_batch_input(const std::filesystem::path& path);
// The same, one line at a time, in file order, without holding them all (a 400K-request
// workload's JSON bodies would take gigabytes).
void for_each_batch_input(const std::filesystem::path& path,
                          const std::function<void(BatchInputLine&&)>& visit);

// Appends result lines to a JSONL file.
class BatchResultWriter {
 public:
  // Opens (creating) `path`; a torn last line left by a killed run is cut off first. The
  // custom_ids already present are returned by done_ids().
  explicit BatchResultWriter(const std::filesystem::path& path);
  ~BatchResultWriter();
  BatchResultWriter(const BatchResultWriter&) = delete;
  BatchResultWriter& operator=(const BatchResultWriter&) = delete;

  const std::unordered_set<std::string>& done_ids() const { return done_; }
  void write_success(const std::string& custom_id, const nlohmann::json& body);
  void write_error(const std::string& custom_id, int status, const nlohmann::json& error_body);

 private:
  void append(const nlohmann::json& line);
  std::filesystem::path path_;
  int fd_ = -1;
  std::unordered_set<std::string> done_;
};

// A random-looking id such as "batch_req_6f1c..." (prefix + 24 hex digits).
std::string make_id(const std::string& prefix);

// One Batch API input line -> a generation request, or the error result that line gets. Both
// `blend batch` and the server's Batch API run lines through this, so they check the same
// things (issue 24; they had drifted: only the server checked the model and the context, and
// a bad number in one line aborted the whole CLI run). The checks, in order:
//   the line itself: valid JSON within the depth bound, custom_id, method POST, url, body
//     (read_batch_input reads these; custom_ids unique across the file is refused there,
//     for the whole file, before anything runs);
//   the url names a supported endpoint, and the batch's endpoint when the batch has one
//     (OpenAI refuses lines whose url differs from the batch's);
//   the body's model is one of the served models (ServedModel, api/openai.h);
//   not a streaming request;
//   the body parses as an OpenAI request (api/openai.h: every field audited, numbers in
//     range, prompt text within what the context can hold before tokenizing);
//   the prompt and an explicit max_tokens fit the context (check_context).
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
