#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace hicache {

// An exclusive advisory lock (flock) on a small file that records the
// holder's pid, held for the object's lifetime. It proves that its holder is
// alive: the kernel drops the lock when the process dies, even by SIGKILL.
//
// The file may live in a directory other users can write to (/tmp,
// /dev/shm), so Acquire() never follows a symbolic link and never writes to
// a file it did not create for this user: the file is opened with
// O_NOFOLLOW | O_NOCTTY | O_CLOEXEC and must be a regular file owned by the
// effective uid with a single link. Root is held to the same checks.
//
// Thread-compatible; usually owned by the daemon's main thread.
class LockFile {
 public:
  // Opens `path` (creating it with mode 0600), locks it without waiting and
  // writes "<pid>\n" into it. Errors, all FAILED_PRECONDITION naming `path`:
  //   * another process holds the lock: `*holder` (when given) is set to the
  //     pid that process recorded, or "unknown";
  //   * `path` is a symbolic link, not a regular file, is owned by another
  //     uid or has more than one link: nothing is written, nothing removed;
  //   * it cannot be opened, locked or written.
  // `*holder` stays empty for every error but the first.
  static absl::StatusOr<std::unique_ptr<LockFile>> Acquire(
      const std::string& path, std::string* holder = nullptr);

  // Unlinks the file (only while `path` still names the locked file), then
  // closes it, which releases the lock.
  ~LockFile();
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  LockFile(std::string path, int fd);

  const std::string path_;
  const int fd_;
};

}  // namespace hicache
