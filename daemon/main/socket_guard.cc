#include "daemon/main/socket_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace hicache {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Reads the pid recorded in the lock file, or "unknown".
std::string ReadOwnerPid(int fd) {
  char buffer[32] = {};
  const ssize_t n = pread(fd, buffer, sizeof(buffer) - 1, 0);
  int64_t pid = 0;
  if (n > 0 &&
      absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buffer, n)),
                       &pid)) {
    return absl::StrCat(pid);
  }
  return "unknown";
}

// Opens and exclusively locks `lock_path`, retrying when the file it locked
// was unlinked by a previous owner in the meantime.
absl::StatusOr<int> LockPath(const std::string& lock_path,
                             const std::string& socket_path) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      const int err = errno;
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot open lock file ", lock_path, ": ", ErrnoText(err)));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string owner = ReadOwnerPid(fd);
      close(fd);
      if (err == EWOULDBLOCK) {
        return absl::FailedPreconditionError(
            absl::StrCat("another hicached (pid ", owner,
                         ") is already serving ", socket_path));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("cannot lock ", lock_path, ": ", ErrnoText(err)));
    }
    struct stat locked {};
    struct stat named {};
    if (fstat(fd, &locked) == 0 && stat(lock_path.c_str(), &named) == 0 &&
        locked.st_ino == named.st_ino && locked.st_dev == named.st_dev) {
      const std::string pid = absl::StrCat(getpid(), "\n");
      if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) !=
                                       static_cast<ssize_t>(pid.size())) {
        const int err = errno;
        close(fd);
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot write lock file ", lock_path, ": ", ErrnoText(err)));
      }
      return fd;
    }
    close(fd);  // The previous owner removed the file after we opened it.
  }
  return absl::FailedPreconditionError(
      absl::StrCat("lock file ", lock_path,
                   " keeps changing; is another "
                   "hicached starting and stopping on this path?"));
}

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
  absl::StatusOr<int> lock_fd = LockPath(lock_path, socket_path);
  if (!lock_fd.ok()) return lock_fd.status();

  // From here on the lock is ours; release it on every error path.
  auto fail = [&](absl::Status status) {
    unlink(lock_path.c_str());
    close(*lock_fd);
    return status;
  };
  bool removed_stale = false;
  struct stat existing {};
  if (lstat(socket_path.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      return fail(absl::FailedPreconditionError(absl::StrCat(
          socket_path, " exists and is not a socket; refusing to replace it")));
    }
    absl::StatusOr<bool> live = SomeoneListens(socket_path);
    if (!live.ok()) return fail(live.status());
    if (*live) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("a server is already listening on ", socket_path)));
    }
    if (unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
      const int err = errno;
      return fail(absl::FailedPreconditionError(absl::StrCat(
          "cannot remove stale socket ", socket_path, ": ", ErrnoText(err))));
    }
    removed_stale = true;
  } else if (errno != ENOENT) {
    const int err = errno;
    return fail(absl::FailedPreconditionError(
        absl::StrCat("cannot stat ", socket_path, ": ", ErrnoText(err))));
  }
  return std::unique_ptr<SocketGuard>(
      new SocketGuard(socket_path, lock_path, *lock_fd, removed_stale));
}

SocketGuard::SocketGuard(std::string socket_path, std::string lock_path,
                         int lock_fd, bool removed_stale_socket)
    : socket_path_(std::move(socket_path)),
      lock_path_(std::move(lock_path)),
      lock_fd_(lock_fd),
      removed_stale_socket_(removed_stale_socket) {}

SocketGuard::~SocketGuard() {
  unlink(socket_path_.c_str());
  // Unlink before unlocking: a daemon that opened the old file re-checks the
  // inode after locking and retries on the new one.
  unlink(lock_path_.c_str());
  close(lock_fd_);
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
