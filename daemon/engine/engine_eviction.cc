// HiCacheEngine: eviction -- device and host eviction to a need or to exact
// targets (write-back staging first under write_back), the free-room targets
// (EnforceFreeRoom, SetFreeRoom) and operator eviction (EvictPages).
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

DeviceEvictResult HiCacheEngine::EvictDeviceLocked(
    absl::Span<const int64_t> need, bool may_wait, const EvictionScope& scope) {
  std::vector<int64_t> target(layout_.cp_size(), 0);
  for (Rank l = 0; l < layout_.cp_size(); ++l) {
    const int64_t available = device_->Counts(l).available();
    if (need[l] > available) {
      target[l] = need[l] - available + l1_free_room_;
    }
  }
  return EvictDeviceTargetsLocked(target, may_wait, scope);
}

DeviceEvictResult HiCacheEngine::EvictDeviceTargetsLocked(
    absl::Span<const int64_t> target, bool may_wait,
    const EvictionScope& scope) {
  if (std::all_of(target.begin(), target.end(),
                  [](int64_t t) { return t <= 0; })) {
    return DeviceEvictResult{};
  }
  std::vector<NodeId> held;
  if (options_.write_policy == WritePolicy::kWriteBack) {
    const std::vector<uint64_t> staged =
        StageWriteBackLocked(target, &held, scope);
    if (may_wait) AwaitOpsLocked(staged);
  }
  DeviceEvictResult result =
      ApplyDeviceEvictionLocked(tree_->EvictDevice(target, scope));
  ReleaseHostRefsLocked(held);
  WriteAheadDueLocked();
  return result;
}

DeviceEvictResult HiCacheEngine::ApplyDeviceEvictionLocked(
    DeviceEvictResult result) {
  ++stats_.device_eviction_steps;
  stats_.device_victims_to_host += result.nodes_to_host;
  stats_.device_victims_removed += result.nodes_removed;
  int64_t freed = 0;
  for (const auto& lane : result.freed_pages) {
    ledger_.Remove(lane);
    FreeDeviceLocked(lane);
    freed += lane.size();
  }
  FreeHostLocked(result.freed_host_pages);
  stats_.device_evicted_pages += freed;
  spdlog::debug("device eviction freed {} pages ({} to host, {} removed)",
                freed, result.nodes_to_host, result.nodes_removed);
  return result;
}

void HiCacheEngine::EvictHostLocked(absl::Span<const int64_t> need,
                                    const EvictionScope& scope) {
  std::vector<int64_t> target(layout_.cp_size(), 0);
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    const int64_t free = host_[r]->free_pages();
    // Progress is counted in physical host pages of that rank.
    if (need[r] > free) {
      target[r] = need[r] - free + l2_free_room_;
    }
  }
  EvictHostTargetsLocked(target, scope);
}

int64_t HiCacheEngine::EvictHostTargetsLocked(absl::Span<const int64_t> target,
                                              const EvictionScope& scope) {
  if (std::all_of(target.begin(), target.end(),
                  [](int64_t t) { return t <= 0; })) {
    return 0;
  }
  ++stats_.host_eviction_steps;
  // Under write-back a device node's host copy is redundant (its eviction
  // writes it back): such copies go first, so the tiers hold as much
  // distinct KV as they can (exclusive tiering).
  // write_ahead drops copies of device nodes too, but not those of the
  // cold end it copied ahead (accessed before write_ahead_boundary_ns_).
  const bool ahead = options_.write_policy == WritePolicy::kWriteAhead;
  HostEvictResult result = tree_->EvictHost(
      target, options_.write_policy == WritePolicy::kWriteBack || ahead,
      ahead ? write_ahead_boundary_ns_ : INT64_MIN, scope);
  stats_.host_copies_dropped += result.nodes_dropped;
  int64_t freed = 0;
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    freed += result.freed_host_pages[r].size();
  }
  FreeHostLocked(result.freed_host_pages);
  stats_.host_evicted_pages += freed;
  spdlog::debug("host eviction freed {} pages from {} nodes", freed,
                result.nodes_removed);
  return freed;
}

absl::Status HiCacheEngine::EnforceFreeRoom() {
  MutexLock lock(&mu_);
  std::vector<int64_t> device_target(layout_.cp_size(), 0);
  std::vector<int64_t> host_target(layout_.cp_size(), 0);
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    device_target[r] = l1_free_room_ - device_->Counts(r).available();
    host_target[r] = l2_free_room_ - host_[r]->free_pages();
  }
  EvictDeviceTargetsLocked(device_target, /*may_wait=*/true);
  EvictHostTargetsLocked(host_target);
  return absl::OkStatus();
}

absl::Status HiCacheEngine::SetFreeRoom(int64_t l1_pages, int64_t l2_pages) {
  const int64_t l1_max = options_.device_pages_per_rank - 1;
  const int64_t l2_max = options_.host_pages_per_rank;
  if (l1_pages < 0 || l2_pages < 0 || l1_pages > l1_max || l2_pages > l2_max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "free-room targets must be in [0, ", l1_max,
        "] pages per lane (L1) and [0, ", l2_max, "] pages per rank (L2); got ",
        l1_pages, " and ", l2_pages));
  }
  MutexLock lock(&mu_);
  l1_free_room_ = l1_pages;
  l2_free_room_ = l2_pages;
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> HiCacheEngine::FreeRoomTargets() const {
  MutexLock lock(&mu_);
  return {l1_free_room_, l2_free_room_};
}

absl::StatusOr<std::pair<int64_t, int64_t>> HiCacheEngine::EvictPages(
    absl::Span<const int64_t> device_per_lane,
    absl::Span<const int64_t> host_per_rank) {
  const size_t c = layout_.cp_size();
  if (device_per_lane.size() > c || host_per_rank.size() > c) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction targets list more than cp_size ", c, " entries"));
  }
  std::vector<int64_t> device(c, 0), host(c, 0);
  // More than a lane or rank holds means all of it (no overflow in sums).
  for (size_t i = 0; i < device_per_lane.size(); ++i) {
    if (device_per_lane[i] < 0) {
      return absl::InvalidArgumentError("eviction targets must be >= 0");
    }
    device[i] = std::min(device_per_lane[i], options_.device_pages_per_rank);
  }
  for (size_t i = 0; i < host_per_rank.size(); ++i) {
    if (host_per_rank[i] < 0) {
      return absl::InvalidArgumentError("eviction targets must be >= 0");
    }
    host[i] = std::min(host_per_rank[i], options_.host_pages_per_rank);
  }
  MutexLock lock(&mu_);
  const DeviceEvictResult evicted =
      EvictDeviceTargetsLocked(device, /*may_wait=*/true);
  int64_t device_freed = 0;
  for (const auto& lane : evicted.freed_pages) device_freed += lane.size();
  const int64_t host_freed = EvictHostTargetsLocked(host);
  return std::make_pair(device_freed, host_freed);
}

}  // namespace hicache
