// BatchStore — the Batch API's files and batch records in the server's data directory, so that
// they survive a restart:
//   files/<file-id>.jsonl          uploaded content or a batch's results
//   files/<file-id>.json           the file object (id, bytes, filename, purpose, ...)
//   batches/<batch-id>.json        the batch object, plus the id its results will get
//   batches/<batch-id>.<status>    a status the disk had no room for (save_batch)
//   lock                           held by the one process using the directory
// Records are replaced atomically (write + rename). Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/batch_file.h"

namespace blend {

class BatchStore {
 public:
  // Creates the folders and locks the directory (DIR/lock, held for the store's life): a second
  // server on one data dir would resume and run the same batches twice. Throws blend::Error
  // naming the directory when another process holds it.
  explicit BatchStore(std::filesystem::path dir);

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
  // Replaces the record with this batch object. When the disk is full and the status is one a
  // resume would undo (failed, cancelled, cancelling), the status is kept instead in a marker
  // batches/<batch-id>.<status> (empty, or the failure's reason): the next BatchStore on this
  // directory writes it into the record, publishes the results written so far, and removes it.
  // Throws blend::Error when neither can be written.
  void save_batch(const nlohmann::json& batch);
  std::vector<nlohmann::json> batches() const;  // every batch on disk

 private:
  std::filesystem::path marker_path(const std::string& id, const std::string& status) const;
  void apply_status_markers();  // save_batch's markers, into their records

  std::filesystem::path dir_;
  std::unique_ptr<ExclusiveLock> lock_;
  // Batches whose marker could not be folded into the record yet (the disk still full), as
  // they are to be answered.
  std::map<std::string, nlohmann::json> marked_;
  mutable std::mutex mu_;
};

int64_t unix_seconds();

}  // namespace blend
