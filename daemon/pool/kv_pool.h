#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/layout/cp_layout.h"

namespace hicache {

// How another process maps a pool.
struct PoolExport {
  enum class Kind {
    kSharedMemory,  // POSIX shared memory: shm_open(handle), mmap(size).
    kCudaIpc,       // cudaIpcMemHandle_t bytes in `handle` (CUDA backend).
  };
  Kind kind = Kind::kSharedMemory;
  std::string handle;  // The segment name ("/hicache-...") or IPC handle bytes.
  uint64_t size_bytes = 0;
  int device = -1;         // kCudaIpc: the CUDA device ordinal.
  std::string pci_bus_id;  // kCudaIpc: the GPU's PCI bus id.
};

// One contiguous KV pool: one rank's device (L1) or host (L2) memory.
// Owns the memory; the destructor releases it and withdraws the export.
// Thread-safe: immutable after creation (the bytes themselves are not
// synchronized; the engine orders writers and readers).
class KvPool {
 public:
  virtual ~KvPool() = default;

  virtual const std::string& name() const = 0;
  virtual uint64_t size_bytes() const = 0;
  // A pointer this process can dereference, or nullptr for device memory
  // that is not host-mapped.
  virtual void* host_data() const = 0;
  // A pointer the backend's copy engine addresses (device or host).
  virtual void* backend_data() const = 0;
  virtual PoolExport Export() const = 0;
  // Whether the memory is page-locked (pinned or mlocked), and how long
  // pinning took at creation (zero when not pinned).
  virtual bool pinned() const { return false; }
  virtual absl::Duration pin_time() const { return absl::ZeroDuration(); }
};

// Creates pools. The CPU backend backs both tiers with shared memory; a CUDA
// backend implements the same interface with device and pinned host memory,
// with no change to cache code.
class PoolBackend {
 public:
  virtual ~PoolBackend() = default;

  // INVALID_ARGUMENT for size 0; RESOURCE_EXHAUSTED / INTERNAL when the
  // system refuses the memory (the message says which call failed and why).
  virtual absl::StatusOr<std::unique_ptr<KvPool>> CreateDevicePool(
      Rank rank, uint64_t size_bytes) = 0;
  // `lock_memory`: mlock the pool so it is never swapped out; failure to lock
  // fails the creation.
  virtual absl::StatusOr<std::unique_ptr<KvPool>> CreateHostPool(
      Rank rank, uint64_t size_bytes, bool lock_memory) = 0;

  // Hot restart (docs/hot-restart.md §2): a host pool whose memory outlives
  // the daemon, named after `fingerprint` (KvGeometry::HostFingerprint). It
  // attaches the previous daemon's pool of that fingerprint, keeping its
  // bytes (*attached = true), or creates one; pools of other fingerprints
  // are removed. UNIMPLEMENTED for a backend whose host memory cannot
  // persist.
  virtual absl::StatusOr<std::unique_ptr<KvPool>> CreatePersistentHostPool(
      Rank rank, uint64_t size_bytes, bool lock_memory, uint64_t fingerprint,
      bool* attached) {
    (void)rank, (void)size_bytes, (void)lock_memory, (void)fingerprint;
    *attached = false;
    return absl::UnimplementedError(
        "this backend's host pools cannot outlive the daemon");
  }
};

}  // namespace hicache
