#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/backend/cuda/cuda_runtime.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/pool/shm_pool.h"

namespace hicache {

// Pools of the CUDA backend, created through a cuda::CudaRuntime (real or
// simulated; this code includes no CUDA header).
//
//  * Device pool (L1): one DeviceMalloc per served rank on that rank's
//    device, zeroed, exported as a CUDA IPC memory handle
//    (PoolExport::Kind::kCudaIpc). We chose plain cudaMalloc over the VMM API
//    (cuMemCreate / cuMemMap): an allocation from cudaMalloc is exported with
//    one 64-byte cudaIpcMemHandle_t that a worker opens with
//    cudaIpcOpenMemHandle, the simplest path for workers and one the
//    simulation reproduces; VMM would need POSIX file descriptors passed over
//    the unix socket. host_data() is nullptr (not host-mapped), backend_data()
//    the device pointer.
//  * Host pool (L2): a ShmPool "<prefix>-host-r<rank>" (shared memory, so a
//    restarted daemon or a worker can map it by name), page-locked for the
//    device with HostRegister when pinning is on. host_data() and
//    backend_data() are both the mapping (unified addressing). pinned() is
//    true when registered (or mlocked); pin_time() is how long registration
//    (plus the mlock, if asked for) took.
//
// Thread-safe (immutable after construction; the runtime is thread-safe).
// `runtime` must outlive the backend and every pool it made.
class CudaPoolBackend final : public PoolBackend {
 public:
  // `device_of_rank[r]` is the CUDA device ordinal of rank r (ranks beyond
  // the vector have no device: INVALID_ARGUMENT at pool creation).
  // `shm_prefix` names the host segments ("/hicache-<instance>").
  CudaPoolBackend(cuda::CudaRuntime* runtime, std::vector<int> device_of_rank,
                  std::string shm_prefix, bool pin_host_memory = true);

  // Errors name the rank, device, size and the failing call; nothing is left
  // allocated on error.
  absl::StatusOr<std::unique_ptr<KvPool>> CreateDevicePool(
      Rank rank, uint64_t size_bytes) override;
  absl::StatusOr<std::unique_ptr<KvPool>> CreateHostPool(
      Rank rank, uint64_t size_bytes, bool lock_memory) override;
  // A pinned host pool over OpenPersistentHostSegment (hot restart).
  absl::StatusOr<std::unique_ptr<KvPool>> CreatePersistentHostPool(
      Rank rank, uint64_t size_bytes, bool lock_memory, uint64_t fingerprint,
      bool* attached) override;

  // The device of `rank`, or INVALID_ARGUMENT when it has none.
  absl::StatusOr<int> DeviceOf(Rank rank) const;
  const std::vector<int>& device_of_rank() const { return device_of_rank_; }

 private:
  // Pins `shm` (when pin_host_memory) and wraps it as the rank's host pool.
  absl::StatusOr<std::unique_ptr<KvPool>> PinHostPool(
      const std::string& what, std::unique_ptr<ShmPool> shm);

  cuda::CudaRuntime* const runtime_;
  const std::vector<int> device_of_rank_;
  const std::string shm_prefix_;
  const bool pin_host_memory_;
};

}  // namespace hicache
