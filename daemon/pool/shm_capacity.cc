#include "daemon/pool/shm_capacity.h"

#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hicache {
namespace {

std::string Gib(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
}

// Whether `file` (a name in the shm directory) is one of the pool segments
// of `stem` (the shm prefix without its '/'): "<stem>-<kind>-r<digit>...".
bool IsInstanceSegment(absl::string_view file, absl::string_view stem) {
  if (!absl::ConsumePrefix(&file, stem) || !absl::ConsumePrefix(&file, "-")) {
    return false;
  }
  for (absl::string_view kind : {"device-r", "host-r", "keys-r"}) {
    absl::string_view rest = file;
    if (absl::ConsumePrefix(&rest, kind) && !rest.empty() &&
        rest[0] >= '0' && rest[0] <= '9') {
      return true;
    }
  }
  return false;
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

uint64_t InstanceShmBytes(const std::string& dir,
                          absl::string_view shm_prefix) {
  absl::string_view stem = shm_prefix;
  absl::ConsumePrefix(&stem, "/");
  if (stem.empty()) return 0;
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return 0;
  uint64_t bytes = 0;
  while (const struct dirent* entry = readdir(listing)) {
    if (!IsInstanceSegment(entry->d_name, stem)) continue;
    struct stat st;
    if (fstatat(dirfd(listing), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) ==
            0 &&
        S_ISREG(st.st_mode)) {
      bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  closedir(listing);
  return bytes;
}

absl::Status ShmCapacityVerdict(uint64_t need, uint64_t free_bytes,
                                uint64_t reusable_bytes,
                                const std::string& dir) {
  if (need <= free_bytes + reusable_bytes) return absl::OkStatus();
  const std::string reusable =
      reusable_bytes == 0
          ? std::string()
          : absl::StrCat(" (plus ", reusable_bytes, " bytes, ",
                         Gib(reusable_bytes),
                         ", that this instance's old segments hold)");
  return absl::FailedPreconditionError(absl::StrCat(
      "the shared-memory pools need ", need, " bytes (", Gib(need), ") but ",
      dir, " has ", free_bytes, " bytes (", Gib(free_bytes), ") free",
      reusable, "; enlarge it (e.g. mount -o remount,size=... ", dir,
      ", or --shm-size for a container) or use fewer or smaller pools"));
}

absl::Status CheckShmCapacity(uint64_t bytes, const std::string& dir,
                              absl::string_view shm_prefix) {
  absl::StatusOr<uint64_t> free_bytes = ShmFreeBytes(dir);
  if (!free_bytes.ok()) return free_bytes.status();
  return ShmCapacityVerdict(bytes, *free_bytes,
                            InstanceShmBytes(dir, shm_prefix), dir);
}

}  // namespace hicache
