#include "server/batch_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "api/batch_file.h"
#include "core/error.h"

namespace blend {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Write, fsync, rename, fsync the directory: a reader (or a restart after a crash) sees the
// old content or the new, never a part. A full disk is a blend::Error naming the file and the
// reason, and leaves neither a partial file nor the temporary behind (issue 26).
void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  auto fail = [&](const char* what) {
    const int error = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(std::string("cannot ") + what + " " + path.string() + ": " + std::strerror(error));
  };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("sync");
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write " + path.string() + ": " + std::strerror(error));
  }
  if (const int dir = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::optional<json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    return json::parse(in);
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

// Ids come from URLs: only our own id alphabet may reach a path.
bool safe_id(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
  return true;
}

}  // namespace

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

BatchStore::BatchStore(fs::path dir) : dir_(std::move(dir)) {
  fs::create_directories(dir_ / "files");
  fs::create_directories(dir_ / "batches");
}

fs::path BatchStore::file_path(const std::string& id) const {
  return dir_ / "files" / (id + ".jsonl");
}

json BatchStore::create_file(const std::string& filename, const std::string& purpose,
                             const std::string& content) {
  const std::string id = make_id("file-");
  write_atomically(file_path(id), content);
  return register_file(id, filename, purpose);
}

json BatchStore::register_file(const std::string& id, const std::string& filename,
                               const std::string& purpose) {
  std::error_code ec;
  const auto bytes = fs::file_size(file_path(id), ec);
  json f = {{"id", id},
            {"object", "file"},
            {"bytes", ec ? 0 : static_cast<int64_t>(bytes)},
            {"created_at", unix_seconds()},
            {"filename", filename},
            {"purpose", purpose},
            {"status", "processed"},
            {"status_details", nullptr}};
  std::lock_guard lock(mu_);
  write_atomically(dir_ / "files" / (id + ".json"), f.dump());
  return f;
}

std::optional<json> BatchStore::file(const std::string& id) const {
  if (!safe_id(id)) return std::nullopt;
  std::lock_guard lock(mu_);
  return read_json(dir_ / "files" / (id + ".json"));
}

std::vector<json> BatchStore::files() const {
  std::lock_guard lock(mu_);
  std::vector<json> out;
  for (const auto& entry : fs::directory_iterator(dir_ / "files")) {
    if (entry.path().extension() != ".json") continue;
    if (auto f = read_json(entry.path()); f && f->is_object()) out.push_back(std::move(*f));
  }
  return out;
}

bool BatchStore::delete_file(const std::string& id) {
  if (!safe_id(id)) return false;
  std::lock_guard lock(mu_);
  std::error_code ec;
  // The object goes first: a crash in between leaves unpublished content, never a file object
  // without its content.
  if (!fs::remove(dir_ / "files" / (id + ".json"), ec)) return false;
  fs::remove(file_path(id), ec);
  return true;
}

json BatchStore::create_batch(const std::string& input_file_id, const std::string& endpoint,
                              const std::string& completion_window, const json& metadata,
                              std::string* output_id) {
  const int64_t now = unix_seconds();
  json b = {{"id", make_id("batch_")},
            {"object", "batch"},
            {"endpoint", endpoint},
            {"errors", nullptr},
            {"input_file_id", input_file_id},
            {"completion_window", completion_window},
            {"status", "in_progress"},
            {"output_file_id", nullptr},
            {"error_file_id", nullptr},
            {"created_at", now},
            {"in_progress_at", now},
            {"expires_at", now + 24 * 3600},
            {"finalizing_at", nullptr},
            {"completed_at", nullptr},
            {"failed_at", nullptr},
            {"expired_at", nullptr},
            {"cancelling_at", nullptr},
            {"cancelled_at", nullptr},
            {"request_counts", {{"total", 0}, {"completed", 0}, {"failed", 0}}},
            {"metadata", metadata}};
  *output_id = make_id("file-");
  std::lock_guard lock(mu_);
  write_atomically(
      dir_ / "batches" / (b["id"].get<std::string>() + ".json"),
      json{{"batch", b}, {"output_id", *output_id}, {"error_id", make_id("file-")}}.dump());
  return b;
}

void BatchStore::save_batch(const json& batch) {
  const std::string id = batch.at("id");
  std::lock_guard lock(mu_);
  const fs::path path = dir_ / "batches" / (id + ".json");
  json record = read_json(path).value_or(json::object());
  record["batch"] = batch;
  write_atomically(path, record.dump());
}

std::optional<json> BatchStore::batch(const std::string& id) const {
  if (!safe_id(id)) return std::nullopt;
  std::lock_guard lock(mu_);
  auto record = read_json(dir_ / "batches" / (id + ".json"));
  if (!record || !record->contains("batch")) return std::nullopt;
  return (*record)["batch"];
}

std::string BatchStore::output_id(const std::string& batch_id) const {
  std::lock_guard lock(mu_);
  auto record = read_json(dir_ / "batches" / (batch_id + ".json"));
  return record ? record->value("output_id", "") : "";
}

std::string BatchStore::error_id(const std::string& batch_id) const {
  std::lock_guard lock(mu_);
  auto record = read_json(dir_ / "batches" / (batch_id + ".json"));
  if (!record) return "";
  // Records written before error files existed have none: derive one from the output's id.
  if (!record->contains("error_id")) return record->value("output_id", "") + "_errors";
  return record->value("error_id", "");
}

std::vector<json> BatchStore::batches() const {
  std::lock_guard lock(mu_);
  std::vector<json> out;
  for (const auto& entry : fs::directory_iterator(dir_ / "batches")) {
    if (entry.path().extension() != ".json") continue;
    auto record = read_json(entry.path());
    if (record && record->contains("batch")) out.push_back((*record)["batch"]);
  }
  return out;
}

}  // namespace blend
