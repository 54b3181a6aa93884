#include "daemon/pool/shm_instance.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "daemon/core/daemon_config.h"

namespace hicache {
namespace {

// "<lowercase letters>-r<digits>", e.g. "device-r0".
bool IsKindAndRank(absl::string_view rest) {
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == absl::string_view::npos) return false;
  for (char c : rest.substr(0, dash)) {
    if (!absl::ascii_islower(static_cast<unsigned char>(c))) return false;
  }
  absl::string_view rank = rest.substr(dash + 1);
  if (!absl::ConsumePrefix(&rank, "r") || rank.empty()) return false;
  for (char c : rank) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Removes the segments of `id` left in kShmDir.
absl::StatusOr<ShmInstance::Reclaimed> ReclaimSegments(const std::string& id) {
  ShmInstance::Reclaimed reclaimed;
  const int dir_fd = open(ShmInstance::kShmDir,
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir_fd < 0) {
    const int err = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open ", ShmInstance::kShmDir, ": ", std::strerror(err)));
  }
  DIR* dir = fdopendir(dir_fd);
  if (dir == nullptr) {
    const int err = errno;
    close(dir_fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot list ", ShmInstance::kShmDir, ": ", std::strerror(err)));
  }
  // Collect first: unlinking while reading a directory may skip entries.
  std::vector<std::string> names;
  while (const dirent* entry = readdir(dir)) {
    if (ShmInstance::IsSegmentOf(id, entry->d_name)) {
      names.emplace_back(entry->d_name);
    }
  }
  for (const std::string& name : names) {
    struct stat st {};
    if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      const int err = errno;
      if (err != ENOENT) {
        reclaimed.skipped.push_back(
            absl::StrCat(name, ": stat: ", std::strerror(err)));
      }
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      reclaimed.skipped.push_back(
          absl::StrCat(name, ": not a regular file"));
      continue;
    }
    if (st.st_uid != geteuid()) {
      reclaimed.skipped.push_back(absl::StrCat(
          name, ": owned by uid ", st.st_uid, ", not ", geteuid()));
      continue;
    }
    // unlinkat in the shared-memory directory is what shm_unlink does.
    if (unlinkat(dir_fd, name.c_str(), 0) != 0) {
      const int err = errno;
      if (err != ENOENT) {
        reclaimed.skipped.push_back(
            absl::StrCat(name, ": unlink: ", std::strerror(err)));
      }
      continue;
    }
    ++reclaimed.segments;
    reclaimed.bytes += static_cast<uint64_t>(st.st_size);
    reclaimed.resident_bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  closedir(dir);  // Closes dir_fd too.
  return reclaimed;
}

}  // namespace

bool ShmInstance::IsSegmentOf(const std::string& id,
                              const std::string& file_name) {
  absl::string_view rest = file_name;
  return absl::ConsumePrefix(&rest, "hicache-") &&
         absl::ConsumePrefix(&rest, id) && absl::ConsumePrefix(&rest, "-") &&
         IsKindAndRank(rest);
}

absl::StatusOr<std::unique_ptr<ShmInstance>> ShmInstance::Acquire(
    const std::string& id) {
  if (!IsValidInstanceId(id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory instance id '", id, "' must be 1 to ",
        kMaxInstanceIdLength,
        " characters of [A-Za-z0-9_-] starting with a letter"));
  }
  std::string holder;
  absl::StatusOr<std::unique_ptr<LockFile>> lock = LockFile::Acquire(
      absl::StrCat(kShmDir, "/hicache-", id, ".lock"), &holder);
  if (!lock.ok()) {
    if (!holder.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shared-memory instance '", id, "' is in use by another process (pid ",
          holder, "); give each daemon its own --instance"));
    }
    return lock.status();
  }
  // We hold the lock: every segment of `id` still present is a dead owner's.
  absl::StatusOr<Reclaimed> reclaimed = ReclaimSegments(id);
  if (!reclaimed.ok()) return reclaimed.status();
  return std::unique_ptr<ShmInstance>(
      new ShmInstance(id, *std::move(lock), *std::move(reclaimed)));
}

ShmInstance::ShmInstance(std::string id, std::unique_ptr<LockFile> lock,
                         Reclaimed reclaimed)
    : id_(std::move(id)),
      lock_(std::move(lock)),
      reclaimed_(std::move(reclaimed)) {}

}  // namespace hicache
