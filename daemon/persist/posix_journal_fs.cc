#include "daemon/persist/posix_journal_fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hicache::persist {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  const std::string message =
      absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

class PosixJournalFile : public JournalFile {
 public:
  PosixJournalFile(int fd, std::string path)
      : fd_(fd), path_(std::move(path)) {}
  ~PosixJournalFile() override { ::close(fd_); }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return Errno("write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    while (::fdatasync(fd_) != 0) {
      if (errno != EINTR) return Errno("fdatasync", path_, errno);
    }
    return absl::OkStatus();
  }

 private:
  const int fd_;
  const std::string path_;
};

}  // namespace

JournalFs* PosixJournalFs::Default() {
  static PosixJournalFs* const fs = new PosixJournalFs();
  return fs;
}

absl::StatusOr<std::unique_ptr<JournalFile>> PosixJournalFs::Create(
    const std::string& path) {
  const int fd =
      ::open(path.c_str(),
             O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Errno("create", path, errno);
  // O_CREAT keeps the mode of an existing file: make it 0600 either way.
  if (::fchmod(fd, 0600) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno("chmod", path, err);
  }
  return std::unique_ptr<JournalFile>(new PosixJournalFile(fd, path));
}

absl::Status PosixJournalFs::Rename(const std::string& from,
                                    const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    return Errno("rename to " + to + " from", from, errno);
  }
  return absl::OkStatus();
}

absl::Status PosixJournalFs::SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open directory", dir, errno);
  int rc;
  while ((rc = ::fsync(fd)) != 0 && errno == EINTR) {
  }
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Errno("fsync directory", dir, err);
  return absl::OkStatus();
}

absl::Status PosixJournalFs::Remove(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Errno("unlink", path, errno);
  }
  return absl::OkStatus();
}

}  // namespace hicache::persist
