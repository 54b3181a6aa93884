// HiCacheEngine: the backups a write policy starts by itself -- write-through
// at a hit (asynchronous, attached at once) and write-back of eviction
// victims (synchronous, CopyNow) -- as opposed to the per-layer backups a
// scheduler prepares for a forward pass (engine_ops.cc).
#include <vector>

#include "absl/time/clock.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/engine_op.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

void HiCacheEngine::StartBackupOfNodeLocked(NodeId node) {
  absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
  if (!info.ok() || info->tier != NodeTier::kDevice || info->pending_backup) {
    return;
  }
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kBackup;
  op->pages = info->device_pages;
  op->owners = layout_.OwnersOf(op->pages);
  op->logical_len = info->len;
  std::vector<int64_t> need(layout_.cp_size(), 0);
  for (Rank owner : op->owners) ++need[owner];
  EvictHostLocked(need);
  if (!ReserveHostLocked(op->owners, &op->host).ok()) {
    ++stats_.backups_skipped_no_host;
    return;
  }
  absl::StatusOr<CpHostMeta> meta =
      CpHostMeta::Create(op->logical_len, layout_.page_size(),
                         layout_.cp_size(), op->owners, op->host);
  if (!meta.ok() || !tree_->BeginBackup(node, *std::move(meta)).ok()) {
    FreeHostLocked(op->host);
    return;
  }
  op->id = next_op_++;
  op->node = node;
  op->attached = true;
  op->submitted.assign(geometry_.NumSteps(), true);
  op->submit_ns = absl::GetCurrentTimeNanos();
  AcquirePagesLocked(op->pages);
  ++stats_.backups_started;
  Op& ref = *op;
  ops_[op->id] = std::move(op);
  for (uint32_t step = 0; step < geometry_.NumSteps(); ++step) {
    if (absl::Status s = SubmitStepLocked(ref, step); !s.ok()) {
      spdlog::error("write-through submit failed: {}", s);
    }
  }
}

void HiCacheEngine::WriteBackVictimsLocked(absl::Span<const int64_t> need) {
  // Back up, synchronously, unbacked victims until they cover the shortage,
  // so eviction moves them to host instead of dropping them.
  std::vector<int64_t> covered(layout_.cp_size(), 0);
  for (NodeId node : tree_->DeviceEvictionOrder(1 << 20)) {
    bool short_lane = false;
    for (Rank l = 0; l < layout_.cp_size(); ++l) {
      short_lane |= covered[l] < need[l];
    }
    if (!short_lane) return;
    absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
    if (!info.ok()) continue;
    for (LogicalPage p : info->device_pages) ++covered[layout_.LaneOf(p)];
    if (info->tier != NodeTier::kDevice) continue;  // Already backed.
    const std::vector<Rank> owners = layout_.OwnersOf(info->device_pages);
    std::vector<std::vector<int64_t>> host;
    std::vector<int64_t> host_need(layout_.cp_size(), 0);
    for (Rank owner : owners) ++host_need[owner];
    EvictHostLocked(host_need);
    if (!ReserveHostLocked(owners, &host).ok()) {
      ++stats_.backups_skipped_no_host;
      continue;
    }
    Op op;
    op.kind = Op::Kind::kBackup;
    op.pages = info->device_pages;
    op.owners = owners;
    op.host = host;
    bool copied = true;
    for (uint32_t step = 0; step < geometry_.NumSteps() && copied; ++step) {
      absl::StatusOr<uint64_t> bytes = transfer_->CopyNow(MakeTask(op, step));
      copied = bytes.ok();
      if (copied) {
        stats_.bytes_to_host += *bytes;
      } else {
        ++stats_.copy_failures;  // The victim is dropped, not backed up.
        spdlog::warn("write-back of node {} failed at step {}: {}", node, step,
                     bytes.status());
      }
    }
    absl::StatusOr<CpHostMeta> meta = CpHostMeta::Create(
        info->len, layout_.page_size(), layout_.cp_size(), owners, host);
    if (!copied || !meta.ok() || !tree_->BeginBackup(node, *meta).ok() ||
        !tree_->CommitBackup(node).ok()) {
      FreeHostLocked(host);
      continue;
    }
    ++stats_.write_back_backups;
  }
}

}  // namespace hicache
