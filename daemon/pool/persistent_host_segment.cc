#include "daemon/pool/persistent_host_segment.h"

#include <dirent.h>
#include <sys/mman.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace hicache {
namespace {

// Tagged host segments of `prefix` and `rank` other than `keep`, by their
// shm names ("/..."). An unreadable /dev/shm lists nothing.
std::vector<std::string> OtherFingerprints(absl::string_view prefix,
                                           Rank rank,
                                           const std::string& keep) {
  std::vector<std::string> out;
  // "<prefix>-host-r<rank>-g" without the leading '/'.
  const std::string stem =
      absl::StrCat(prefix.substr(1), "-host-r", rank, "-g");
  DIR* dir = opendir("/dev/shm");  // Where glibc's shm_open keeps names.
  if (dir == nullptr) return out;
  while (const struct dirent* entry = readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (!absl::StartsWith(name, stem) || name.size() != stem.size() + 16) {
      continue;
    }
    const std::string shm_name = absl::StrCat("/", name);
    if (shm_name != keep) out.push_back(shm_name);
  }
  closedir(dir);
  return out;
}

}  // namespace

absl::StatusOr<PersistentHostSegment> OpenPersistentHostSegment(
    absl::string_view prefix, Rank rank, uint64_t size_bytes, bool lock_memory,
    uint64_t fingerprint) {
  PersistentHostSegment out;
  const std::string name =
      ShmPool::PersistentHostName(prefix, rank, fingerprint);
  for (const std::string& other : OtherFingerprints(prefix, rank, name)) {
    if (shm_unlink(other.c_str()) == 0) out.removed.push_back(other);
  }
  absl::StatusOr<std::unique_ptr<ShmPool>> pool =
      ShmPool::Attach(name, size_bytes, lock_memory);
  if (pool.ok()) {
    out.attached = true;
  } else if (absl::IsNotFound(pool.status())) {
    pool = ShmPool::Create(name, size_bytes, lock_memory);
  }
  if (!pool.ok()) return pool.status();
  (*pool)->Keep();
  out.pool = *std::move(pool);
  return out;
}

absl::StatusOr<std::unique_ptr<KvPool>> ShmPoolBackend::CreatePersistentHostPool(
    Rank rank, uint64_t size_bytes, bool lock_memory, uint64_t fingerprint,
    bool* attached) {
  absl::StatusOr<PersistentHostSegment> segment = OpenPersistentHostSegment(
      prefix_, rank, size_bytes, lock_memory, fingerprint);
  if (!segment.ok()) return segment.status();
  *attached = segment->attached;
  return std::unique_ptr<KvPool>(std::move(segment->pool));
}

}  // namespace hicache
