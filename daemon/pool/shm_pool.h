#pragma once

#include <atomic>
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
// destructor unmaps and unlinks the segment, unless Keep() was called.
//
// Persistent host segments (hot restart; mechanism only, the daemon's policy
// decides when to use it):
//  * PersistentHostName() names a host segment after its geometry:
//    "<prefix>-host-r<rank>-g<16 hex digits of KvGeometry::HostFingerprint>".
//    Create() makes one; a restart with another geometry computes another
//    name, so it can never attach a segment whose bytes mean something else.
//  * Attach() maps an existing segment of exactly that name and size,
//    keeping its bytes, after the same trust checks as ShmInstance's reclaim
//    and more (see Attach).
//  * Keep() makes the destructor leave the segment (and its bytes) in place
//    for the next daemon; without it the segment is unlinked as usual. A
//    SIGKILLed daemon runs no destructor, so its segments stay regardless.
// Note: ShmInstance::Acquire reclaims only names "<prefix>-<kind>-r<rank>";
// it neither attaches nor removes the geometry-tagged names, so whoever
// creates them must also remove the ones it does not attach.
class ShmPool final : public KvPool {
 public:
  // `name` must start with '/' and contain no other '/', at most 200 bytes.
  // An existing segment of that name is an error (ALREADY_EXISTS): names
  // carry the daemon's instance id (see ShmInstance, which reclaims a dead
  // owner's segments before pools are created) or a pid, so a collision
  // means a foreign one.
  static absl::StatusOr<std::unique_ptr<ShmPool>> Create(
      const std::string& name, uint64_t size_bytes, bool lock_memory);

  // Maps the existing segment `name` (same name rules as Create), keeping its
  // bytes; the pool then behaves like a created one (unlinked on destruction
  // unless Keep()). Refused, leaving the segment untouched:
  //  * NOT_FOUND: no such segment.
  //  * FAILED_PRECONDITION: a symbolic link or anything but a regular file; a
  //    segment owned by another uid, or of another group than the daemon's
  //    effective group, or whose mode is not exactly kShmPoolMode (someone
  //    else may have written it); a size other than `size_bytes` (another
  //    geometry or budget).
  //  * PERMISSION_DENIED: the segment cannot be opened read-write.
  //  * RESOURCE_EXHAUSTED: mmap or (with lock_memory) mlock failed.
  // Call it while holding the instance (ShmInstance::Acquire), so that no
  // live daemon writes the segment meanwhile; the bytes are whatever the
  // previous owner left, possibly torn by its crash: verify them (see
  // page_checksum.h) before serving any.
  static absl::StatusOr<std::unique_ptr<ShmPool>> Attach(
      const std::string& name, uint64_t size_bytes, bool lock_memory);

  // "<prefix>-<kind>-r<rank>-g<fingerprint as 16 lowercase hex digits>";
  // kind is "host" (a host pool) or "keys" (its page keys, PageKeyStore).
  static std::string PersistentName(absl::string_view prefix,
                                    absl::string_view kind, Rank rank,
                                    uint64_t fingerprint);
  // PersistentName(prefix, "host", rank, fingerprint).
  static std::string PersistentHostName(absl::string_view prefix, Rank rank,
                                        uint64_t fingerprint);

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
  // Whether the pool was attached (Attach) rather than created.
  bool attached() const { return attached_; }

  // The destructor will unmap but not unlink the segment. Thread-safe;
  // irreversible.
  void Keep() { keep_.store(true, std::memory_order_relaxed); }
  bool kept() const { return keep_.load(std::memory_order_relaxed); }

 private:
  ShmPool(std::string name, uint64_t size_bytes, void* data, bool locked,
          absl::Duration pin_time, bool attached);
  // Maps the open segment `fd` of `size_bytes` (closing fd) and locks it if
  // asked. On failure a created segment is unlinked, an attached one left.
  static absl::StatusOr<std::unique_ptr<ShmPool>> Map(
      int fd, const std::string& name, uint64_t size_bytes, bool lock_memory,
      bool attached);

  const std::string name_;
  const uint64_t size_bytes_;
  void* const data_;
  const bool locked_;
  const absl::Duration pin_time_;
  const bool attached_;
  std::atomic<bool> keep_{false};
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
  // OpenPersistentHostSegment (persistent_host_segment.h).
  absl::StatusOr<std::unique_ptr<KvPool>> CreatePersistentHostPool(
      Rank rank, uint64_t size_bytes, bool lock_memory, uint64_t fingerprint,
      bool* attached) override;

 private:
  std::string prefix_;
};

}  // namespace hicache
