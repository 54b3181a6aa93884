// SessionManager: a session's calls on its namespace of the tree --
// MatchPrefix (optionally locking each hit), Insert (attaching or rolling
// back each item's backup), CheckInsert and Pin.
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/session_manager.h"
#include "spdlog/spdlog.h"

namespace hicache {

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
    absl::StatusOr<MatchResult> match = engine_->Match(
        (*session)->info.ns, tokens, peek, lock_hits, exact_tail);
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
          spdlog::warn(
              "session {}: rolling back backup {} that did not "
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
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "].backup_id ", item.backup_id,
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
        return absl::InvalidArgumentError(absl::StrCat(
            "items[", i, "]: page ", page, " is also another item's"));
      }
    }
  }
  return absl::OkStatus();
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
  if (absl::Status s = CheckNodeInNamespace(**session, node, "node"); !s.ok()) {
    return s;
  }
  return engine_->Pin(node, ttl);
}

}  // namespace hicache
