#pragma once

// The file operations the journal needs, behind an interface so that tests
// can inject failures (a full disk, a failing fsync). PosixJournalFs
// (posix_journal_fs.h) is the real one.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hicache::persist {

// An open file written at its end. Not thread-safe: one owner at a time.
class JournalFile {
 public:
  virtual ~JournalFile() = default;
  // Writes all of `data` at the end (retrying short writes and EINTR).
  // An error leaves an unknown suffix of `data` written.
  virtual absl::Status Append(absl::string_view data) = 0;
  // fdatasync.
  virtual absl::Status Sync() = 0;
};

class JournalFs {
 public:
  virtual ~JournalFs() = default;
  // Creates (or truncates) `path` with mode 0600 for appending.
  virtual absl::StatusOr<std::unique_ptr<JournalFile>> Create(
      const std::string& path) = 0;
  // Atomically replaces `to` with `from` (rename(2)).
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  // fsyncs the directory, making a rename or a creation durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Removes `path`; OK if it does not exist.
  virtual absl::Status Remove(const std::string& path) = 0;
};

}  // namespace hicache::persist
