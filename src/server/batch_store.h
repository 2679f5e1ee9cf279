// BatchStore — the Batch API's files and batch records in the server's data directory, so that
// they survive a restart:
//   files/<file-id>.jsonl          uploaded content or a batch's results
//   files/<file-id>.json           the file object (id, bytes, filename, purpose, ...)
//   batches/<batch-id>.json        the batch object, plus the id its results will get
// Records are replaced atomically (write + rename). Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace blend {

class BatchStore {
 public:
  explicit BatchStore(std::filesystem::path dir);  // creates the folders

  // Stores an upload and returns its file object.
  nlohmann::json create_file(const std::string& filename, const std::string& purpose,
                             const std::string& content);
  std::optional<nlohmann::json> file(const std::string& id) const;
  std::vector<nlohmann::json> files() const;  // every published file object
  // Removes the file's object and content; false when there is no such file.
  bool delete_file(const std::string& id);
  std::filesystem::path file_path(const std::string& id) const;
  // Publishes a file written in place at file_path(id) (a batch's results).
  nlohmann::json register_file(const std::string& id, const std::string& filename,
                               const std::string& purpose);

  // A new batch object in status "in_progress"; its results go to file_path(output_id).
  nlohmann::json create_batch(const std::string& input_file_id, const std::string& endpoint,
                              const std::string& completion_window, const nlohmann::json& metadata,
                              std::string* output_id);
  std::optional<nlohmann::json> batch(const std::string& id) const;
  std::string output_id(const std::string& batch_id) const;
  // Where the batch's failed lines go (a separate file, as OpenAI's error_file_id).
  std::string error_id(const std::string& batch_id) const;
  void save_batch(const nlohmann::json& batch);  // replaces the record with this batch object
  std::vector<nlohmann::json> batches() const;   // every batch on disk

 private:
  std::filesystem::path dir_;
  mutable std::mutex mu_;
};

int64_t unix_seconds();

}  // namespace blend
