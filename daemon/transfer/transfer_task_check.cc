#include "daemon/transfer/transfer_task_check.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hicache {
namespace {

absl::Status Refused(const TransferTaskBounds& bounds,
                     absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(bounds.context, problem));
}

absl::Status CheckStep(const TransferTaskBounds& bounds, uint32_t step) {
  if (bounds.num_steps.has_value() && step >= *bounds.num_steps) {
    return Refused(bounds,
                   absl::StrCat("step ", step, " is outside the geometry's ",
                                *bounds.num_steps));
  }
  return absl::OkStatus();
}

bool Inside(int64_t page, const std::optional<int64_t>& pages) {
  return page >= 0 && (!pages.has_value() || page < *pages);
}

// " (16 device, 32 host pages a rank)", as far as the sizes are known.
std::string PoolSizes(const TransferTaskBounds& bounds) {
  const auto& device = bounds.device_pages_per_rank;
  const auto& host = bounds.host_pages_per_rank;
  if (device.has_value() && host.has_value()) {
    return absl::StrCat(" (", *device, " device, ", *host,
                        " host pages a rank)");
  }
  if (device.has_value())
    return absl::StrCat(" (", *device, " device pages a rank)");
  if (host.has_value()) return absl::StrCat(" (", *host, " host pages a rank)");
  return "";
}

// The copy at `index` of `task`, its step aside.
absl::Status CheckCopy(const TransferTaskBounds& bounds,
                       const TransferTask& task, size_t index) {
  const RankCopy& copy = task.ranks[index];
  if (bounds.serves && !bounds.serves(copy.rank)) {
    return Refused(bounds, absl::StrCat("rank ", copy.rank, " is not served"));
  }
  if (bounds.refuse_repeated_ranks) {
    // A task names at most the CP size's ranks: a scan is cheap.
    for (size_t i = 0; i < index; ++i) {
      if (task.ranks[i].rank == copy.rank) {
        return Refused(bounds,
                       absl::StrCat("rank ", copy.rank, " is named twice"));
      }
    }
  }
  if (bounds.refuse_fences && copy.wait_fence != 0) {
    return Refused(bounds,
                   absl::StrCat("rank ", copy.rank, ": fence ", copy.wait_fence,
                                " named where no fences are accepted"));
  }
  if (copy.device_pages.size() != copy.host_pages.size()) {
    return Refused(
        bounds, absl::StrCat("rank ", copy.rank, ": ", copy.device_pages.size(),
                             " device pages but ", copy.host_pages.size(),
                             " host pages"));
  }
  for (size_t i = 0; i < copy.device_pages.size(); ++i) {
    if (!Inside(copy.device_pages[i], bounds.device_pages_per_rank) ||
        !Inside(copy.host_pages[i], bounds.host_pages_per_rank)) {
      return Refused(
          bounds,
          absl::StrCat("rank ", copy.rank, ": page pair ", i, " (device ",
                       copy.device_pages[i], ", host ", copy.host_pages[i],
                       ") is outside the pools", PoolSizes(bounds)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTransferTask(const TransferTaskBounds& bounds,
                               const TransferTask& task) {
  if (absl::Status step = CheckStep(bounds, task.step); !step.ok()) {
    return step;
  }
  for (size_t i = 0; i < task.ranks.size(); ++i) {
    if (absl::Status copy = CheckCopy(bounds, task, i); !copy.ok()) {
      return copy;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRankCopy(const TransferTaskBounds& bounds,
                           const TransferTask& task, size_t index) {
  if (absl::Status step = CheckStep(bounds, task.step); !step.ok()) {
    return step;
  }
  return CheckCopy(bounds, task, index);
}

TransferTaskBounds TransferTaskBoundsOf(const RankPools& pools) {
  return TransferTaskBounds{
      .serves =
          [&pools](Rank rank) {
            return pools.device(rank) != nullptr && pools.host(rank) != nullptr;
          },
      .num_steps = pools.geometry().NumSteps(),
      .device_pages_per_rank = pools.options().device_pages_per_rank,
      .host_pages_per_rank = pools.options().host_pages_per_rank,
  };
}

absl::Status CheckTransferTask(const RankPools& pools,
                               const TransferTask& task) {
  return CheckTransferTask(TransferTaskBoundsOf(pools), task);
}

}  // namespace hicache
