#include "daemon/core/lock_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace hicache {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// Reads the pid recorded in the lock file, or "unknown".
std::string ReadHolderPid(int fd) {
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

absl::Status SymlinkRefused(const std::string& path) {
  return absl::FailedPreconditionError(
      absl::StrCat("lock file ", path,
                   " is a symbolic link; refusing to follow it (remove it if "
                   "you put it there)"));
}

// OK when `st` describes a file this process may use as its lock file.
absl::Status CheckLockFile(const std::string& path, const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return SymlinkRefused(path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lock file ", path, " exists and is not a regular file; refusing it"));
  }
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lock file ", path, " is owned by uid ", st.st_uid,
        ", not by this daemon's uid ", geteuid(), "; refusing it"));
  }
  if (st.st_nlink != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("lock file ", path, " has ", st.st_nlink,
                     " links (a hard link to another file?); refusing it"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LockFile>> LockFile::Acquire(
    const std::string& path, std::string* holder) {
  if (holder != nullptr) holder->clear();
  // A previous holder may unlink the file between our open and our flock;
  // then we locked an orphan inode and try again on the new file.
  for (int attempt = 0; attempt < 8; ++attempt) {
    // Refuse what is visibly wrong before opening it (a device or FIFO is
    // never opened); the checks on the opened file below are what count.
    struct stat named {};
    if (lstat(path.c_str(), &named) == 0) {
      if (absl::Status ok = CheckLockFile(path, named); !ok.ok()) return ok;
    }
    const int fd = open(
        path.c_str(),
        O_RDWR | O_CREAT | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC,
        0600);
    if (fd < 0) {
      const int err = errno;
      if (err == ELOOP) return SymlinkRefused(path);
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot open lock file ", path, ": ", ErrnoText(err)));
    }
    struct stat opened {};
    if (fstat(fd, &opened) != 0) {
      const int err = errno;
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot stat lock file ", path, ": ", ErrnoText(err)));
    }
    if (absl::Status ok = CheckLockFile(path, opened); !ok.ok()) {
      close(fd);
      return ok;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string pid = ReadHolderPid(fd);
      close(fd);
      if (err == EWOULDBLOCK) {
        if (holder != nullptr) *holder = pid;
        return absl::FailedPreconditionError(
            absl::StrCat(path, " is locked by pid ", pid));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("cannot lock ", path, ": ", ErrnoText(err)));
    }
    // lstat, not stat: the name must still be this very file, not a link to
    // it.
    struct stat now {};
    if (lstat(path.c_str(), &now) == 0 && opened.st_ino == now.st_ino &&
        opened.st_dev == now.st_dev) {
      const std::string pid = absl::StrCat(getpid(), "\n");
      if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) !=
                                       static_cast<ssize_t>(pid.size())) {
        const int err = errno;
        close(fd);
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot write lock file ", path, ": ", ErrnoText(err)));
      }
      return std::unique_ptr<LockFile>(new LockFile(path, fd));
    }
    close(fd);  // The previous holder removed the file after we opened it.
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "lock file ", path,
      " keeps changing; is another process starting and stopping on it?"));
}

LockFile::LockFile(std::string path, int fd)
    : path_(std::move(path)), fd_(fd) {}

LockFile::~LockFile() {
  // Unlink before unlocking: a process that opened the old file re-checks
  // the inode after locking and retries on a new one. Only our own file is
  // removed, never one that replaced it under the same name.
  struct stat mine {};
  struct stat named {};
  if (fstat(fd_, &mine) == 0 && lstat(path_.c_str(), &named) == 0 &&
      mine.st_ino == named.st_ino && mine.st_dev == named.st_dev) {
    unlink(path_.c_str());
  }
  close(fd_);
}

}  // namespace hicache
