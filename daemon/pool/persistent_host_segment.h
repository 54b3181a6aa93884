#pragma once

// The segments of one rank that outlive the daemon (hot restart,
// docs/hot-restart.md §2): "<prefix>-<kind>-r<rank>-g<fingerprint>", where
// the fingerprint (KvGeometry::HostFingerprint) covers everything that gives
// the bytes their meaning. Kinds: "host" (the host KV pool) and "keys" (the
// token ids of its pages, PageKeyStore).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/shm_pool.h"

namespace hicache {

struct PersistentHostSegment {
  std::unique_ptr<ShmPool> pool;  // Keep()-marked: survives the daemon.
  bool attached = false;          // Its bytes are a previous daemon's.
  // Segments of this prefix and rank with another fingerprint, removed: a
  // geometry change makes their bytes meaningless.
  std::vector<std::string> removed;
};

// Removes this prefix's, kind's and rank's tagged segments of other
// fingerprints, then attaches the segment of `fingerprint` when one of that
// size exists (keeping its bytes) or creates it. Errors as ShmPool::Attach
// and ShmPool::Create return them (a segment Attach refuses is left alone
// and is an error: someone else's).
// Call it while holding the instance (ShmInstance::Acquire).
absl::StatusOr<PersistentHostSegment> OpenPersistentSegment(
    absl::string_view prefix, absl::string_view kind, Rank rank,
    uint64_t size_bytes, bool lock_memory, uint64_t fingerprint);

// OpenPersistentSegment of kind "host".
absl::StatusOr<PersistentHostSegment> OpenPersistentHostSegment(
    absl::string_view prefix, Rank rank, uint64_t size_bytes, bool lock_memory,
    uint64_t fingerprint);

// Removes every tagged segment of `prefix` (kinds "host" and "keys", all
// ranks, all fingerprints): a daemon started without hot restart can never
// use them, and they would hold their memory forever. Returns the names
// removed.
std::vector<std::string> RemovePersistentHostSegments(absl::string_view prefix);

}  // namespace hicache
