#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/backend/backend.h"
#include "daemon/backend/cuda/cuda_pool_backend.h"
#include "daemon/backend/cuda/cuda_runtime.h"

namespace hicache {

struct CudaBackendOptions {
  // CUDA device ordinal of each rank, indexed by rank; -1 for a rank this
  // daemon does not serve. Empty: rank r on device r for every visible
  // device.
  std::vector<int> device_of_rank;
  // Names the host pools' segments ("<prefix>-host-r<rank>"); empty:
  // "/hicache-<pid>".
  std::string shm_prefix;
  // Page-lock host pools with HostRegister (needed for the copy kernel to
  // reach them; off only for experiments).
  bool pin_host_memory = true;
  // BatchedPageCopy::max_blocks of every copy (0: the kernel's default).
  int32_t max_blocks_per_copy = 0;
  // Interprocess events per rank stamping loads (CudaTransferEngineOptions).
  int fence_ring_size = 64;
  // Where CheckCapacity looks for the host pools' shared memory.
  std::string shm_dir = "/dev/shm";
};

// The CUDA backend: device pools in GPU memory exported by IPC handle, host
// pools in pinned shared memory, copies by CudaTransferEngine, all through a
// cuda::CudaRuntime (RealCudaRuntime on a GPU, SimCudaRuntime in tests and
// CI). Thread-safe; outlives every pool and transfer engine it made.
class CudaBackend final : public Backend {
 public:
  // FAILED_PRECONDITION when the runtime sees no device ("no CUDA device is
  // visible: ...") or a rank is mapped to a device ordinal it does not have;
  // INVALID_ARGUMENT for a null runtime; the runtime's error when it cannot
  // count devices.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      std::shared_ptr<cuda::CudaRuntime> runtime, CudaBackendOptions options);

  // "cuda", or "cuda (simulated)" on the simulation.
  std::string name() const override;
  // Copies wait on worker fences; loads report IPC events.
  bool has_events() const override { return true; }
  PoolBackend& pools() override { return pools_; }
  // Per device: the device pools of its ranks against the device's free
  // memory; all host pools against the free space of shm_dir.
  absl::Status CheckCapacity(const RankPools::Sizes& sizes) override;
  // A CudaTransferEngine; if some stream cannot be set up, the error is
  // logged and that rank's steps fail (see
  // CudaTransferEngine::setup_status()).
  std::unique_ptr<TransferEngine> CreateTransferEngine(
      const RankPools* pools, TransferListener* listener) override;

  cuda::CudaRuntime& runtime() const { return *runtime_; }
  const CudaBackendOptions& options() const { return options_; }

 private:
  CudaBackend(std::shared_ptr<cuda::CudaRuntime> runtime,
              CudaBackendOptions options);

  const std::shared_ptr<cuda::CudaRuntime> runtime_;
  const CudaBackendOptions options_;
  CudaPoolBackend pools_;
};

}  // namespace hicache
