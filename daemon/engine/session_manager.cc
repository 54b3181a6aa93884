#include "daemon/engine/session_manager.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

// 128 bits from the kernel's CSPRNG: session ids are bearer tokens.
std::string RandomToken() {
  std::random_device device;  // getrandom(2) on Linux.
  uint64_t words[2];
  for (uint64_t& word : words) {
    word = (static_cast<uint64_t>(device()) << 32) | device();
  }
  return absl::StrFormat("%016x%016x", words[0], words[1]);
}

absl::string_view RoleName(SessionRole role) {
  return role == SessionRole::kWorker ? "worker" : "scheduler";
}

}  // namespace

SessionManager::SessionManager(HiCacheEngine* engine, const Clock* clock,
                               absl::Duration default_lease,
                               SessionLimits limits)
    : engine_(engine),
      clock_(clock),
      default_lease_(default_lease),
      limits_(limits) {}

namespace {

absl::Status UnknownSession(const std::string& id) {
  return absl::NotFoundError(absl::StrCat(
      "session '", id.size() <= 64 ? id : id.substr(0, 64) + "...",
      "' is unknown or its lease expired; open a new one"));
}

}  // namespace

absl::StatusOr<SessionManager::Session*> SessionManager::Find(
    const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return UnknownSession(id);
  return &it->second;
}

absl::Status SessionManager::CheckCaller(const std::string& id,
                                         const Caller& caller) const {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return UnknownSession(id);
  const SessionInfo& info = it->second.info;
  if (caller.is_operator || info.owner == caller.principal) {
    return absl::OkStatus();
  }
  spdlog::warn(
      "session {} (opened by '{}') named by {} ({}): refused as unknown",
      info.id, info.owner.empty() ? "an unidentified caller" : info.owner,
      caller.name,
      caller.principal.empty() ? "unidentified" : caller.principal);
  return UnknownSession(id);
}

absl::StatusOr<SessionManager::Session*> SessionManager::FindScheduler(
    const std::string& id, absl::string_view what) {
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session;
  if ((*session)->info.role != SessionRole::kScheduler) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " needs a scheduler session; session ", id,
                     " has role ", RoleName((*session)->info.role)));
  }
  return session;
}

absl::Status SessionManager::CheckNodeInNamespace(
    const Session& session, NodeId node, absl::string_view field) const {
  absl::StatusOr<std::string> ns = engine_->NamespaceOf(node);
  if (!ns.ok() || *ns != session.info.ns) {
    return absl::NotFoundError(
        absl::StrCat(field, ": no node ", node, " in this session's namespace"));
  }
  return absl::OkStatus();
}

absl::Status SessionManager::CheckItems(size_t count,
                                        absl::string_view what) const {
  if (static_cast<int64_t>(count) > limits_.max_items_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", count, " entries; the limit is ",
                     limits_.max_items_per_request, " per call"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionInfo> SessionManager::Open(std::string client_name,
                                                 SessionRole role, Rank rank,
                                                 std::string ns,
                                                 absl::Duration lease,
                                                 std::string owner) {
  if (lease < absl::ZeroDuration() || lease > limits_.max_lease) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease must be in [0, ", absl::FormatDuration(limits_.max_lease),
                     "], got ", absl::FormatDuration(lease)));
  }
  if (rank >= engine_->layout().cp_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is not below cp_size ", engine_->layout().cp_size()));
  }
  // A worker reads and writes its rank's pools, and its events are this
  // daemon's only for the ranks whose pools live here (a CP group's other
  // ranks are another daemon's: docs/cp-groups.md).
  if (role == SessionRole::kWorker && !engine_->pools().layout().Serves(rank)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank,
        "'s pools are not in this daemon (it holds ranks ",
        absl::StrJoin(engine_->pools().layout().served_ranks(), ","),
        "): open the worker session on the daemon of the CP group that "
        "holds rank ", rank));
  }
  for (const auto& [field, value] :
       {std::pair<absl::string_view, const std::string*>{"client_name",
                                                         &client_name},
        {"namespace", &ns}}) {
    if (static_cast<int64_t>(value->size()) > limits_.max_name_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " has ", value->size(), " bytes; the limit is ",
                       limits_.max_name_bytes));
    }
  }
  MutexLock lock(&mu_);
  if (static_cast<int64_t>(sessions_.size()) >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the daemon has ", sessions_.size(),
                     " open sessions, its limit (--max_sessions)"));
  }
  if (!namespaces_.contains(ns) &&
      static_cast<int64_t>(namespaces_.size()) >= limits_.max_namespaces) {
    return absl::ResourceExhaustedError(
        absl::StrCat("open sessions already use ", namespaces_.size(),
                     " namespaces, the limit (--max_namespaces)"));
  }
  Session session;
  session.holder = next_session_++;
  session.info.id = absl::StrCat("s", session.holder, "-", RandomToken());
  session.info.client_name = std::move(client_name);
  session.info.owner = std::move(owner);
  session.info.role = role;
  session.info.rank = rank;
  session.info.ns = std::move(ns);
  session.info.lease = lease == absl::ZeroDuration() ? default_lease_ : lease;
  session.deadline = clock_->Now() + session.info.lease;
  SessionInfo info = session.info;
  // Its request pages count against its namespace's device limit.
  engine_->BindHolder(session.holder, info.ns);
  ++namespaces_[info.ns];
  sessions_.emplace(info.id, std::move(session));
  if (observer_) observer_("session_opened", info.id);
  spdlog::info(
      "session {} opened by '{}' ({}, namespace '{}', lease {}, owner {})",
      info.id, info.client_name, RoleName(info.role), info.ns,
      absl::FormatDuration(info.lease),
      info.owner.empty() ? "unidentified" : info.owner);
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
  summary.pages = engine_->FreeAllOf(s.holder);
  for (uint64_t fence : s.fences) {
    fence_ns_.erase(fence);
    if (absl::Status released = engine_->ReleaseFence(fence); !released.ok()) {
      spdlog::warn("releasing fence {} of session {}: {}", fence, s.info.id,
                   released.message());
    }
  }
  s.fences.clear();
  s.locks.clear();
  s.lock_handles.clear();
  s.backups.clear();
  s.loads.clear();
  return summary;
}

void SessionManager::EraseLocked(const std::string& id) {
  auto it = sessions_.find(id);
  const std::string ns = it->second.info.ns;
  engine_->UnbindHolder(it->second.holder);
  sessions_.erase(it);
  auto used = namespaces_.find(ns);
  if (--used->second == 0) {
    namespaces_.erase(used);
    engine_->DropNamespaceIfEmpty(ns);
  }
}

absl::StatusOr<ReleaseSummary> SessionManager::Close(const std::string& id) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  const ReleaseSummary summary = ReleaseLocked(**session);
  spdlog::info(
      "session {} closed: released {} locks, {} pages, {} backups, {} loads",
      id, summary.locks, summary.pages, summary.backups, summary.loads);
  EraseLocked(id);
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
    EraseLocked(id);
    if (observer_) observer_("session_expired", id);
  }
  return static_cast<int>(lapsed.size());
}

absl::StatusOr<std::vector<std::vector<LogicalPage>>> SessionManager::Allocate(
    const std::string& id, absl::Span<const AllocationItem> items) {
  if (absl::Status s = CheckItems(items.size(), "Allocate.items"); !s.ok()) {
    return s;
  }
  // Sizes first, before any work: no request may cause a large allocation,
  // a long lock hold or an allocation that cannot succeed.
  const int64_t capacity = engine_->DevicePageCapacity();
  const int64_t limit = std::min(capacity, limits_.max_pages_per_request);
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const AllocationItem& item = items[i];
    const int64_t n = item.owners.empty()
                          ? item.num_pages
                          : static_cast<int64_t>(item.owners.size());
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].num_pages must be >= 0, got ", item.num_pages));
    }
    if (n > limit - total) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "items[", i, "]: the call asks for more than ", limit,
          " pages (the pool has ", capacity,
          " usable device pages; --max_pages_per_request is ",
          limits_.max_pages_per_request, ")"));
    }
    total += n;
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Allocate");
  if (!session.ok()) return session.status();
  const uint64_t holder = (*session)->holder;
  std::vector<std::vector<LogicalPage>> out;
  auto undo = [&] {
    for (const auto& pages : out) {
      if (absl::Status s = engine_->Free(pages, holder); !s.ok()) {
        spdlog::error("session {}: undoing an allocation failed: {}", id, s);
      }
    }
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const AllocationItem& item = items[i];
    absl::StatusOr<std::vector<LogicalPage>> pages;
    if (!item.owners.empty()) {
      pages = engine_->AllocateWithOwners(item.owners, holder);
    } else if (item.mode.has_value()) {
      pages = engine_->AllocateWithOwners(
          engine_->layout().ComputeOwners(item.num_pages, *item.mode), holder);
    } else {
      pages = engine_->Allocate(item.num_pages, holder);
    }
    if (!pages.ok()) {
      undo();  // All or nothing.
      return absl::Status(
          pages.status().code(),
          absl::StrCat("items[", i, "]: ", pages.status().message()));
    }
    out.push_back(*std::move(pages));
  }
  return out;
}

absl::Status SessionManager::Free(const std::string& id,
                                  absl::Span<const LogicalPage> pages) {
  if (static_cast<int64_t>(pages.size()) > limits_.max_pages_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("Free names ", pages.size(), " pages; the limit is ",
                     limits_.max_pages_per_request));
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Free");
  if (!session.ok()) return session.status();
  return engine_->Free(pages, (*session)->holder);
}

uint64_t SessionManager::AddLockLocked(Session& session, NodeId node) {
  ++session.locks[node];
  const uint64_t handle = next_lock_handle_++;
  session.lock_handles[handle] = node;
  return handle;
}

void SessionManager::DropLockLocked(Session& session, NodeId node,
                                    uint64_t handle) {
  session.lock_handles.erase(handle);
  if (--session.locks[node] == 0) session.locks.erase(node);
}

absl::StatusOr<std::vector<SessionManager::SessionMatch>> SessionManager::Match(
    const std::string& id, absl::Span<const std::vector<int32_t>> requests,
    bool lock_hits, bool peek, bool exact_tail) {
  if (absl::Status s = CheckItems(requests.size(), "MatchPrefix.items");
      !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "MatchPrefix");
  if (!session.ok()) return session.status();
  std::vector<SessionMatch> results;
  results.reserve(requests.size());
  for (const std::vector<int32_t>& tokens : requests) {
    absl::StatusOr<MatchResult> match =
        engine_->Match((*session)->info.ns, tokens, peek, lock_hits,
                       exact_tail);
    if (!match.ok()) {
      // All or nothing: release what this call locked.
      for (const SessionMatch& done : results) {
        if (done.lock_handle == 0) continue;
        (void)engine_->Unlock(done.match.last_device_node);
        DropLockLocked(**session, done.match.last_device_node,
                       done.lock_handle);
      }
      return match.status();
    }
    SessionMatch result{*std::move(match)};
    if (lock_hits && result.match.device_len > 0) {
      result.lock_handle =
          AddLockLocked(**session, result.match.last_device_node);
    }
    results.push_back(std::move(result));
  }
  return results;
}

absl::StatusOr<std::vector<SessionInsertResult>> SessionManager::Insert(
    const std::string& id, absl::Span<const SessionInsertItem> items) {
  if (absl::Status s = CheckItems(items.size(), "Insert.items"); !s.ok()) {
    return s;
  }
  int64_t pages = 0;
  for (const SessionInsertItem& item : items) {
    pages += static_cast<int64_t>(item.pages.size());
  }
  if (pages > limits_.max_pages_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("Insert names ", pages, " pages; the limit is ",
                     limits_.max_pages_per_request));
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Insert");
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
    absl::StatusOr<InsertResult> inserted =
        engine_->Insert(s.info.ns, item.tokens, item.pages,
                        {.unfinished = item.unfinished}, s.holder);
    if (!inserted.ok()) {
      return absl::Status(
          inserted.status().code(),
          absl::StrCat("items[", i, "]: ", inserted.status().message()));
    }
    SessionInsertResult result{*inserted};
    // A deferred insert changed nothing: its backup stays the session's for
    // the retry. Otherwise a backup that cannot attach is rolled back.
    if (item.backup_id != 0 && !inserted->deferred) {
      absl::Status attached =
          engine_->AttachBackup(item.backup_id, inserted->node);
      result.backup_attached = attached.ok();
      if (!attached.ok()) {
        if (absl::Status r = engine_->RollbackBackup(item.backup_id);
            !r.ok() && r.code() != absl::StatusCode::kNotFound) {
          spdlog::warn("session {}: rolling back backup {} that did not "
                       "attach ({}): {}",
                       id, item.backup_id, attached.message(), r);
        }
        s.backups.erase(item.backup_id);
      }
    }
    results.push_back(std::move(result));
  }
  return results;
}

absl::Status SessionManager::CheckInsert(
    const std::string& id, absl::Span<const SessionInsertItem> items) {
  if (absl::Status s = CheckItems(items.size(), "items"); !s.ok()) return s;
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Insert");
  if (!session.ok()) return session.status();
  const Session& s = **session;
  absl::flat_hash_set<uint64_t> backups;
  absl::flat_hash_set<LogicalPage> pages;
  for (size_t i = 0; i < items.size(); ++i) {
    const SessionInsertItem& item = items[i];
    if (item.backup_id != 0 && (!s.backups.contains(item.backup_id) ||
                                !backups.insert(item.backup_id).second)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].backup_id ", item.backup_id,
          " is not a backup of this session, or another item's"));
    }
    if (absl::Status c =
            engine_->CheckInsert(s.info.ns, item.tokens, item.pages, s.holder);
        !c.ok()) {
      return absl::Status(c.code(),
                          absl::StrCat("items[", i, "]: ", c.message()));
    }
    for (LogicalPage page : item.pages) {
      // A page of the session's own goes to one item; the tree's pages of a
      // shared prefix may be named by several.
      if (!pages.insert(page).second &&
          engine_->CheckHeldBy({page}, s.holder).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("items[", i, "]: page ", page,
                         " is also another item's"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> SessionManager::Lock(
    const std::string& id, absl::Span<const NodeId> nodes) {
  if (absl::Status s = CheckItems(nodes.size(), "Lock.nodes"); !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Lock");
  if (!session.ok()) return session.status();
  std::vector<uint64_t> handles;
  handles.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    absl::Status s = CheckNodeInNamespace(**session, nodes[i],
                                          absl::StrCat("nodes[", i, "]"));
    if (s.ok()) s = engine_->Lock(nodes[i]);
    if (!s.ok()) {
      // Undo the locks taken by this call.
      for (size_t j = 0; j < i; ++j) {
        (void)engine_->Unlock(nodes[j]);
        DropLockLocked(**session, nodes[j], handles[j]);
      }
      return absl::Status(s.code(), absl::StrCat("nodes[", i, "]: ",
                                                 s.message()));
    }
    handles.push_back(AddLockLocked(**session, nodes[i]));
  }
  return handles;
}

absl::Status SessionManager::Unlock(const std::string& id,
                                    absl::Span<const NodeId> nodes) {
  if (absl::Status s = CheckItems(nodes.size(), "Unlock.nodes"); !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Unlock");
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
    uint64_t handle = 0;
    for (const auto& [h, locked] : (*session)->lock_handles) {
      if (locked == node) {
        handle = h;
        break;
      }
    }
    DropLockLocked(**session, node, handle);
  }
  return absl::OkStatus();
}

absl::Status SessionManager::UnlockHandles(const std::string& id,
                                           absl::Span<const uint64_t> handles) {
  if (absl::Status s = CheckItems(handles.size(), "Unlock.lock_handles");
      !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Unlock");
  if (!session.ok()) return session.status();
  if (absl::Status s = CheckHandlesLocked(**session, handles); !s.ok()) {
    return s;
  }
  for (uint64_t handle : handles) {
    const NodeId node = (*session)->lock_handles.at(handle);
    (void)engine_->Unlock(node);
    DropLockLocked(**session, node, handle);
  }
  return absl::OkStatus();
}

absl::Status SessionManager::CheckHandlesLocked(
    const Session& session, absl::Span<const uint64_t> handles) const {
  absl::flat_hash_set<uint64_t> seen;
  for (size_t i = 0; i < handles.size(); ++i) {
    if (!seen.insert(handles[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lock_handles[", i, "] = ", handles[i], " is repeated"));
    }
    if (!session.lock_handles.contains(handles[i])) {
      return absl::NotFoundError(absl::StrCat(
          "lock_handles[", i, "] = ", handles[i],
          " is not a lock of this session"));
    }
  }
  return absl::OkStatus();
}

absl::Status SessionManager::CheckHandles(
    const std::string& id, absl::Span<const uint64_t> handles) const {
  if (absl::Status s = CheckItems(handles.size(), "lock_handles"); !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session '", id, "'"));
  }
  return CheckHandlesLocked(it->second, handles);
}

absl::Status SessionManager::CheckPages(
    const std::string& id, absl::Span<const LogicalPage> pages) const {
  if (static_cast<int64_t>(pages.size()) > limits_.max_pages_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("the call names ", pages.size(), " pages; the limit is ",
                     limits_.max_pages_per_request));
  }
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session '", id, "'"));
  }
  return engine_->CheckHeldBy(pages, it->second.holder);
}

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
  if (static_cast<int64_t>((*session)->fences.size()) >=
      kMaxFencesPerSession) {
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
    const bool known = caller.backups.contains(backups[i]) ||
                       (worker && NamespaceOwnsBackupLocked(caller.info.ns,
                                                            backups[i]));
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backup_ids[", i, "] = ", backups[i], " is not a backup of ",
          worker ? "this worker's namespace" : "this session"));
    }
  }
  if (fences.size() > engine_->layout().cp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(fences.size(), " fences for ",
                     engine_->layout().cp_size(), " ranks"));
  }
  for (size_t i = 0; i < fences.size(); ++i) {
    auto owner = fence_ns_.find(fences[i].fence);
    if (owner == fence_ns_.end() || owner->second != caller.info.ns) {
      return absl::NotFoundError(
          absl::StrCat("fences[", i, "] = ", fences[i].fence,
                       " is not registered in this session's namespace"));
    }
    if (worker && fences[i].rank != caller.info.rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fences[", i, "] is for rank ", fences[i].rank, "; this worker is rank ",
          caller.info.rank));
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

absl::Status SessionManager::Pin(const std::string& id, NodeId node,
                                 absl::Duration ttl) {
  if (ttl < absl::ZeroDuration() || ttl > limits_.max_pin_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ttl must be in [0, ", absl::FormatDuration(limits_.max_pin_ttl),
        "] (--max_pin_ttl_ms), got ", absl::FormatDuration(ttl)));
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Pin");
  if (!session.ok()) return session.status();
  if (absl::Status s = CheckNodeInNamespace(**session, node, "node");
      !s.ok()) {
    return s;
  }
  return engine_->Pin(node, ttl);
}

void SessionManager::BackupFinished(const std::string& id, uint64_t backup) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.backups.erase(backup);
}

absl::Status SessionManager::BeginStream(const std::string& id) {
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  if ((*session)->streams >= limits_.max_streams_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", id, " already has ", (*session)->streams,
        " open streams, the limit (--max_streams_per_session)"));
  }
  ++(*session)->streams;
  return absl::OkStatus();
}

void SessionManager::EndStream(const std::string& id) {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end() && it->second.streams > 0) --it->second.streams;
}

SessionManager::Totals SessionManager::totals() const {
  MutexLock lock(&mu_);
  Totals totals;
  totals.sessions = static_cast<int64_t>(sessions_.size());
  for (const auto& [id, session] : sessions_) {
    for (const auto& [node, count] : session.locks) totals.locks += count;
    totals.pages += engine_->RequestPages(session.holder);
  }
  return totals;
}

std::vector<SessionInfo> SessionManager::List() const {
  MutexLock lock(&mu_);
  std::vector<SessionInfo> out;
  for (const auto& [id, session] : sessions_) out.push_back(session.info);
  return out;
}

absl::StatusOr<SessionInfo> SessionManager::Info(const std::string& id) const {
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError("session is unknown or its lease expired");
  }
  return it->second.info;
}

}  // namespace hicache
