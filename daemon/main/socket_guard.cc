#include "daemon/main/socket_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Whether a server accepts connections on the socket at `path`.
absl::StatusOr<bool> SomeoneListens(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    return absl::InternalError(
        absl::StrCat("socket(AF_UNIX): ", ErrnoText(err)));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  close(fd);
  if (rc == 0) return true;
  if (err == ECONNREFUSED || err == ENOENT) return false;
  return absl::FailedPreconditionError(
      absl::StrCat("cannot probe ", path, ": ", ErrnoText(err)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SocketGuard>> SocketGuard::Acquire(
    const std::string& socket_path) {
  if (socket_path.empty()) {
    return absl::InvalidArgumentError("socket path must not be empty");
  }
  if (socket_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path '", socket_path, "' is ", socket_path.size(),
                     " bytes; unix socket paths must be shorter than ",
                     sizeof(sockaddr_un{}.sun_path)));
  }
  const size_t slash = socket_path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : socket_path.substr(0, slash + 1);
  struct stat dir_stat {};
  if (stat(dir.c_str(), &dir_stat) != 0 || !S_ISDIR(dir_stat.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "directory '", dir, "' for socket ", socket_path, " does not exist"));
  }

  const std::string lock_path = absl::StrCat(socket_path, ".lock");
  std::string holder;
  absl::StatusOr<std::unique_ptr<LockFile>> lock =
      LockFile::Acquire(lock_path, &holder);
  if (!lock.ok()) {
    if (!holder.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("another hicached (pid ", holder,
                       ") is already serving ", socket_path));
    }
    return lock.status();
  }

  // From here on the lock is ours; every error path returns before the guard
  // exists, and destroying `lock` removes the lock file and releases it.
  bool removed_stale = false;
  struct stat existing {};
  // lstat: a symlink at the socket path is "not a socket" and never followed.
  if (lstat(socket_path.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          socket_path, " exists and is not a socket; refusing to replace it"));
    }
    absl::StatusOr<bool> live = SomeoneListens(socket_path);
    if (!live.ok()) return live.status();
    if (*live) {
      return absl::FailedPreconditionError(
          absl::StrCat("a server is already listening on ", socket_path));
    }
    // Remove only the socket we inspected: unlink() never follows a symlink,
    // and a path replaced since the lstat above is left alone.
    struct stat again {};
    if (lstat(socket_path.c_str(), &again) == 0 &&
        (again.st_ino != existing.st_ino || again.st_dev != existing.st_dev)) {
      return absl::FailedPreconditionError(absl::StrCat(
          socket_path, " changed while it was inspected; refusing to remove "
                       "it"));
    }
    if (unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
      const int err = errno;
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot remove stale socket ", socket_path, ": ", ErrnoText(err)));
    }
    removed_stale = true;
  } else if (errno != ENOENT) {
    const int err = errno;
    return absl::FailedPreconditionError(
        absl::StrCat("cannot stat ", socket_path, ": ", ErrnoText(err)));
  }
  return std::unique_ptr<SocketGuard>(
      new SocketGuard(socket_path, *std::move(lock), removed_stale));
}

SocketGuard::SocketGuard(std::string socket_path,
                         std::unique_ptr<LockFile> lock,
                         bool removed_stale_socket)
    : socket_path_(std::move(socket_path)),
      lock_(std::move(lock)),
      removed_stale_socket_(removed_stale_socket) {}

SocketGuard::~SocketGuard() {
  // The socket first, then (in lock_'s destructor) the lock file and the lock.
  unlink(socket_path_.c_str());
}

absl::Status SocketGuard::SetSocketMode(mode_t mode) const {
  if (chmod(socket_path_.c_str(), mode) != 0) {
    const int err = errno;
    return absl::InternalError(
        absl::StrCat("chmod ", socket_path_, ": ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

}  // namespace hicache
