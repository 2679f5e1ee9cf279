#include "api/batch_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>

#include "api/api_error.h"
#include "api/json_limits.h"
#include "core/error.h"

namespace blend {
namespace {

using nlohmann::json;

const char* endpoint_url(Endpoint e) {
  return e == Endpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions";
}

void check_line(const BatchInputLine& line, const BatchLineContext& context,
                PreparedBatchLine& out) {
  if (line.error) throw ApiError(400, *line.error, line.error_param);
  const Endpoint endpoint = parse_endpoint(line.url);
  if (context.endpoint && endpoint != *context.endpoint)
    throw ApiError(400,
                   "the line's url '" + line.url + "' differs from the batch's endpoint '" +
                       endpoint_url(*context.endpoint) + "'",
                   "url");
  const nlohmann::json& body = line.body;
  const ModelId model = resolve_model(body, context.models, context.any_model_name);
  const ServedModel& served = context.models.at(static_cast<size_t>(model));
  if (auto s = body.find("stream"); s != body.end() && *s == true)
    throw ApiError(400, "a batch request cannot be streamed ('stream' must be false)", "stream");
  RequestLimits limits;
  limits.max_prompt_bytes = served.max_prompt_bytes;
  limits.sampling_defaults = served.sampling_defaults;
  limits.grammars = served.grammars;
  limits.max_sequence_tokens = context.max_sequence_tokens;  // before compiling its grammar
  limits.cancelled = context.cancelled;
  if (!served.tokenizer) throw Error("batch line context: the model has no tokenizer attached");
  out.api = parse_api_request(endpoint, body, *served.tokenizer, served.chat_template, limits);
  out.api.model_id = model;
  check_context(out.api, body, context.max_sequence_tokens);
  out.generation.id = line.custom_id;
  out.generation.model = model;
  out.generation.prompt = std::move(out.api.prompt);
  out.api.prompt.clear();
  out.generation.params = out.api.params;
  out.generation.request_class = context.request_class;
  out.generation.ttft_slo = out.api.ttft_slo;
  out.generation.tpot_slo = out.api.tpot_slo;
  out.generation.adaptive_blocks = out.api.adaptive_blocks;
}

}  // namespace

std::string make_id(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t base =
      std::random_device{}() ^
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  uint64_t x = base + 0x9e3779b97f4a7c15ull * ++counter;
  x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx%08x", static_cast<unsigned long long>(x),
                static_cast<unsigned>(counter.load() & 0xffffffffu));
  return prefix + buf;
}

std::vector<BatchInputLine> read_batch_input(const std::filesystem::path& path) {
  std::vector<BatchInputLine> lines;
  for_each_batch_input(path, [&lines](BatchInputLine&& line) { lines.push_back(std::move(line)); });
  return lines;
}

void for_each_batch_input(const std::filesystem::path& path,
                          const std::function<void(BatchInputLine&&)>& visit) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path.string());
  std::unordered_set<std::string> seen;
  std::string text;
  int64_t number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    BatchInputLine line;
    line.line_number = number;
    line.custom_id = unreadable_line_key(number);
    json j;
    try {
      // Depth-bounded: one line of 100,000 nested arrays used to kill the whole run.
      j = parse_client_json(text, "line " + std::to_string(number));
    } catch (const ApiError& e) {
      line.error = e.what();
      line.error_param = e.param();
    }
    if (!line.error) {
      if (!j.is_object()) {
        line.error = "line " + std::to_string(number) + " is not a JSON object";
      } else if (!j.contains("custom_id") || !j["custom_id"].is_string() ||
                 j["custom_id"].get_ref<const std::string&>().empty()) {
        line.error = "missing 'custom_id'";
        line.error_param = "custom_id";
      } else {
        line.custom_id = j["custom_id"].get<std::string>();
        if (j.contains("method") && j["method"] != "POST") {
          line.error = "'method' must be POST";
          line.error_param = "method";
        } else if (!j.contains("url") || !j["url"].is_string()) {
          line.error = "missing 'url'";
          line.error_param = "url";
        } else if (!j.contains("body") || !j["body"].is_object()) {
          line.error = "missing 'body' object";
          line.error_param = "body";
        } else {
          line.url = j["url"].get<std::string>();
          line.body = std::move(j["body"]);
        }
      }
    }
    if (!seen.insert(line.custom_id).second)
      throw Error(path.string() + ": custom_id '" + line.custom_id + "' appears twice (line " +
                  std::to_string(number) + "); custom_ids must be unique");
    visit(std::move(line));
  }
}

namespace {

// A result line's key: its custom_id, or for an unreadable input line unreadable_line_key of the
// line number in `error.line`; nullopt for a line that is no result of ours.
std::optional<std::string> result_key(const json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto id = j.find("custom_id");
  if (id == j.end()) return std::nullopt;
  if (id->is_string() && !id->get_ref<const std::string&>().empty()) return id->get<std::string>();
  if (!id->is_null()) return std::nullopt;
  const auto error = j.find("error");
  if (error == j.end() || !error->is_object()) return std::nullopt;
  const auto line = error->find("line");
  if (line == error->end() || !line->is_number_integer()) return std::nullopt;
  return unreadable_line_key(line->get<int64_t>());
}

void write_all(int fd, const std::string& text, const std::filesystem::path& path) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("cannot write " + path.string() + ": " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void fsync_directory(const std::filesystem::path& path) {
  const std::filesystem::path parent =
      path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
  if (const int dir = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace

std::string unreadable_line_key(int64_t line_number) {
  return "\xff" + std::to_string(line_number);
}

std::optional<int64_t> unreadable_line_number(const std::string& key) {
  if (key.size() < 2 || key[0] != '\xff') return std::nullopt;
  char* end = nullptr;
  const long long number = std::strtoll(key.c_str() + 1, &end, 10);
  if (*end != '\0') return std::nullopt;
  return number;
}

std::string batch_line_name(const BatchInputLine& line) {
  if (unreadable_line_number(line.custom_id)) return "line " + std::to_string(line.line_number);
  return line.custom_id;
}

std::string jsonl_dump(const json& j) {
  const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  // These code points' UTF-8 bytes start with lead bytes (0xC2, 0xE2), so a byte search cannot
  // match inside another character; outside strings the dump is ASCII.
  static constexpr std::pair<std::string_view, std::string_view> kLineBreaks[] = {
      {"\xe2\x80\xa8", "\\u2028"}, {"\xe2\x80\xa9", "\\u2029"}, {"\xc2\x85", "\\u0085"}};
  if (text.find("\xe2\x80") == std::string::npos && text.find("\xc2\x85") == std::string::npos)
    return text;
  std::string out;
  out.reserve(text.size() + 16);
  for (size_t i = 0; i < text.size();) {
    bool replaced = false;
    for (const auto& [bytes, escape] : kLineBreaks)
      if (std::string_view(text).substr(i, bytes.size()) == bytes) {
        out += escape;
        i += bytes.size();
        replaced = true;
        break;
      }
    if (!replaced) out += text[i++];
  }
  return out;
}

void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(what);
  };
  try {
    write_all(fd, text, path);
  } catch (const Error& e) {
    fail(e.what());
  }
  if (::fsync(fd) != 0) fail("cannot sync " + path.string() + ": " + std::strerror(errno));
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write " + path.string() + ": " + std::strerror(error));
  }
  fsync_directory(path);
}

namespace {

// Whether the open file `fd` is the one at `path` now (not removed or replaced since opened).
bool is_file_at(int fd, const std::filesystem::path& path) {
  struct stat opened = {};
  struct stat there = {};
  return ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &there) == 0 &&
         opened.st_dev == there.st_dev && opened.st_ino == there.st_ino;
}

}  // namespace

ExclusiveLock::ExclusiveLock(const std::filesystem::path& path, const std::string& what)
    : path_(path) {
  // Each retry means the holder removed the file between our open and our lock (it finished).
  for (int attempt = 0;; ++attempt) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error("cannot open the lock file " + path.string() + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) break;
    if (is_file_at(fd_, path)) return;
    ::close(fd_);
    fd_ = -1;
    if (attempt == 100) throw Error("cannot lock " + path.string() + ": it keeps being removed");
  }
  const int error = errno;
  ::close(fd_);
  fd_ = -1;
  if (error == EWOULDBLOCK)
    throw Error("another blend process is using " + what + " (it holds the lock " + path.string() +
                "); two would run the same requests and write them twice");
  throw Error("cannot lock " + path.string() + ": " + std::strerror(error));
}

ExclusiveLock::~ExclusiveLock() {
  if (fd_ < 0) return;
  if (remove_file_) ::unlink(path_.c_str());  // while still held (see remove_file_on_release)
  ::close(fd_);                               // releases the lock
}

BatchResultWriter::BatchResultWriter(const std::filesystem::path& path) : path_(path) {
  // Read what an earlier run finished; a last line without its newline was torn by a kill.
  std::string content;
  {
    std::ifstream in(path, std::ios::binary);
    if (in) content.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  size_t keep = content.size();
  if (!content.empty() && content.back() != '\n') {
    const size_t nl = content.rfind('\n');
    keep = nl == std::string::npos ? 0 : nl + 1;
  }
  // The output without the set-aside lines: `content` itself up to the first one, so `kept` is
  // only built (a copy of a possibly large file) once a line is set aside.
  std::string kept, set_aside;
  size_t start = 0;
  while (start < keep) {
    const size_t line_start = start;
    const size_t end = content.find('\n', start);
    const std::string_view line(content.data() + start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    // The file may have been edited: parse with the client bounds.
    std::optional<std::string> key;
    if (json_nesting_depth(line) <= kMaxClientJsonDepth)
      key = result_key(json::parse(line, nullptr, /*allow_exceptions=*/false));
    if (key && done_.insert(*key).second) {
      if (set_aside_ > 0) kept.append(content, line_start, start - line_start);
      continue;
    }
    if (set_aside_++ == 0) kept = content.substr(0, line_start);
    set_aside.append(content, line_start, start - line_start);
  }
  if (set_aside_ > 0) {
    // The set-aside bytes are safe on disk before the output drops them.
    const int fd =
        ::open(set_aside_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
      throw Error("cannot write " + set_aside_path().string() + ": " + std::strerror(errno));
    try {
      write_all(fd, set_aside, set_aside_path());
    } catch (const Error&) {
      ::close(fd);
      throw;
    }
    ::fsync(fd);
    ::close(fd);
    write_file_atomically(path, kept);
    keep = kept.size();
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open " + path.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && static_cast<size_t>(st.st_size) > keep &&
      ::ftruncate(fd_, static_cast<off_t>(keep)) != 0)
    throw Error("cannot repair " + path.string() + ": " + std::strerror(errno));
}

BatchResultWriter::~BatchResultWriter() {
  if (fd_ >= 0) {
    ::fsync(fd_);
    ::close(fd_);
  }
}

std::filesystem::path BatchResultWriter::set_aside_path() const {
  return path_.string() + ".set-aside";
}

void BatchResultWriter::append(const std::string& key, const json& line) {
  // One write(2) per line on an O_APPEND descriptor: the kernel keeps the line whole even if
  // the process is killed right after, and concurrent appenders do not interleave.
  // A full disk (or a file size limit) may take part of the line and then refuse the rest:
  // cut the part off again, so the file holds whole lines only and a later append (or a
  // rerun, once there is space) does not glue a result onto a torn one (issue 26).
  const std::string text = jsonl_dump(line) + "\n";
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      if (done > 0 && end >= 0) (void)::ftruncate(fd_, end);
      throw Error("cannot write " + path_.string() + ": " + std::strerror(error));
    }
    done += static_cast<size_t>(n);
  }
  done_.insert(key);
}

void BatchResultWriter::write_result(const std::string& key, int status, const json& body) {
  json line = {
      {"id", make_id("batch_req_")},
      {"custom_id", nullptr},
      {"response", {{"status_code", status}, {"request_id", make_id("req_")}, {"body", body}}},
      {"error", nullptr}};
  if (const std::optional<int64_t> number = unreadable_line_number(key)) {
    // No custom_id to give: the line number says which input line this answers.
    std::string message;
    if (body.contains("error") && body["error"].is_object())
      message = body["error"].value("message", "");
    line["error"] = {{"code", "invalid_line"}, {"message", message}, {"line", *number}};
  } else {
    line["custom_id"] = key;
  }
  append(key, line);
}

void BatchResultWriter::write_success(const std::string& custom_id, const json& body) {
  write_result(custom_id, 200, body);
}

void BatchResultWriter::write_error(const std::string& custom_id, int status,
                                    const json& error_body) {
  write_result(custom_id, status, error_body);
}

PreparedBatchLine prepare_batch_line(const BatchInputLine& line, const BatchLineContext& context) {
  PreparedBatchLine out;
  out.custom_id = line.custom_id;
  try {
    check_line(line, context, out);
  } catch (const ApiError& e) {
    out.error = e;
  } catch (const Error& e) {
    out.error = ApiError(400, e.what());
  }
  return out;
}

}  // namespace blend
