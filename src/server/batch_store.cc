#include "server/batch_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <tuple>

#include "api/batch_file.h"
#include "core/error.h"

namespace blend {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

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

// Statuses that a restart must not undo by resuming the batch (it would run lines again).
constexpr const char* kMarkedStatuses[] = {"failed", "cancelled", "cancelling"};

// What a marker's status becomes in the record: its time field, and for a failed batch the
// reason the marker holds (or a generic one when even that could not be written).
void apply_marker(json& batch, const std::string& status, const std::string& reason, int64_t when) {
  batch["status"] = status;
  batch[status + "_at"] = when;
  if (status == "failed")
    batch["errors"] = {
        {"object", "list"},
        {"data",
         json::array({{{"code", "write_failed"},
                       {"message",
                        reason.empty() ? "the batch's results could not be written" : reason}}})}};
}

}  // namespace

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

BatchStore::BatchStore(fs::path dir) : dir_(std::move(dir)) {
  fs::create_directories(dir_);
  lock_ = std::make_unique<ExclusiveLock>(dir_ / "lock", "the data directory " + dir_.string());
  fs::create_directories(dir_ / "files");
  fs::create_directories(dir_ / "batches");
  apply_status_markers();
}

fs::path BatchStore::marker_path(const std::string& id, const std::string& status) const {
  return dir_ / "batches" / (id + "." + status);
}

void BatchStore::apply_status_markers() {
  std::vector<fs::path> markers;
  for (const auto& entry : fs::directory_iterator(dir_ / "batches")) {
    const std::string status = entry.path().extension().string().substr(1);
    if (std::find(std::begin(kMarkedStatuses), std::end(kMarkedStatuses), status) !=
        std::end(kMarkedStatuses))
      markers.push_back(entry.path());
  }
  for (const fs::path& marker : markers) {
    const std::string status = marker.extension().string().substr(1);
    const std::string id = marker.stem().string();
    const fs::path path = dir_ / "batches" / (id + ".json");
    std::optional<json> record = read_json(path);
    std::error_code ec;
    if (!record || !record->contains("batch")) {
      fs::remove(marker, ec);
      continue;
    }
    json& batch = (*record)["batch"];
    std::string reason;
    {
      std::ifstream in(marker, std::ios::binary);
      reason.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    struct stat st {};
    apply_marker(batch, status, reason,
                 ::stat(marker.c_str(), &st) == 0 ? st.st_mtime : unix_seconds());
    // What was written before the failure is downloadable (a full disk may have kept the
    // server from publishing it).
    for (const auto& [field, key, suffix] :
         {std::tuple{"output_file_id", "output_id", "_output.jsonl"},
          std::tuple{"error_file_id", "error_id", "_errors.jsonl"}}) {
      const std::string file = record->value(key, "");
      if (status == "cancelling" || file.empty() || !batch[field].is_null()) continue;
      if (fs::file_size(file_path(file), ec) == 0 || ec) continue;
      try {
        if (!fs::exists(dir_ / "files" / (file + ".json")))
          register_file(file, id + suffix, "batch_output");
        batch[field] = file;
      } catch (const Error&) {
        // still no room: a later start publishes it
      }
    }
    try {
      write_file_atomically(path, jsonl_dump(*record));
      fs::remove(marker, ec);
    } catch (const Error& e) {
      // Still no room: the marker stays, and until a start can fold it in, this store answers
      // with the marked status (so the batch is not resumed).
      std::fprintf(stderr, "blend serve: cannot save batch %s yet (%s); it stays %s\n", id.c_str(),
                   e.what(), status.c_str());
      marked_[id] = batch;
    }
  }
}

fs::path BatchStore::file_path(const std::string& id) const {
  return dir_ / "files" / (id + ".jsonl");
}

json BatchStore::create_file(const std::string& filename, const std::string& purpose,
                             const std::string& content) {
  const std::string id = make_id("file-");
  write_file_atomically(file_path(id), content);
  try {
    return register_file(id, filename, purpose);
  } catch (...) {
    // Unpublished content would fill the disk unlisted and undeletable.
    std::error_code ec;
    fs::remove(file_path(id), ec);
    throw;
  }
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
  write_file_atomically(dir_ / "files" / (id + ".json"), jsonl_dump(f));
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
  write_file_atomically(
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
  try {
    write_file_atomically(path, jsonl_dump(record));
  } catch (const Error& e) {
    const std::string status = batch.value("status", "");
    if (std::find(std::begin(kMarkedStatuses), std::end(kMarkedStatuses), status) ==
        std::end(kMarkedStatuses))
      throw;
    // A full disk: the record cannot be replaced, but a restart must not resume the batch.
    // An empty file costs no data block (and passes a file size limit); its name is the status,
    // its content the reason if that fits. The constructor folds it into the record.
    const fs::path marker = marker_path(id, status);
    const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw;
    std::string reason;
    if (batch.contains("errors") && batch["errors"].is_object() &&
        batch["errors"].value("data", json::array()).size() > 0)
      reason = batch["errors"]["data"][0].value("message", "");
    if (!reason.empty() &&
        ::write(fd, reason.data(), reason.size()) != static_cast<ssize_t>(reason.size()))
      (void)::ftruncate(fd, 0);  // no reason rather than a part of one
    ::fsync(fd);
    ::close(fd);
    std::fprintf(stderr, "blend serve: cannot save batch %s (%s); its status '%s' is kept in %s\n",
                 id.c_str(), e.what(), status.c_str(), marker.c_str());
  }
}

std::optional<json> BatchStore::batch(const std::string& id) const {
  if (!safe_id(id)) return std::nullopt;
  std::lock_guard lock(mu_);
  if (auto marked = marked_.find(id); marked != marked_.end()) return marked->second;
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
    if (auto marked = marked_.find(entry.path().stem().string()); marked != marked_.end()) {
      out.push_back(marked->second);
      continue;
    }
    auto record = read_json(entry.path());
    if (record && record->contains("batch")) out.push_back((*record)["batch"]);
  }
  return out;
}

}  // namespace blend
