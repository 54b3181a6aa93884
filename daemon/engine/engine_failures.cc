// HiCacheEngine: what a failed copy does. A completion with an error ends its
// operation, and nothing it touched is ever served (ARCHITECTURE §3 rule 4):
//
//  * Backup: it never commits. An attached backup's pending reservation
//    leaves the node at once (the node stays device-only and nothing of it
//    becomes host-matchable); its host pages are freed once no copy touches
//    them, and then its client hears its kRolledBack event. The record stays,
//    holding nothing, until the client is done with it (rolled back, or
//    attached with every step stored), so a client that has not heard of the
//    failure gets defined answers: LayerStored skips it, AttachBackup returns
//    ABORTED, RollbackBackup succeeds.
//  * Load: a miss. LoadDone returns ABORTED. Once its copies are all
//    complete the host refs go (the host copy is intact and stays matchable)
//    and kLoadDone(ok = false) follows; the loaded pages, never attached (and
//    kept busy, so no request can free them), and the lock on the device
//    prefix of the hit stay with the caller until FinishLoad, which frees
//    and releases them.
//  * A failed op announces no step (no layer whose bytes did not arrive is
//    ever reported stored or loaded), only its end.
//  * Only the first failure of a live op acts. Later failures (other ranks or
//    steps), and failures of an op its client already abandoned, change
//    nothing else: they never touch the node, which may by then carry a
//    newer backup.
#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/engine_op.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

void HiCacheEngine::FailOpLocked(Op& op, Rank rank, uint32_t step,
                                 const absl::Status& status) {
  ++stats_.copy_failures;
  spdlog::warn("copy of op {} rank {} step {} failed: {}", op.id, rank, step,
               status);
  if (OpEnding(op.state)) return;  // Already ending.
  const bool attached = op.state == OpState::kAttached;
  AdvanceOpLocked(op, OpTrigger::kCopyFailed);
  if (op.kind == Op::Kind::kBackup) {
    ++stats_.backups_failed;  // Never commits.
    if (attached) (void)tree_->AbortBackup(op.node);
  } else {
    ++stats_.loads_failed;
  }
}

void HiCacheEngine::FinishFailedBackupLocked(Op& op,
                                             std::vector<OpEvent>* events) {
  // The caller freed the host reservation and released the pages.
  op.host.clear();
  op.pages.clear();
  events->push_back(OpEvent::RolledBack(op.id));
  EraseSettledFailedBackupLocked(op.id);
}

void HiCacheEngine::EraseSettledFailedBackupLocked(uint64_t id) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  const Op& op = *it->second;
  // A failed op with no copy outstanding has been finished (its last
  // completion or CommitLocked did it).
  if (!OpFailed(op.state) || op.outstanding > 0) return;
  bool all_stored = true;
  for (bool submitted : op.submitted) all_stored &= submitted;
  if (op.state == OpState::kFailedReleased ||
      (op.state == OpState::kFailedAttached && all_stored)) {
    ops_.erase(it);
  }
}

void HiCacheEngine::FinishFailedLoadLocked(Op& op,
                                           std::vector<OpEvent>* events) {
  // The pages stay busy (a request cannot free them) and the device prefix
  // locked until FinishLoad (ReleaseFailedLoadLocked).
  for (const auto& [node, count] : op.chain) {
    (void)tree_->ReleaseHostRef(node);
  }
  op.chain.clear();
  AdvanceOpLocked(op, OpTrigger::kFailureSettled);
  events->push_back(OpEvent::LoadDone(op.id, false));
}

void HiCacheEngine::ReleaseFailedLoadLocked(uint64_t id) {
  // Ends it as a load abandoned before it was attached: pages released and
  // freed, device prefix unlocked, record erased; its kLoadDone was sent.
  Op& op = *ops_.find(id)->second;
  op.chain.clear();  // Its host refs went when its copies ended.
  AdvanceOpLocked(op, OpTrigger::kRollback);
  std::vector<OpEvent> sent;
  FinishOpLocked(id, &sent);
}

}  // namespace hicache
