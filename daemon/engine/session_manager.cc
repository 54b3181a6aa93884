#include "daemon/engine/session_manager.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache {

SessionManager::SessionManager(HiCacheEngine* engine, const Clock* clock,
                               absl::Duration default_lease)
    : engine_(engine), clock_(clock), default_lease_(default_lease) {}

absl::StatusOr<SessionManager::Session*> SessionManager::Find(
    const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "session '", id, "' is unknown or its lease expired; open a new one"));
  }
  return &it->second;
}

absl::StatusOr<SessionInfo> SessionManager::Open(std::string client_name,
                                                 SessionRole role, Rank rank,
                                                 std::string ns,
                                                 absl::Duration lease) {
  if (lease < absl::ZeroDuration() || lease > absl::Hours(24)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease must be in [0, 24h], got ", absl::FormatDuration(lease)));
  }
  if (rank >= engine_->layout().cp_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is not below cp_size ", engine_->layout().cp_size()));
  }
  MutexLock lock(&mu_);
  static thread_local std::mt19937_64 rng(std::random_device{}());
  Session session;
  session.info.id = absl::StrFormat("s%d-%016x", next_session_++, rng());
  session.info.client_name = std::move(client_name);
  session.info.role = role;
  session.info.rank = rank;
  session.info.ns = std::move(ns);
  session.info.lease = lease == absl::ZeroDuration() ? default_lease_ : lease;
  session.deadline = clock_->Now() + session.info.lease;
  SessionInfo info = session.info;
  sessions_.emplace(info.id, std::move(session));
  if (observer_) observer_("session_opened", info.id);
  spdlog::info("session {} opened by '{}' (namespace '{}', lease {})", info.id,
               info.client_name, info.ns, absl::FormatDuration(info.lease));
  return info;
}

absl::StatusOr<absl::Duration> SessionManager::KeepAlive(
    const std::string& id) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  (*session)->deadline = clock_->Now() + (*session)->info.lease;
  return (*session)->info.lease;
}

ReleaseSummary SessionManager::ReleaseLocked(Session& s) {
  ReleaseSummary summary;
  for (const auto& [node, count] : s.locks) {
    for (int64_t i = 0; i < count; ++i) {
      if (engine_->Unlock(node).ok()) ++summary.locks;
    }
  }
  for (uint64_t backup : s.backups) {
    // Finished backups are gone from the engine: NOT_FOUND is fine.
    if (engine_->RollbackBackup(backup).ok()) ++summary.backups;
  }
  for (uint64_t load : s.loads) {
    if (engine_->FinishLoad(load).ok()) ++summary.loads;
  }
  std::vector<LogicalPage> pages(s.pages.begin(), s.pages.end());
  if (!pages.empty()) {
    absl::Status freed = engine_->Free(pages);
    if (!freed.ok()) {
      spdlog::error("session {}: freeing its pages failed: {}", s.info.id,
                    freed);
    } else {
      summary.pages = static_cast<int64_t>(pages.size());
    }
  }
  s.locks.clear();
  s.backups.clear();
  s.loads.clear();
  s.pages.clear();
  return summary;
}

absl::StatusOr<ReleaseSummary> SessionManager::Close(const std::string& id) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  const ReleaseSummary summary = ReleaseLocked(**session);
  spdlog::info(
      "session {} closed: released {} locks, {} pages, {} backups, {} loads",
      id, summary.locks, summary.pages, summary.backups, summary.loads);
  sessions_.erase(id);
  if (observer_) observer_("session_closed", id);
  return summary;
}

int SessionManager::ExpireLapsed() {
  MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<std::string> lapsed;
  for (auto& [id, session] : sessions_) {
    if (session.deadline <= now) lapsed.push_back(id);
  }
  for (const std::string& id : lapsed) {
    const ReleaseSummary summary = ReleaseLocked(sessions_.at(id));
    spdlog::warn(
        "session {} lease expired: released {} locks, {} pages, rolled back {} "
        "backups, finished {} loads",
        id, summary.locks, summary.pages, summary.backups, summary.loads);
    sessions_.erase(id);
    if (observer_) observer_("session_expired", id);
  }
  return static_cast<int>(lapsed.size());
}

absl::StatusOr<std::vector<std::vector<LogicalPage>>> SessionManager::Allocate(
    const std::string& id, absl::Span<const AllocationItem> items) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  std::vector<std::vector<LogicalPage>> out;
  auto undo = [&] {
    for (const auto& pages : out) {
      (void)engine_->Free(pages);
    }
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const AllocationItem& item = items[i];
    if (item.owners.empty() && item.num_pages < 0) {
      undo();
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].num_pages must be >= 0, got ", item.num_pages));
    }
    absl::StatusOr<std::vector<LogicalPage>> pages;
    if (!item.owners.empty()) {
      pages = engine_->AllocateWithOwners(item.owners);
    } else if (item.mode.has_value()) {
      pages = engine_->AllocateWithOwners(
          engine_->layout().ComputeOwners(item.num_pages, *item.mode));
    } else {
      pages = engine_->Allocate(item.num_pages);
    }
    if (!pages.ok()) {
      undo();  // All or nothing.
      return absl::Status(
          pages.status().code(),
          absl::StrCat("items[", i, "]: ", pages.status().message()));
    }
    out.push_back(*std::move(pages));
  }
  for (const auto& pages : out)
    (*session)->pages.insert(pages.begin(), pages.end());
  return out;
}

absl::Status SessionManager::Free(const std::string& id,
                                  absl::Span<const LogicalPage> pages) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  for (size_t i = 0; i < pages.size(); ++i) {
    if (!(*session)->pages.contains(pages[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pages[", i, "] = ", pages[i], " does not belong to this session"));
    }
  }
  if (absl::Status freed = engine_->Free(pages); !freed.ok()) return freed;
  for (LogicalPage page : pages) (*session)->pages.erase(page);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<MatchResult>> SessionManager::Match(
    const std::string& id, absl::Span<const std::vector<int32_t>> requests,
    bool lock_hits, bool peek) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  std::vector<MatchResult> results;
  results.reserve(requests.size());
  for (const std::vector<int32_t>& tokens : requests) {
    absl::StatusOr<MatchResult> match =
        engine_->Match((*session)->info.ns, tokens, peek);
    if (!match.ok()) return match.status();
    if (lock_hits && match->device_len > 0 &&
        engine_->Lock(match->last_device_node).ok()) {
      ++(*session)->locks[match->last_device_node];
    }
    results.push_back(*std::move(match));
  }
  return results;
}

absl::StatusOr<std::vector<SessionInsertResult>> SessionManager::Insert(
    const std::string& id, absl::Span<const SessionInsertItem> items) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  Session& s = **session;
  std::vector<SessionInsertResult> results;
  for (size_t i = 0; i < items.size(); ++i) {
    const SessionInsertItem& item = items[i];
    if (item.backup_id != 0 && !s.backups.contains(item.backup_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "].backup_id ", item.backup_id,
                       " is not a backup of this session"));
    }
    absl::StatusOr<InsertResult> inserted = engine_->Insert(
        s.info.ns, item.tokens, item.pages, {.unfinished = item.unfinished});
    if (!inserted.ok()) {
      return absl::Status(
          inserted.status().code(),
          absl::StrCat("items[", i, "]: ", inserted.status().message()));
    }
    SessionInsertResult result{*inserted};
    if (!inserted->deferred) {
      // Pages the tree adopted or freed leave the session; uncached stay.
      absl::flat_hash_set<LogicalPage> uncached(
          inserted->uncached_pages.begin(), inserted->uncached_pages.end());
      for (LogicalPage page : item.pages) {
        if (!uncached.contains(page)) s.pages.erase(page);
      }
    }
    if (item.backup_id != 0) {
      result.backup_attached =
          !inserted->deferred &&
          engine_->AttachBackup(item.backup_id, inserted->node).ok();
      if (!result.backup_attached) {
        (void)engine_->RollbackBackup(item.backup_id);
        s.backups.erase(item.backup_id);
      }
    }
    results.push_back(std::move(result));
  }
  return results;
}

absl::Status SessionManager::Lock(const std::string& id,
                                  absl::Span<const NodeId> nodes) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (absl::Status s = engine_->Lock(nodes[i]); !s.ok()) {
      // Undo the locks taken by this call.
      for (size_t j = 0; j < i; ++j) {
        (void)engine_->Unlock(nodes[j]);
        --(*session)->locks[nodes[j]];
      }
      return absl::Status(s.code(),
                          absl::StrCat("nodes[", i, "]: ", s.message()));
    }
    ++(*session)->locks[nodes[i]];
  }
  return absl::OkStatus();
}

absl::Status SessionManager::Unlock(const std::string& id,
                                    absl::Span<const NodeId> nodes) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  absl::flat_hash_map<NodeId, int64_t> need;
  for (NodeId node : nodes) ++need[node];
  for (const auto& [node, count] : need) {
    auto it = (*session)->locks.find(node);
    if (it == (*session)->locks.end() || it->second < count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", node, " is not locked by this session (", count, " times)"));
    }
  }
  for (NodeId node : nodes) {
    (void)engine_->Unlock(node);
    if (--(*session)->locks[node] == 0) (*session)->locks.erase(node);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> SessionManager::PrepareBackups(
    const std::string& id, absl::Span<const BackupSpec> specs) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  for (size_t s = 0; s < specs.size(); ++s) {
    for (LogicalPage page : specs[s].pages) {
      if (!(*session)->pages.contains(page)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "specs[", s, "]: page ", page, " does not belong to this session"));
      }
    }
  }
  absl::StatusOr<std::vector<uint64_t>> ids = engine_->PrepareBackups(specs);
  if (!ids.ok()) return ids;
  for (uint64_t backup : *ids) {
    if (backup != 0) (*session)->backups.insert(backup);
  }
  return ids;
}

absl::Status SessionManager::LayerStored(const std::string& id,
                                         absl::Span<const uint64_t> backups,
                                         uint32_t step) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  for (size_t i = 0; i < backups.size(); ++i) {
    if (!(*session)->backups.contains(backups[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("backup_ids[", i, "] = ", backups[i],
                       " is not a backup of this session"));
    }
  }
  return engine_->LayerStored(backups, step);
}

absl::Status SessionManager::StoreAll(const std::string& id, uint64_t backup) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  if (!(*session)->backups.contains(backup)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup ", backup, " is not a backup of this session"));
  }
  return engine_->StoreAllLayers(backup);
}

absl::Status SessionManager::Rollback(const std::string& id, uint64_t backup) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  if ((*session)->backups.erase(backup) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("backup ", backup, " is not a backup of this session"));
  }
  return engine_->RollbackBackup(backup);
}

absl::StatusOr<LoadResult> SessionManager::LoadBack(
    const std::string& id, absl::Span<const int32_t> tokens) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  absl::StatusOr<LoadResult> load =
      engine_->LoadBack((*session)->info.ns, tokens);
  if (!load.ok()) return load;
  if (load->op_id != 0) {
    (*session)->loads.insert(load->op_id);
  } else if (load->node != kNoNode) {
    ++(*session)->locks[load->node];
  }
  return load;
}

absl::Status SessionManager::FinishLoad(const std::string& id, uint64_t load) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  if ((*session)->loads.erase(load) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("load ", load, " is not a load of this session"));
  }
  return engine_->FinishLoad(load);
}

absl::Status SessionManager::Pin(const std::string& id, NodeId node,
                                 absl::Duration ttl) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  return engine_->Pin(node, ttl);
}

SessionManager::Totals SessionManager::totals() const {
  MutexLock lock(&mu_);
  Totals totals;
  totals.sessions = static_cast<int64_t>(sessions_.size());
  for (const auto& [id, session] : sessions_) {
    for (const auto& [node, count] : session.locks) totals.locks += count;
    totals.pages += static_cast<int64_t>(session.pages.size());
  }
  return totals;
}

std::vector<SessionInfo> SessionManager::List() const {
  MutexLock lock(&mu_);
  std::vector<SessionInfo> out;
  for (const auto& [id, session] : sessions_) out.push_back(session.info);
  return out;
}

}  // namespace hicache
