#pragma once

// The lifecycle of one backup (device -> host copy) or load (host -> device
// copy): its states, what moves it between them, and the one function that
// decides every move. docs/engine.md draws the diagram.
//
// The state says where the op stands with its client and its node; how many
// copies are still running is counted apart (an op whose state has ended
// is finished -- its pages freed, its record erased -- once no copy touches
// its pages any more). Pure: no engine state, no locks.
//
// Backup:
//
//   kPrepared --attach--> kAttached --commit--> kCommitted (end)
//       |                    |
//       |  rollback          |  rollback
//       +------------------> kRolledBack (end once its copies settle)
//       |                    |
//       |  copy failed       |  copy failed / commit failed
//       v                    v
//    kFailed            kFailedAttached      (record kept: the client may
//       |                    |                still name the op)
//       +----rollback--------+--> kFailedReleased (end once settled)
//
// Load:
//
//   kLoading --all copies, attached--> kLoaded --finish--> kFinished (end)
//      |  \----all copies, attach failed----> kLoadFailed
//      |  copy failed                             ^
//      v                                          |
//   kLoadFailing --------copies settled-----------+
//      |                                          |
//      +--rollback (FinishLoad early)--> kLoadAbandoned <--rollback--+
//   (kLoading's rollback too; the end once its copies settle)
//
// A trigger that the state has already absorbed leaves it unchanged (a
// second copy failure, a second rollback). A trigger that makes no sense
// in the state is refused with the status its caller reports: ABORTED for
// attaching a failed backup, FAILED_PRECONDITION otherwise; the message
// names the state, and callers prefix the op.

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace hicache {

enum class OpKind : uint8_t { kBackup, kLoad };

enum class OpState : uint8_t {
  // Backups.
  kPrepared,        // Copies may run; waits for AttachBackup or a rollback.
  kAttached,        // Its node holds the pending reservation.
  kCommitted,       // The host copy is the node's (end).
  kRolledBack,      // Its client gave it up; never commits.
  kFailed,          // A copy failed before it was attached.
  kFailedAttached,  // A copy (or the commit) failed after it was attached.
  kFailedReleased,  // Failed, and its client is done with it.
  // Loads.
  kLoading,        // Copies run.
  kLoaded,         // Attached; the node is locked until FinishLoad.
  kLoadFailing,    // A copy failed; other copies may still run.
  kLoadFailed,     // Failed and settled: a miss, held until FinishLoad.
  kLoadAbandoned,  // Its client finished it early; never attaches.
  kFinished,       // FinishLoad after it was loaded (end).
};
inline constexpr int kNumOpStates = 13;

enum class OpTrigger : uint8_t {
  kAttach,            // Backup: AttachBackup names its node.
  kCopyFailed,        // A copy failed, or the op's lanes were lost.
  kCommit,            // Backup: every ack in, attached, committed.
  kCommitFailed,      // Backup: every ack in, but the tree refused it.
  kRollback,          // The client gives it up (RollbackBackup; FinishLoad
                      // before a load ended; a load that could not start).
  kLoadAttached,      // Load: every ack in, pages attached to the chain.
  kLoadAttachFailed,  // Load: every ack in, attaching failed.
  kFailureSettled,    // Load: a failed load's copies have all ended.
  kFinish,            // Load: FinishLoad after it was loaded.
};
inline constexpr int kNumOpTriggers = 9;

// The initial state of an op of `kind`; a write-back or write-ahead backup
// is made attached (`attached`).
OpState InitialOpState(OpKind kind, bool attached = false);

// The state after `trigger`, or why it is refused (the state unchanged).
absl::StatusOr<OpState> NextOpState(OpKind kind, OpState state,
                                    OpTrigger trigger);

// What the engine asks of a state.
bool OpStateOf(OpKind kind, OpState state);  // The state belongs to `kind`.
// The op failed (a copy, the commit or the attach of its pages).
bool OpFailed(OpState state);
// It will never commit or attach: its client gave it up, or (a backup) it
// failed. Its pages are no longer the op's; only running copies read them.
bool OpGivenUp(OpState state);
// Given up or failed: it ends once its running copies settle.
bool OpEnding(OpState state);
// Not ending and not complete: its copies may still complete it.
bool OpInFlight(OpState state);

std::string_view OpStateName(OpState state);
std::string_view OpTriggerName(OpTrigger trigger);

}  // namespace hicache
