#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/core/lock_file.h"

namespace hicache {

// Exclusive ownership of a unix socket path for one daemon process.
//
// Acquire() takes an advisory lock on "<path>.lock" (which holds the owner's
// pid), so two daemons can never serve the same path, even when they start at
// the same moment. The lock file is never a symlink, another user's file or a
// hard link (see LockFile): the socket's directory may be world-writable.
// Under the lock it inspects <path> with lstat (a symlink is never followed):
//   * absent: fine;
//   * a socket nobody listens on (a crashed daemon's leftover): removed;
//   * a socket somebody listens on: refused (FAILED_PRECONDITION);
//   * anything else (a file, a directory): refused, never deleted.
// The destructor removes the socket and the lock file and releases the lock.
//
// Not thread-safe; owned by the daemon's main thread.
class SocketGuard {
 public:
  static absl::StatusOr<std::unique_ptr<SocketGuard>> Acquire(
      const std::string& socket_path);

  ~SocketGuard();
  SocketGuard(const SocketGuard&) = delete;
  SocketGuard& operator=(const SocketGuard&) = delete;

  const std::string& socket_path() const { return socket_path_; }
  // True when Acquire() removed a stale socket left by a dead daemon.
  bool removed_stale_socket() const { return removed_stale_socket_; }

  // chmod(socket_path, mode). REQUIRES: the server has bound the socket.
  absl::Status SetSocketMode(mode_t mode) const;

 private:
  SocketGuard(std::string socket_path, std::unique_ptr<LockFile> lock,
              bool removed_stale_socket);

  const std::string socket_path_;
  const std::unique_ptr<LockFile> lock_;
  const bool removed_stale_socket_;
};

}  // namespace hicache
