// HiCacheEngine: the client's side of a per-layer backup -- "layer s is
// written" for every served rank (the scheduler's layer_stored) or for one
// rank (its worker's own), and the all-layer fallback. Each submits the
// copies that step still needs; a failed backup is skipped (its failure was
// reported).
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/engine/engine_op.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::Status HiCacheEngine::LayerStored(absl::Span<const uint64_t> ops,
                                        uint32_t step,
                                        absl::Span<const RankFence> fences) {
  MutexLock lock(&mu_);
  if (step >= geometry_.NumSteps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, " is outside [0, ", geometry_.NumSteps(), ")"));
  }
  std::vector<bool> fenced(layout_.cp_size(), false);
  for (const RankFence& fence : fences) {
    if (fence.rank >= layout_.cp_size() || !layout_.Serves(fence.rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fence for rank ", fence.rank,
                       ", which this daemon does not serve"));
    }
    if (fenced[fence.rank]) {
      return absl::InvalidArgumentError(
          absl::StrCat("two fences for rank ", fence.rank));
    }
    fenced[fence.rank] = true;
    absl::StatusOr<Rank> owner = transfer_->FenceRank(fence.fence);
    if (!owner.ok() || *owner != fence.rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fence ", fence.fence, " is not registered for rank ", fence.rank));
    }
  }
  if (absl::Status s = CheckStoredOpsLocked(ops, step); !s.ok()) return s;
  for (uint64_t id : ops) {
    auto it = ops_.find(id);
    if (it == ops_.end()) continue;  // Failed, settled by an earlier entry.
    Op& op = *it->second;
    if (op.submitted[step]) continue;  // Idempotent per step.
    op.submitted[step] = true;
    // Its failure was reported; nothing to copy.
    if (OpFailed(op.state)) {
      EraseSettledFailedBackupLocked(id);
      continue;
    }
    op.submit_ns = absl::GetCurrentTimeNanos();
    if (absl::Status s = SubmitStepLocked(op, step, fences); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status HiCacheEngine::CheckStoredOpsLocked(absl::Span<const uint64_t> ops,
                                                 uint32_t step) const {
  if (step >= geometry_.NumSteps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, " is outside [0, ", geometry_.NumSteps(), ")"));
  }
  // A repeated id is a client's mistake, refused like any other (it would
  // otherwise count once, silently).
  absl::flat_hash_set<uint64_t> seen;
  seen.reserve(ops.size());
  for (uint64_t id : ops) {
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("backup ", id, " is named twice in one layer_stored"));
    }
    auto it = ops_.find(id);
    if (it == ops_.end() || it->second->kind != Op::Kind::kBackup) {
      return absl::NotFoundError(absl::StrCat("no backup with op id ", id));
    }
    if (it->second->state == OpState::kRolledBack) {
      return absl::FailedPreconditionError(
          absl::StrCat("backup ", id, " was rolled back"));
    }
  }
  return absl::OkStatus();
}

absl::Status HiCacheEngine::RankLayerStored(absl::Span<const uint64_t> ops,
                                            uint32_t step, Rank rank,
                                            uint64_t fence) {
  MutexLock lock(&mu_);
  if (rank >= layout_.cp_size() || !layout_.Serves(rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not served by this daemon"));
  }
  if (fence != 0) {
    absl::StatusOr<Rank> owner = transfer_->FenceRank(fence);
    if (!owner.ok() || *owner != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fence ", fence, " is not registered for rank ", rank));
    }
  }
  if (absl::Status s = CheckStoredOpsLocked(ops, step); !s.ok()) return s;
  const RankFence fences[] = {{rank, fence}};
  for (uint64_t id : ops) {
    auto it = ops_.find(id);
    if (it == ops_.end()) continue;
    Op& op = *it->second;
    if (op.submitted[step]) continue;
    if (op.rank_submitted.empty()) {
      op.rank_submitted.assign(geometry_.NumSteps(),
                               std::vector<bool>(layout_.cp_size(), false));
    }
    if (op.rank_submitted[step][rank]) continue;  // Idempotent.
    op.rank_submitted[step][rank] = true;
    bool all = true;
    for (Rank r : layout_.served_ranks()) all &= op.rank_submitted[step][r];
    if (all) op.submitted[step] = true;
    if (OpFailed(op.state)) {
      if (all) EraseSettledFailedBackupLocked(id);
      continue;
    }
    op.submit_ns = absl::GetCurrentTimeNanos();
    if (absl::Status s = SubmitStepLocked(
            op, step, fence != 0 ? absl::MakeConstSpan(fences)
                                 : absl::Span<const RankFence>(),
            rank);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status HiCacheEngine::StoreAllLayers(uint64_t id) {
  std::vector<uint32_t> missing;
  {
    MutexLock lock(&mu_);
    auto it = ops_.find(id);
    if (it == ops_.end() || it->second->kind != Op::Kind::kBackup) {
      return absl::NotFoundError(absl::StrCat("no backup with op id ", id));
    }
    // Its failure was reported; nothing to copy.
    if (OpFailed(it->second->state)) {
      it->second->submitted.assign(geometry_.NumSteps(), true);
      EraseSettledFailedBackupLocked(id);
      return absl::OkStatus();
    }
    for (uint32_t s = 0; s < geometry_.NumSteps(); ++s) {
      if (!it->second->submitted[s]) missing.push_back(s);
    }
    if (!missing.empty()) {
      ++stats_.fallback_backups;
      spdlog::warn(
          "backup {}: all-layer fallback copies {} steps after the "
          "forward pass",
          id, missing.size());
    }
  }
  for (uint32_t step : missing) {
    const uint64_t ids[] = {id};
    if (absl::Status s = LayerStored(ids, step); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace hicache
