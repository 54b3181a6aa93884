// SessionManager: a session's transfers -- backups (prepare, layer_stored by
// a scheduler or by the workers of its namespace, store_all, rollback, and
// their end), the worker fences layer_stored names, and load-backs.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/engine/session_manager.h"

namespace hicache {

absl::StatusOr<std::vector<uint64_t>> SessionManager::PrepareBackups(
    const std::string& id, absl::Span<const BackupSpec> specs) {
  if (absl::Status s = CheckItems(specs.size(), "prepare.specs"); !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "prepare");
  if (!session.ok()) return session.status();
  // The engine checks that every page is this session's, distinct.
  absl::StatusOr<std::vector<uint64_t>> ids =
      engine_->PrepareBackups(specs, (*session)->holder);
  if (!ids.ok()) return ids;
  Session& s = **session;
  for (uint64_t backup : *ids) {
    if (backup != 0) s.backups.insert(backup);
  }
  // Backups no stream reports on (Admit's) are never BackupFinished(): drop
  // the finished ones whenever the set has doubled, so it stays bounded by
  // the backups actually in flight.
  if (s.backups.size() >= s.backup_prune_at) {
    absl::erase_if(s.backups, [&](uint64_t backup) {
      return engine_->BackupAwaitsClient(backup).status().code() ==
             absl::StatusCode::kNotFound;
    });
    s.backup_prune_at = std::max<size_t>(64, 2 * s.backups.size());
  }
  return ids;
}

absl::StatusOr<uint64_t> SessionManager::RegisterFence(
    const std::string& id, Rank rank, const std::string& handle) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  if (static_cast<int64_t>((*session)->fences.size()) >= kMaxFencesPerSession) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session ", id, " already has ", kMaxFencesPerSession,
                     " fences; release one first"));
  }
  absl::StatusOr<uint64_t> fence = engine_->RegisterFence(rank, handle);
  if (!fence.ok()) return fence.status();
  (*session)->fences.insert(*fence);
  fence_ns_[*fence] = (*session)->info.ns;
  return fence;
}

absl::Status SessionManager::ReleaseFence(const std::string& id,
                                          uint64_t fence) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  if (!(*session)->fences.contains(fence)) {
    return absl::NotFoundError(
        absl::StrCat("fence ", fence, " is not a fence of this session"));
  }
  (*session)->fences.erase(fence);
  fence_ns_.erase(fence);
  return engine_->ReleaseFence(fence);
}

bool SessionManager::NamespaceOwnsBackupLocked(const std::string& ns,
                                               uint64_t backup) const {
  for (const auto& [id, session] : sessions_) {
    if (session.info.ns == ns && session.backups.contains(backup)) return true;
  }
  return false;
}

absl::Status SessionManager::LayerStored(const std::string& id,
                                         absl::Span<const uint64_t> backups,
                                         uint32_t step,
                                         absl::Span<const RankFence> fences) {
  if (absl::Status s = CheckItems(backups.size(), "layer_stored.backup_ids");
      !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  const Session& caller = **session;
  const bool worker = caller.info.role == SessionRole::kWorker;
  // A scheduler stores its own backups for every rank; a worker stores its
  // rank's share of backups that schedulers of its namespace prepared.
  for (size_t i = 0; i < backups.size(); ++i) {
    const bool known =
        caller.backups.contains(backups[i]) ||
        (worker && NamespaceOwnsBackupLocked(caller.info.ns, backups[i]));
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backup_ids[", i, "] = ", backups[i], " is not a backup of ",
          worker ? "this worker's namespace" : "this session"));
    }
  }
  if (fences.size() > engine_->layout().cp_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        fences.size(), " fences for ", engine_->layout().cp_size(), " ranks"));
  }
  for (size_t i = 0; i < fences.size(); ++i) {
    auto owner = fence_ns_.find(fences[i].fence);
    if (owner == fence_ns_.end() || owner->second != caller.info.ns) {
      return absl::NotFoundError(
          absl::StrCat("fences[", i, "] = ", fences[i].fence,
                       " is not registered in this session's namespace"));
    }
    if (worker && fences[i].rank != caller.info.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("fences[", i, "] is for rank ", fences[i].rank,
                       "; this worker is rank ", caller.info.rank));
    }
  }
  if (worker) {
    return engine_->RankLayerStored(backups, step, caller.info.rank,
                                    fences.empty() ? 0 : fences[0].fence);
  }
  return engine_->LayerStored(backups, step, fences);
}

absl::Status SessionManager::NamespaceLayerStored(
    const std::string& ns, Rank rank, absl::Span<const uint64_t> backups,
    uint32_t step) {
  if (absl::Status s = CheckItems(backups.size(), "layer_stored.backup_ids");
      !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  for (size_t i = 0; i < backups.size(); ++i) {
    if (!NamespaceOwnsBackupLocked(ns, backups[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("backup_ids[", i, "] = ", backups[i],
                       " is not a backup of this worker's namespace"));
    }
  }
  return engine_->RankLayerStored(backups, step, rank);
}

absl::Status SessionManager::StoreAll(const std::string& id, uint64_t backup) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "store_all");
  if (!session.ok()) return session.status();
  if (!(*session)->backups.contains(backup)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup ", backup, " is not a backup of this session"));
  }
  return engine_->StoreAllLayers(backup);
}

absl::Status SessionManager::Rollback(const std::string& id, uint64_t backup) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "rollback");
  if (!session.ok()) return session.status();
  if ((*session)->backups.erase(backup) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup ", backup, " is not a backup of this session"));
  }
  return engine_->RollbackBackup(backup);
}

absl::StatusOr<LoadResult> SessionManager::LoadBack(
    const std::string& id, absl::Span<const int32_t> tokens,
    const HiCacheEngine::LoadBackOptions& options) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "LoadBack");
  if (!session.ok()) return session.status();
  absl::StatusOr<LoadResult> load =
      engine_->LoadBack((*session)->info.ns, tokens, options);
  if (!load.ok()) return load;
  if (load->op_id != 0) {
    (*session)->loads.insert(load->op_id);
  } else if (load->device_len > 0) {  // The hit is locked; nothing to load.
    load->lock_handle = AddLockLocked(**session, load->node);
  }
  return load;
}

absl::Status SessionManager::FinishLoad(const std::string& id, uint64_t load) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "FinishLoad");
  if (!session.ok()) return session.status();
  if ((*session)->loads.erase(load) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("load ", load, " is not a load of this session"));
  }
  return engine_->FinishLoad(load);
}

void SessionManager::BackupFinished(const std::string& id, uint64_t backup) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.backups.erase(backup);
}

}  // namespace hicache
