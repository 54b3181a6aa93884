#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hicache {

// Bytes a new shared-memory segment can still take: the free space of the
// filesystem behind /dev/shm (tmpfs), as statvfs reports it to this user.
absl::StatusOr<uint64_t> ShmFreeBytes(const std::string& dir = "/dev/shm");

// Bytes (allocated blocks, not apparent sizes: the segments are sparse until
// touched) that the pool segments of the instance with shm prefix
// `shm_prefix` ("/hicache-<instance>") hold in `dir`: its
// "<prefix>-device-r*", "-host-r*" and "-keys-r*" files, and not those of
// an instance whose name merely starts the same ("/hicache-a" is not
// "/hicache-a-b"). A starting daemon reattaches (a hot restart's host tier)
// or removes (a dead owner's, another geometry's) every one of them before
// it creates its pools, so their space is its to reuse. 0 for an empty
// prefix or an unreadable dir.
uint64_t InstanceShmBytes(const std::string& dir, absl::string_view shm_prefix);

// OK if `need` bytes of pools fit in `free_bytes` plus `reusable_bytes` (the
// instance's own segments, InstanceShmBytes); otherwise FAILED_PRECONDITION
// naming the need, the space and the fix (a larger `dir`, fewer or smaller
// pools).
absl::Status ShmCapacityVerdict(uint64_t need, uint64_t free_bytes,
                                uint64_t reusable_bytes,
                                const std::string& dir);

// ShmCapacityVerdict(bytes, ShmFreeBytes(dir), InstanceShmBytes(dir,
// shm_prefix), dir). Segments are sparse until touched, so a pool that does
// not fit would fault (SIGBUS) at first use, not at creation: this is the
// only place the mistake can be caught. Counting the instance's own segments
// as reusable is what lets a hot restart start on a /dev/shm sized for one
// host tier, which the kept tier itself fills.
absl::Status CheckShmCapacity(uint64_t bytes,
                              const std::string& dir = "/dev/shm",
                              absl::string_view shm_prefix = "");

}  // namespace hicache
