#pragma once

#include <memory>
#include <string>

#include "daemon/backend/backend.h"
#include "daemon/pool/shm_pool.h"

namespace hicache {

// The CPU backend: both tiers are shared-memory segments ("<prefix>-device-rN"
// and "<prefix>-host-rN", see ShmPoolBackend) that workers map by name, and
// copies are memcpy on `transfer_workers` threads. Has no events: fences are
// refused and steps carry no fence.
class CpuBackend final : public Backend {
 public:
  struct Options {
    std::string shm_prefix;  // Empty: "/hicache-<pid>".
    int transfer_workers = 2;
    std::string shm_dir = "/dev/shm";  // Where CheckCapacity looks.
  };
  explicit CpuBackend(Options options);

  std::string name() const override { return "cpu"; }
  PoolBackend& pools() override { return pools_; }
  // Device and host pools are all shared memory: their sum must fit the
  // free space of /dev/shm.
  absl::Status CheckCapacity(const RankPools::Sizes& sizes) override;
  std::unique_ptr<TransferEngine> CreateTransferEngine(
      const RankPools* pools, TransferListener* listener) override;

 private:
  const Options options_;
  ShmPoolBackend pools_;
};

}  // namespace hicache
