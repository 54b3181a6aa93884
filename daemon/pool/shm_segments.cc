#include "daemon/pool/shm_segments.h"

#include <dirent.h>
#include <errno.h>
#include <sys/mman.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace hicache {

std::vector<std::string> ListShmSegments(absl::string_view prefix) {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");  // Where glibc's shm_open keeps names.
  if (dir == nullptr) return out;
  while (const struct dirent* entry = readdir(dir)) {
    std::string name = absl::StrCat("/", entry->d_name);
    if (absl::StartsWith(name, prefix)) out.push_back(std::move(name));
  }
  closedir(dir);
  return out;
}

absl::Status RemoveShmSegments(absl::string_view prefix) {
  for (const std::string& name : ListShmSegments(prefix)) {
    if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
      return absl::ErrnoToStatus(errno, absl::StrCat("shm_unlink ", name));
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache
