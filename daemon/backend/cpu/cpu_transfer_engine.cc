#include "daemon/backend/cpu/cpu_transfer_engine.h"

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/transfer/transfer_task_check.h"

namespace hicache {

CpuTransferEngine::CpuTransferEngine(const RankPools* pools,
                                     TransferListener* listener,
                                     int num_workers)
    : pools_(pools), listener_(listener) {
  for (int i = 0; i < std::max(1, num_workers); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

CpuTransferEngine::~CpuTransferEngine() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.SignalAll();
  }
  for (std::thread& worker : workers_) worker.join();
}

absl::Status CpuTransferEngine::Validate(const TransferTask& task) const {
  TransferTaskBounds bounds = TransferTaskBoundsOf(*pools_);
  bounds.refuse_fences = true;  // The cpu backend has no fences.
  return CheckTransferTask(bounds, task);
}

absl::Status CpuTransferEngine::Submit(TransferTask task) {
  if (absl::Status valid = Validate(task); !valid.ok()) return valid;
  auto shared = std::make_shared<const TransferTask>(std::move(task));
  MutexLock lock(&mu_);
  for (size_t i = 0; i < shared->ranks.size(); ++i) {
    queue_.push_back(Work{shared, i});
    ++in_flight_;
  }
  work_cv_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CpuTransferEngine::CopyNow(const TransferTask& task) {
  if (absl::Status valid = Validate(task); !valid.ok()) return valid;
  uint64_t bytes = 0;
  for (const RankCopy& copy : task.ranks) bytes += CopyRank(task, copy);
  return bytes;
}

absl::StatusOr<uint64_t> CpuTransferEngine::RegisterFence(
    Rank /*rank*/, const std::string& /*handle*/) {
  return absl::FailedPreconditionError(
      "the cpu backend has no events: copies need no fence (the worker's "
      "layer_stored follows its writes to shared memory)");
}

absl::Status CpuTransferEngine::ReleaseFence(uint64_t fence) {
  return absl::NotFoundError(absl::StrCat("no fence ", fence));
}

absl::StatusOr<Rank> CpuTransferEngine::FenceRank(uint64_t fence) const {
  return absl::NotFoundError(absl::StrCat("no fence ", fence));
}

void CpuTransferEngine::Drain() {
  MutexLock lock(&mu_);
  while (in_flight_ > 0) idle_cv_.Wait(&mu_);
}

uint64_t CpuTransferEngine::CopyRank(const TransferTask& task,
                                     const RankCopy& copy) const {
  const KvGeometry& geometry = pools_->geometry();
  const RankPoolsOptions& options = pools_->options();
  char* device = static_cast<char*>(pools_->device(copy.rank)->host_data());
  char* host = static_cast<char*>(pools_->host(copy.rank)->host_data());
  const bool to_host = task.direction == TransferDirection::kDeviceToHost;
  uint64_t bytes = 0;
  for (const auto& [family, layer] : geometry.StepBlocks(task.step)) {
    const uint64_t block = geometry.BlockBytes(family);
    const bool host_adjacent =
        geometry.PageStride(options.host_layout, family) == block;
    size_t i = 0;
    while (i < copy.device_pages.size()) {
      // Extend a run of pages consecutive on both sides.
      size_t run = 1;
      while (host_adjacent && i + run < copy.device_pages.size() &&
             copy.device_pages[i + run] == copy.device_pages[i] + run &&
             copy.host_pages[i + run] == copy.host_pages[i] + run) {
        ++run;
      }
      char* d =
          device + geometry.DeviceOffset(options.device_pages_per_rank,
                                         copy.device_pages[i], family, layer);
      char* h = host + geometry.HostOffset(options.host_layout,
                                           options.host_pages_per_rank,
                                           copy.host_pages[i], family, layer);
      const uint64_t n = block * run;
      if (to_host) {
        std::memcpy(h, d, n);
      } else {
        std::memcpy(d, h, n);
      }
      bytes += n;
      i += run;
    }
  }
  return bytes;
}

void CpuTransferEngine::WorkerLoop() {
  while (true) {
    Work work;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // Stopping and drained.
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    const RankCopy& copy = work.task->ranks[work.rank_index];
    const uint64_t bytes = CopyRank(*work.task, copy);
    listener_->OnStepDone(StepDone{.op_id = work.task->op_id,
                                   .direction = work.task->direction,
                                   .rank = copy.rank,
                                   .step = work.task->step,
                                   .status = absl::OkStatus(),
                                   .bytes = bytes});
    MutexLock lock(&mu_);
    if (--in_flight_ == 0) idle_cv_.SignalAll();
  }
}

}  // namespace hicache
