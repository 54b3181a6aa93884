#pragma once

#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "daemon/core/mutex.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

// CPU backend: memcpy between the shared-memory pools on worker threads.
// Physically consecutive runs (on both sides) whose layout makes them
// adjacent in memory are copied with one memcpy per run; page-first host
// layouts copy one block per page.
//
// Lock order: mu_ is a leaf; the listener is called without it held.
class CpuTransferEngine final : public TransferEngine {
 public:
  // `pools` and `listener` must outlive the engine.
  CpuTransferEngine(const RankPools* pools, TransferListener* listener,
                    int num_workers);
  ~CpuTransferEngine() override ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Submit(TransferTask task) override ABSL_LOCKS_EXCLUDED(mu_);
  void Drain() override ABSL_LOCKS_EXCLUDED(mu_);
  // No events on this backend: FAILED_PRECONDITION (and a task naming a
  // fence is refused by Submit).
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override;
  absl::Status ReleaseFence(uint64_t fence) override;
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override;

  // Copies `task` on the calling thread and returns the bytes moved; no
  // listener call. Same validation as Submit. For benchmarks and tests.
  absl::StatusOr<uint64_t> CopyNow(const TransferTask& task);

  // Copies one (rank, step) now, on the calling thread. Returns bytes copied.
  // Exposed for benchmarks. REQUIRES: the task was validated.
  uint64_t CopyRank(const TransferTask& task, const RankCopy& copy) const;

 private:
  struct Work {
    std::shared_ptr<const TransferTask> task;
    size_t rank_index;
  };
  absl::Status Validate(const TransferTask& task) const;
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const RankPools* const pools_;
  TransferListener* const listener_;
  Mutex mu_;
  CondVar work_cv_;
  CondVar idle_cv_;
  std::deque<Work> queue_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace hicache
