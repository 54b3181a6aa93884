#include "daemon/pool/persistent_host_segment.h"

#include <sys/mman.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/pool/shm_segments.h"

namespace hicache {
namespace {

// Whether `name` (a /dev/shm entry) is "<stem><anything>-g<16 hex>".
bool IsTagged(absl::string_view name, absl::string_view stem) {
  if (!absl::StartsWith(name, stem) || name.size() < stem.size() + 18) {
    return false;
  }
  const absl::string_view tag = name.substr(name.size() - 18);
  if (tag.substr(0, 2) != "-g") return false;
  for (char c : tag.substr(2)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Tagged host segments whose names start with `stem` (without the leading
// '/'), other than `keep`, by their shm names ("/...").
std::vector<std::string> TaggedSegments(absl::string_view stem,
                                        const std::string& keep) {
  std::vector<std::string> out;
  for (std::string& name : ListShmSegments(absl::StrCat("/", stem))) {
    if (IsTagged(absl::string_view(name).substr(1), stem) && name != keep) {
      out.push_back(std::move(name));
    }
  }
  return out;
}

std::vector<std::string> OtherFingerprints(absl::string_view prefix,
                                           absl::string_view kind, Rank rank,
                                           const std::string& keep) {
  std::vector<std::string> out;
  const std::string middle = absl::StrCat("-", kind, "-r", rank);
  for (std::string& name :
       TaggedSegments(absl::StrCat(prefix.substr(1), middle), keep)) {
    // Exactly "<prefix>-<kind>-r<rank>-g<16 hex>": not rank 1 for rank 10.
    if (name.size() == prefix.size() + middle.size() + 18) {
      out.push_back(std::move(name));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<PersistentHostSegment> OpenPersistentSegment(
    absl::string_view prefix, absl::string_view kind, Rank rank,
    uint64_t size_bytes, bool lock_memory, uint64_t fingerprint) {
  PersistentHostSegment out;
  const std::string name =
      ShmPool::PersistentName(prefix, kind, rank, fingerprint);
  for (const std::string& other :
       OtherFingerprints(prefix, kind, rank, name)) {
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

absl::StatusOr<PersistentHostSegment> OpenPersistentHostSegment(
    absl::string_view prefix, Rank rank, uint64_t size_bytes, bool lock_memory,
    uint64_t fingerprint) {
  return OpenPersistentSegment(prefix, "host", rank, size_bytes, lock_memory,
                               fingerprint);
}

std::vector<std::string> RemovePersistentHostSegments(
    absl::string_view prefix) {
  std::vector<std::string> removed;
  for (absl::string_view kind : {"-host-r", "-keys-r"}) {
    for (const std::string& name :
         TaggedSegments(absl::StrCat(prefix.substr(1), kind), "")) {
      if (shm_unlink(name.c_str()) == 0) removed.push_back(name);
    }
  }
  return removed;
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
