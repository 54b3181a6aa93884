#include "daemon/main/backend_factory.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/backend/cpu/cpu_backend.h"
#include "daemon/backend/cuda/cuda_backend.h"
#include "daemon/backend/cuda/real_cuda_runtime.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"

namespace hicache {
namespace {

std::shared_ptr<cuda::CudaRuntime> MakeRuntime(const DaemonConfig& config) {
  if (config.cuda_runtime == "simulated") {
    // As many simulated devices as the mapping needs.
    int devices = static_cast<int>(config.EffectiveRanks().size());
    for (int32_t gpu : config.gpus) devices = std::max(devices, gpu + 1);
    return std::make_shared<cuda::SimCudaRuntime>(
        cuda::SimOptions{.devices = std::max(devices, 1)});
  }
  return std::make_shared<cuda::RealCudaRuntime>();
}

// Device of every rank (indexed by rank, -1 for unserved ones).
std::vector<int> DeviceOfRank(const DaemonConfig& config) {
  std::vector<int> device(config.cp_size, -1);
  const std::vector<uint32_t> ranks = config.EffectiveRanks();
  for (size_t i = 0; i < ranks.size(); ++i) {
    device[ranks[i]] =
        config.gpus.empty() ? static_cast<int>(ranks[i]) : config.gpus[i];
  }
  return device;
}

}  // namespace

absl::Status CheckBackendAvailable(const DaemonConfig& config) {
  if (config.backend != BackendKind::kCuda ||
      config.cuda_runtime == "simulated") {
    return absl::OkStatus();
  }
  cuda::RealCudaRuntime runtime;
  absl::StatusOr<int> devices = runtime.DeviceCount();
  if (!devices.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend=cuda cannot run: ", devices.status().message(),
        "; use --backend=cpu"));
  }
  if (*devices == 0) {
    return absl::FailedPreconditionError(
        "--backend=cuda cannot run: no CUDA device is visible (no GPU, no "
        "driver, or CUDA_VISIBLE_DEVICES hides them); use --backend=cpu");
  }
  const std::vector<int> device_of_rank = DeviceOfRank(config);
  for (size_t rank = 0; rank < device_of_rank.size(); ++rank) {
    if (device_of_rank[rank] >= *devices) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " is mapped to GPU ", device_of_rank[rank], " but ",
          *devices, " GPU(s) are visible; set --gpus"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(
    const DaemonConfig& config, const std::string& shm_prefix) {
  if (config.backend == BackendKind::kCpu) {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(
        CpuBackend::Options{.shm_prefix = shm_prefix,
                            .transfer_workers = config.transfer_workers}));
  }
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend = CudaBackend::Create(
      MakeRuntime(config),
      CudaBackendOptions{.device_of_rank = DeviceOfRank(config),
                         .shm_prefix = shm_prefix,
                         .pin_host_memory = config.pin_host_memory,
                         .max_blocks_per_copy = config.copy_max_blocks});
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<Backend>(*std::move(backend));
}

}  // namespace hicache
