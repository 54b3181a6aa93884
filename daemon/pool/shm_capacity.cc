#include "daemon/pool/shm_capacity.h"

#include <errno.h>
#include <sys/statvfs.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hicache {
namespace {

std::string Gib(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
}

}  // namespace

absl::StatusOr<uint64_t> ShmFreeBytes(const std::string& dir) {
  struct statvfs fs;
  if (statvfs(dir.c_str(), &fs) != 0) {
    const int err = errno;
    return absl::FailedPreconditionError(
        absl::StrCat("statvfs ", dir, ": ", std::strerror(err)));
  }
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

absl::Status CheckShmCapacity(uint64_t bytes, const std::string& dir) {
  absl::StatusOr<uint64_t> free_bytes = ShmFreeBytes(dir);
  if (!free_bytes.ok()) return free_bytes.status();
  if (bytes <= *free_bytes) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the shared-memory pools need ", bytes, " bytes (", Gib(bytes), ") but ",
      dir, " has ", *free_bytes, " bytes (", Gib(*free_bytes),
      ") free; enlarge it (e.g. mount -o remount,size=... ", dir,
      ", or --shm-size for a container) or use fewer or smaller pools"));
}

}  // namespace hicache
