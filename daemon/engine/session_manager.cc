// SessionManager: session lifecycle -- Open, KeepAlive, Close and lease
// expiry (releasing all a session holds), the lookups and checks every call
// shares, streams, and listing. A session's pages, locks, tree calls and
// transfers are in session_manager_{pages,locks,tree,transfers}.cc; the
// census in session_census.cc.
#include "daemon/engine/session_manager.h"

#include <random>
#include <utility>
#include <vector>

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
