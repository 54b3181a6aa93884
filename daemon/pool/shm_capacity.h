#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hicache {

// Bytes a new shared-memory segment can still take: the free space of the
// filesystem behind /dev/shm (tmpfs), as statvfs reports it to this user.
absl::StatusOr<uint64_t> ShmFreeBytes(const std::string& dir = "/dev/shm");

// OK if `bytes` of new segments fit in ShmFreeBytes(dir); otherwise
// FAILED_PRECONDITION naming the need, the free space and the fix (a larger
// /dev/shm, fewer or smaller pools). Segments are sparse until touched, so a
// pool that does not fit would fault (SIGBUS) at first use, not at creation:
// this is the only place the mistake can be caught.
absl::Status CheckShmCapacity(uint64_t bytes,
                              const std::string& dir = "/dev/shm");

}  // namespace hicache
