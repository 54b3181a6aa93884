#include "daemon/backend/cuda/cuda_backend.h"

#include <unistd.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/backend/cuda/cuda_transfer_engine.h"
#include "daemon/pool/shm_capacity.h"

namespace hicache {

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    std::shared_ptr<cuda::CudaRuntime> runtime, CudaBackendOptions options) {
  if (runtime == nullptr) {
    return absl::InvalidArgumentError("the CUDA backend needs a runtime");
  }
  absl::StatusOr<int> count = runtime->DeviceCount();
  if (!count.ok()) {
    return absl::Status(count.status().code(),
                        absl::StrCat("counting CUDA devices (", runtime->name(),
                                     " runtime): ", count.status().message()));
  }
  if (*count <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device is visible: the ", runtime->name(),
        " runtime reports 0 devices (check the NVIDIA driver, "
        "CUDA_VISIBLE_DEVICES and the container's GPU access, or run with "
        "--backend=cpu)"));
  }
  if (options.device_of_rank.empty()) {
    for (int d = 0; d < *count; ++d) options.device_of_rank.push_back(d);
  }
  for (size_t rank = 0; rank < options.device_of_rank.size(); ++rank) {
    const int device = options.device_of_rank[rank];
    if (device == -1) continue;  // Not served here.
    if (device < 0 || device >= *count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " is mapped to CUDA device ", device, " but ", *count,
          " device(s) are visible (ordinals 0..", *count - 1, ")"));
    }
  }
  if (options.shm_prefix.empty()) {
    options.shm_prefix = absl::StrCat("/hicache-", getpid());
  }
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(std::move(runtime), std::move(options)));
}

CudaBackend::CudaBackend(std::shared_ptr<cuda::CudaRuntime> runtime,
                         CudaBackendOptions options)
    : runtime_(std::move(runtime)),
      options_(std::move(options)),
      pools_(runtime_.get(), options_.device_of_rank, options_.shm_prefix,
             options_.pin_host_memory) {}

std::string CudaBackend::name() const {
  const std::string runtime = runtime_->name();
  return runtime == "cuda" ? "cuda" : absl::StrCat("cuda (", runtime, ")");
}

absl::Status CudaBackend::CheckCapacity(const RankPools::Sizes& sizes) {
  // Device bytes needed per device, and the ranks asking for them.
  std::map<int, uint64_t> need;
  std::map<int, std::vector<Rank>> ranks_of;
  for (Rank rank : sizes.ranks) {
    absl::StatusOr<int> device = pools_.DeviceOf(rank);
    if (!device.ok()) {
      return absl::FailedPreconditionError(device.status().message());
    }
    need[*device] += sizes.device_bytes_per_rank;
    ranks_of[*device].push_back(rank);
  }
  for (const auto& [device, bytes] : need) {
    absl::StatusOr<cuda::DeviceInfo> info = runtime_->GetDeviceInfo(device);
    if (!info.ok()) {
      return absl::Status(info.status().code(),
                          absl::StrCat("GetDeviceInfo of CUDA device ", device,
                                       ": ", info.status().message()));
    }
    if (bytes > info->free_bytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA device ", device, " (", info->name, ", ", info->pci_bus_id,
          "): the device pools of rank(s) ",
          absl::StrJoin(ranks_of[device], ","), " need ", bytes,
          " bytes but only ", info->free_bytes, " of ", info->total_bytes,
          " bytes are free; use fewer device pages per rank"));
    }
  }
  return CheckShmCapacity(sizes.host_bytes_per_rank * sizes.ranks.size(),
                          options_.shm_dir, options_.shm_prefix);
}

std::unique_ptr<TransferEngine> CudaBackend::CreateTransferEngine(
    const RankPools* pools, TransferListener* listener) {
  return std::make_unique<CudaTransferEngine>(
      runtime_.get(), pools, listener,
      CudaTransferEngineOptions{
          .device_of_rank = options_.device_of_rank,
          .max_blocks_per_copy = options_.max_blocks_per_copy,
          .fence_ring_size = options_.fence_ring_size});
}

}  // namespace hicache
