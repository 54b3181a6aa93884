#include "daemon/transfer/transfer_task_check.h"

#include "absl/strings/str_cat.h"

namespace hicache {

absl::Status CheckTransferTask(const RankPools& pools,
                               const TransferTask& task) {
  const KvGeometry& geometry = pools.geometry();
  if (task.step >= geometry.NumSteps()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", task.step, " is outside the geometry's ",
                     geometry.NumSteps()));
  }
  const int64_t device_pages = pools.options().device_pages_per_rank;
  const int64_t host_pages = pools.options().host_pages_per_rank;
  for (const RankCopy& copy : task.ranks) {
    if (pools.device(copy.rank) == nullptr ||
        pools.host(copy.rank) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", copy.rank, " has no device and host pool here"));
    }
    if (copy.device_pages.size() != copy.host_pages.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", copy.rank, ": ", copy.device_pages.size(),
          " device pages but ", copy.host_pages.size(), " host pages"));
    }
    for (size_t i = 0; i < copy.device_pages.size(); ++i) {
      if (copy.device_pages[i] < 0 || copy.device_pages[i] >= device_pages ||
          copy.host_pages[i] < 0 || copy.host_pages[i] >= host_pages) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", copy.rank, ": page pair ", i, " (device ",
                         copy.device_pages[i], ", host ", copy.host_pages[i],
                         ") is outside the pools"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache
