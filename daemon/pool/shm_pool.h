#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <sys/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/pool/kv_pool.h"

namespace hicache {

// Mode of every shared-memory segment the daemon exports: read-write for
// the daemon's user and group, nothing for others (docs/security.md).
inline constexpr mode_t kShmPoolMode = 0660;

// Gives the open segment `fd` (named `name`, for messages) the daemon's
// effective group and mode exactly kShmPoolMode, whatever the umask or the
// group of /dev/shm. The caller must own the segment.
absl::Status ShareSegmentWithGroup(int fd, absl::string_view name);

// A KV pool in a named POSIX shared-memory segment (shm_open + mmap), mode
// 0660 (kShmPoolMode), owned by the daemon's user and its effective group.
// Processes of that user or in that group (the `hicache` group of
// deploy/) map it by name (PoolExport); others cannot open it. The
// destructor unmaps and unlinks the segment.
class ShmPool final : public KvPool {
 public:
  // `name` must start with '/' and contain no other '/', at most 200 bytes.
  // An existing segment of that name is an error (ALREADY_EXISTS): names
  // carry the daemon's instance id (see ShmInstance, which reclaims a dead
  // owner's segments before pools are created) or a pid, so a collision
  // means a foreign one.
  static absl::StatusOr<std::unique_ptr<ShmPool>> Create(
      const std::string& name, uint64_t size_bytes, bool lock_memory);

  ~ShmPool() override;
  ShmPool(const ShmPool&) = delete;
  ShmPool& operator=(const ShmPool&) = delete;

  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return size_bytes_; }
  void* host_data() const override { return data_; }
  void* backend_data() const override { return data_; }
  PoolExport Export() const override;
  bool locked() const { return locked_; }
  bool pinned() const override { return locked_; }
  absl::Duration pin_time() const override { return pin_time_; }

 private:
  ShmPool(std::string name, uint64_t size_bytes, void* data, bool locked,
          absl::Duration pin_time);

  const std::string name_;
  const uint64_t size_bytes_;
  void* const data_;
  const bool locked_;
  const absl::Duration pin_time_;
};

// The CPU backend: every pool is a ShmPool named
// "<prefix>-<kind>-r<rank>", kind "device" or "host". A daemon's prefix is
// ShmInstance::prefix(), "/hicache-<instance>".
class ShmPoolBackend final : public PoolBackend {
 public:
  // Default prefix: "/hicache-<pid>" (never an instance prefix: instance ids
  // start with a letter).
  explicit ShmPoolBackend(std::string prefix = "");

  absl::StatusOr<std::unique_ptr<KvPool>> CreateDevicePool(
      Rank rank, uint64_t size_bytes) override;
  absl::StatusOr<std::unique_ptr<KvPool>> CreateHostPool(
      Rank rank, uint64_t size_bytes, bool lock_memory) override;

 private:
  std::string prefix_;
};

}  // namespace hicache
