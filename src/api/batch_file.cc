#include "api/batch_file.h"

#include <fcntl.h>
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
    line.custom_id = "line-" + std::to_string(number);
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
  size_t start = 0;
  while (start < keep) {
    const size_t end = content.find('\n', start);
    const std::string line = content.substr(start, end - start);
    start = end + 1;
    // A line that does not parse is not ours to judge: keep it, it does not count as done.
    // Lines are ours, but the file may have been edited: parse with the client bounds.
    if (json_nesting_depth(line) > kMaxClientJsonDepth) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("custom_id") && j["custom_id"].is_string())
      done_.insert(j["custom_id"].get<std::string>());
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open " + path.string() + ": " + std::strerror(errno));
  if (keep < content.size() && ::ftruncate(fd_, static_cast<off_t>(keep)) != 0)
    throw Error("cannot repair " + path.string() + ": " + std::strerror(errno));
}

BatchResultWriter::~BatchResultWriter() {
  if (fd_ >= 0) {
    ::fsync(fd_);
    ::close(fd_);
  }
}

void BatchResultWriter::append(const json& line) {
  // One write(2) per line on an O_APPEND descriptor: the kernel keeps the line whole even if
  // the process is killed right after, and concurrent appenders do not interleave.
  // A full disk (or a file size limit) may take part of the line and then refuse the rest:
  // cut the part off again, so the file holds whole lines only and a later append (or a
  // rerun, once there is space) does not glue a result onto a torn one (issue 26).
  const std::string text = line.dump() + "\n";
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
  if (line.contains("custom_id") && line["custom_id"].is_string())
    done_.insert(line["custom_id"].get<std::string>());
}

void BatchResultWriter::write_success(const std::string& custom_id, const json& body) {
  append({{"id", make_id("batch_req_")},
          {"custom_id", custom_id},
          {"response", {{"status_code", 200}, {"request_id", make_id("req_")}, {"body", body}}},
          {"error", nullptr}});
}

void BatchResultWriter::write_error(const std::string& custom_id, int status,
                                    const json& error_body) {
  append({{"id", make_id("batch_req_")},
          {"custom_id", custom_id},
          {"response",
           {{"status_code", status}, {"request_id", make_id("req_")}, {"body", error_body}}},
          {"error", nullptr}});
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
