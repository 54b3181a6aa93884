#pragma once

#include <memory>
#include <string>

#include "daemon/persist/journal_fs.h"

namespace hicache::persist {

// JournalFs on POSIX files: open(O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0600),
// write(2) loops, fdatasync(2), rename(2), fsync of an O_DIRECTORY fd.
// Errors carry the path and strerror. Stateless and thread-safe.
class PosixJournalFs : public JournalFs {
 public:
  // The process-wide instance.
  static JournalFs* Default();

  absl::StatusOr<std::unique_ptr<JournalFile>> Create(
      const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status Remove(const std::string& path) override;
};

}  // namespace hicache::persist
