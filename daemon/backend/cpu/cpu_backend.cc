#include "daemon/backend/cpu/cpu_backend.h"

#include <utility>

#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/pool/shm_capacity.h"

namespace hicache {

CpuBackend::CpuBackend(Options options)
    : options_(std::move(options)), pools_(options_.shm_prefix) {}

absl::Status CpuBackend::CheckCapacity(const RankPools::Sizes& sizes) {
  const uint64_t per_rank =
      sizes.device_bytes_per_rank + sizes.host_bytes_per_rank;
  return CheckShmCapacity(per_rank * sizes.ranks.size(), options_.shm_dir,
                          options_.shm_prefix);
}

std::unique_ptr<TransferEngine> CpuBackend::CreateTransferEngine(
    const RankPools* pools, TransferListener* listener) {
  return std::make_unique<CpuTransferEngine>(pools, listener,
                                             options_.transfer_workers);
}

}  // namespace hicache
