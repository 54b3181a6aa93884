#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/lock_file.h"

namespace hicache {

// The shared-memory namespace of one daemon instance.
//
// Every pool segment of instance <id> is named "/hicache-<id>-<kind>-r<rank>"
// (kind "device" or "host"; see ShmPoolBackend), so the names stay the same
// across restarts. While the daemon runs it holds an flock on
// "/dev/shm/hicache-<id>.lock" (see LockFile). Holding that lock proves that
// no live process owns the instance's segments, so Acquire() removes every
// segment left by a dead owner (a SIGKILLed daemon) before the new pools are
// created: reclaim is unlink for now; a later hot restart may reattach
// instead.
//
// Only regular files owned by this daemon's euid whose name is exactly
// "hicache-<id>-<lowercase letters>-r<digits>" are removed. Any other id
// (including one that starts with <id>) parses differently, so an instance
// never touches another instance's segments. Anything else that matches is
// left alone and listed in Reclaimed::skipped.
class ShmInstance {
 public:
  // Where POSIX shared-memory names live on Linux (glibc's shm_open).
  static constexpr char kShmDir[] = "/dev/shm";

  struct Reclaimed {
    int64_t segments = 0;
    uint64_t bytes = 0;            // Their sizes (st_size).
    uint64_t resident_bytes = 0;   // Memory they held (st_blocks * 512).
    std::vector<std::string> skipped;  // "name: reason", left in place.
  };

  // Takes the instance lock and reclaims the instance's stale segments.
  // INVALID_ARGUMENT for an id that IsValidInstanceId() rejects;
  // FAILED_PRECONDITION when a live process holds the instance (the message
  // names its pid) or the lock file is refused (see LockFile).
  static absl::StatusOr<std::unique_ptr<ShmInstance>> Acquire(
      const std::string& id);

  // Releases the lock and removes the lock file. The pools must be gone by
  // then (they unlink their segments when destroyed).
  ~ShmInstance() = default;
  ShmInstance(const ShmInstance&) = delete;
  ShmInstance& operator=(const ShmInstance&) = delete;

  const std::string& id() const { return id_; }
  // The ShmPoolBackend prefix: "/hicache-<id>".
  std::string prefix() const { return "/hicache-" + id_; }
  const std::string& lock_path() const { return lock_->path(); }
  const Reclaimed& reclaimed() const { return reclaimed_; }

  // Whether `file_name` (an entry of kShmDir, without '/') is a segment name
  // of instance `id`.
  static bool IsSegmentOf(const std::string& id, const std::string& file_name);

 private:
  ShmInstance(std::string id, std::unique_ptr<LockFile> lock,
              Reclaimed reclaimed);

  const std::string id_;
  const std::unique_ptr<LockFile> lock_;
  const Reclaimed reclaimed_;
};

}  // namespace hicache
