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

// A line whose custom_id cannot be read (not JSON, not an object, no custom_id) is keyed by its
// line number, in a form no custom_id can take: custom_ids are JSON strings, so valid UTF-8, and
// this key starts with the byte 0xFF. (It was "line-N", which a real custom_id "line-2" collided
// with.) Its result line has custom_id null and the line number in `error.line`, and a rerun
// reads that back as this key, so the line counts as done.
std::string unreadable_line_key(int64_t line_number);
// The line number of such a key; nullopt for a real custom_id.
std::optional<int64_t> unreadable_line_number(const std::string& key);

// How messages name a line: its custom_id, or "line N" when it has none that can be read.
std::string batch_line_name(const BatchInputLine& line);

// Reads every non-blank line. Malformed lines (not JSON, nested deeper than
// kMaxClientJsonDepth, a number out of range, no custom_id/url/body) become entries with
// `error` set (their custom_id is unreadable_line_key(N) when none can be read). Throws
// blend::Error if the file cannot be read or two lines share a custom_id (the Batch API requires
// them unique).
std::vector<BatchInputLine> read_batch_input(const std::filesystem::path& path);
// The same, one line at a time, in file order, without holding them all (a 400K-request
// workload's JSON bodies would take gigabytes).
void for_each_batch_input(const std::filesystem::path& path,
                          const std::function<void(BatchInputLine&&)>& visit);

// One JSONL line (no newline) for `j`. Never throws on text that is not valid UTF-8: an error
// message may quote a client's bytes, and one such byte used to kill a whole `blend batch` run
// (json type_error 316); those bytes become U+FFFD. U+2028, U+2029 and U+0085 are written as
// \u escapes: Python's splitlines() and some JavaScript readers break lines there. Every JSONL
// writer uses this.
std::string jsonl_dump(const nlohmann::json& j);

// Replaces `path` with `text`: write a temporary beside it, fsync, rename, fsync the directory,
// so that a reader (or a restart after a crash) sees the old content or the new, never a part.
// A full disk is a blend::Error naming the file and the reason, and leaves neither a partial
// file nor the temporary behind.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

// An exclusive lock (flock LOCK_EX | LOCK_NB) on the file `path` (created if missing), held
// until destruction: at most one blend process works on one output file or data directory (two
// would run the same requests and write each result twice). Throws blend::Error naming `path`
// and `what` (the thing it guards) when another process holds it. Two locks in one process
// conflict too (each opens its own file description). The lock is on the file that is at
// `path` once locked: a lock taken on a file its holder removed meanwhile is taken again.
class ExclusiveLock {
 public:
  ExclusiveLock(const std::filesystem::path& path, const std::string& what);
  ~ExclusiveLock();
  ExclusiveLock(const ExclusiveLock&) = delete;
  ExclusiveLock& operator=(const ExclusiveLock&) = delete;

  // The work it guards is done: the destructor removes the lock file, still holding the lock,
  // then releases it. Safe for exactly-once: a process that opened the file before it went
  // finds, once it gets the lock, that it is no longer the file at `path`, and locks that one.
  void remove_file_on_release() { remove_file_ = true; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool remove_file_ = false;
};

// The lock file of a `blend batch` output: OUTPUT.lock beside it (not the output itself, which
// BatchResultWriter may replace by a rename).
inline std::filesystem::path output_lock_path(const std::filesystem::path& output) {
  return output.string() + ".lock";
}

// Appends result lines to a JSONL file. The caller makes sure no other process writes it
// (ExclusiveLock).
class BatchResultWriter {
 public:
  // Opens (creating) `path`; a torn last line left by a killed run is cut off first. A whole
  // line that is no result of ours (not a JSON object with a custom_id, e.g. edited or
  // corrupted) or that repeats a custom_id already there is set aside: appended to
  // set_aside_path() and the file rewritten without it, atomically (write_file_atomically). So
  // no good result is lost, the bad line's bytes are kept, and the output stays a file every
  // reader can parse, each custom_id once; a request whose only line was set aside runs again.
  // The custom_ids present are returned by done_ids().
  explicit BatchResultWriter(const std::filesystem::path& path);
  ~BatchResultWriter();
  BatchResultWriter(const BatchResultWriter&) = delete;
  BatchResultWriter& operator=(const BatchResultWriter&) = delete;

  const std::unordered_set<std::string>& done_ids() const { return done_; }
  // Lines the constructor set aside, and where they went (`path` + ".set-aside").
  int64_t set_aside() const { return set_aside_; }
  std::filesystem::path set_aside_path() const;
  void write_success(const std::string& custom_id, const nlohmann::json& body);
  void write_error(const std::string& custom_id, int status, const nlohmann::json& error_body);

 private:
  // `key`: the custom_id, or an unreadable line's key (written as custom_id null, error.line N).
  void write_result(const std::string& key, int status, const nlohmann::json& body);
  void append(const std::string& key, const nlohmann::json& line);
  std::filesystem::path path_;
  int fd_ = -1;
  std::unordered_set<std::string> done_;
  int64_t set_aside_ = 0;
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
  // Polled while a line's response_format or tool grammar compiles: true stops the compile
  // (the line then fails with a cancellation error, which the caller, knowing why, drops
  // rather than writes: the batch was cancelled or the process is stopping). Unset: never.
  std::function<bool()> cancelled;
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
