// SessionManager: a session's locks -- every lock it takes (MatchPrefix with
// lock, Lock, a load's hand-over) has its own handle; Lock, Unlock (by node)
// and UnlockHandles release them, CheckHandles checks them.
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/engine/session_manager.h"

namespace hicache {

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
      return absl::Status(s.code(),
                          absl::StrCat("nodes[", i, "]: ", s.message()));
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
      return absl::InvalidArgumentError(
          absl::StrCat("lock_handles[", i, "] = ", handles[i], " is repeated"));
    }
    if (!session.lock_handles.contains(handles[i])) {
      return absl::NotFoundError(
          absl::StrCat("lock_handles[", i, "] = ", handles[i],
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

}  // namespace hicache
