// HiCacheEngine: what operators and metrics read -- stats, lane and pool
// counts, the allocator accounting, and the tree's dump and node inspection
// (with the pages the storage tier holds).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache {

LaneCounts HiCacheEngine::LaneCountsOf(Rank lane) const {
  MutexLock lock(&mu_);
  return device_->Counts(lane);
}

EngineStats HiCacheEngine::Stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

TreeStats HiCacheEngine::TreeStatistics() const {
  MutexLock lock(&mu_);
  return tree_->Stats();
}

std::vector<NamespaceUsage> HiCacheEngine::UsageByNamespace() const {
  MutexLock lock(&mu_);
  return tree_->UsageByNamespace();
}

std::string HiCacheEngine::AccountingString() const {
  MutexLock lock(&mu_);
  std::vector<std::string> hosts;
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    hosts.push_back(
        absl::StrCat("rank ", r, ": ", host_[r]->AccountingString()));
  }
  return absl::StrCat(device_->AccountingString(), "; ",
                      absl::StrJoin(hosts, " | "));
}

int64_t HiCacheEngine::DeviceAvailable(Rank lane) const {
  MutexLock lock(&mu_);
  return device_->Counts(lane).available();
}

std::vector<NodeInfo> HiCacheEngine::Dump(const DumpFilter& filter) const {
  std::vector<NodeInfo> nodes;
  {
    MutexLock lock(&mu_);
    nodes = tree_->Dump(filter);
  }
  if (storage_ != nullptr) MarkStoragePages(&nodes);
  return nodes;
}

int64_t HiCacheEngine::DeviceAllocatedPages() const {
  MutexLock lock(&mu_);
  int64_t allocated = 0;
  for (Rank l = 0; l < layout_.cp_size(); ++l) {
    allocated += device_->Counts(l).allocated;
  }
  return allocated;
}

int64_t HiCacheEngine::TreeDevicePages() const {
  MutexLock lock(&mu_);
  return ledger_.Count(PageHolder::Kind::kTree);
}

int64_t HiCacheEngine::HostUsedPages(Rank rank) const {
  MutexLock lock(&mu_);
  return host_[rank]->used_pages();
}

absl::StatusOr<NodeInfo> HiCacheEngine::Inspect(NodeId node) const {
  std::vector<NodeInfo> nodes(1);
  {
    MutexLock lock(&mu_);
    absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
    if (!info.ok()) return info.status();
    nodes[0] = *std::move(info);
  }
  if (storage_ != nullptr) MarkStoragePages(&nodes);
  return nodes[0];
}

}  // namespace hicache
