#include "daemon/engine/op_lifecycle.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hicache {

static_assert(static_cast<int>(OpState::kFinished) + 1 == kNumOpStates);
static_assert(static_cast<int>(OpTrigger::kFinish) + 1 == kNumOpTriggers);

namespace {

using S = OpState;
using T = OpTrigger;

absl::Status Refused(OpState state, OpTrigger trigger) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot ", std::string(OpTriggerName(trigger)),
                   " an op that is ", std::string(OpStateName(state))));
}

absl::StatusOr<OpState> NextBackupState(OpState state, OpTrigger trigger) {
  switch (state) {
    case S::kPrepared:
      switch (trigger) {
        case T::kAttach:
          return S::kAttached;
        case T::kCopyFailed:
          return S::kFailed;
        case T::kRollback:
          return S::kRolledBack;
        default:
          break;
      }
      break;
    case S::kAttached:
      switch (trigger) {
        case T::kCopyFailed:
        case T::kCommitFailed:
          return S::kFailedAttached;
        case T::kCommit:
          return S::kCommitted;
        case T::kRollback:
          return S::kRolledBack;
        default:
          break;
      }
      break;
    case S::kRolledBack:
      // Already ending: later failures and rollbacks change nothing.
      if (trigger == T::kCopyFailed || trigger == T::kRollback) return state;
      break;
    case S::kFailed:
    case S::kFailedAttached:
    case S::kFailedReleased:
      switch (trigger) {
        case T::kAttach:
          return absl::AbortedError(
              "it failed (a copy did not complete); roll it back");
        case T::kCopyFailed:
          return state;
        case T::kRollback:
          return S::kFailedReleased;
        default:
          break;
      }
      break;
    case S::kCommitted:
      break;
    default:
      break;
  }
  return Refused(state, trigger);
}

absl::StatusOr<OpState> NextLoadState(OpState state, OpTrigger trigger) {
  switch (state) {
    case S::kLoading:
      switch (trigger) {
        case T::kCopyFailed:
          return S::kLoadFailing;
        case T::kLoadAttached:
          return S::kLoaded;
        case T::kLoadAttachFailed:
          return S::kLoadFailed;
        case T::kRollback:
          return S::kLoadAbandoned;
        default:
          break;
      }
      break;
    case S::kLoadFailing:
      switch (trigger) {
        case T::kCopyFailed:
          return state;
        case T::kFailureSettled:
          return S::kLoadFailed;
        case T::kRollback:
          return S::kLoadAbandoned;
        default:
          break;
      }
      break;
    case S::kLoadFailed:
      if (trigger == T::kCopyFailed) return state;
      if (trigger == T::kRollback) return S::kLoadAbandoned;
      break;
    case S::kLoaded:
      if (trigger == T::kFinish) return S::kFinished;
      break;
    case S::kLoadAbandoned:
      if (trigger == T::kCopyFailed || trigger == T::kRollback) return state;
      break;
    default:
      break;
  }
  return Refused(state, trigger);
}

}  // namespace

OpState InitialOpState(OpKind kind, bool attached) {
  if (kind == OpKind::kLoad) return S::kLoading;
  return attached ? S::kAttached : S::kPrepared;
}

bool OpStateOf(OpKind kind, OpState state) {
  const bool backup_state = state <= S::kFailedReleased;
  return (kind == OpKind::kBackup) == backup_state;
}

absl::StatusOr<OpState> NextOpState(OpKind kind, OpState state,
                                    OpTrigger trigger) {
  if (!OpStateOf(kind, state)) {
    return absl::InternalError(
        absl::StrCat(kind == OpKind::kBackup ? "a backup" : "a load",
                     " cannot be ", std::string(OpStateName(state))));
  }
  return kind == OpKind::kBackup ? NextBackupState(state, trigger)
                                 : NextLoadState(state, trigger);
}

bool OpFailed(OpState state) {
  switch (state) {
    case S::kFailed:
    case S::kFailedAttached:
    case S::kFailedReleased:
    case S::kLoadFailing:
    case S::kLoadFailed:
      return true;
    default:
      return false;
  }
}

bool OpGivenUp(OpState state) {
  switch (state) {
    case S::kRolledBack:
    case S::kFailed:
    case S::kFailedAttached:
    case S::kFailedReleased:
    case S::kLoadAbandoned:
      return true;
    default:
      return false;
  }
}

bool OpEnding(OpState state) { return OpGivenUp(state) || OpFailed(state); }

bool OpInFlight(OpState state) {
  return state == S::kPrepared || state == S::kAttached || state == S::kLoading;
}

std::string_view OpStateName(OpState state) {
  switch (state) {
    case S::kPrepared:
      return "prepared";
    case S::kAttached:
      return "attached";
    case S::kCommitted:
      return "committed";
    case S::kRolledBack:
      return "rolled back";
    case S::kFailed:
      return "failed";
    case S::kFailedAttached:
      return "failed after it was attached";
    case S::kFailedReleased:
      return "failed and released";
    case S::kLoading:
      return "loading";
    case S::kLoaded:
      return "loaded";
    case S::kLoadFailing:
      return "failing";
    case S::kLoadFailed:
      return "failed (a miss)";
    case S::kLoadAbandoned:
      return "abandoned";
    case S::kFinished:
      return "finished";
  }
  return "unknown";
}

std::string_view OpTriggerName(OpTrigger trigger) {
  switch (trigger) {
    case T::kAttach:
      return "attach";
    case T::kCopyFailed:
      return "fail a copy of";
    case T::kCommit:
      return "commit";
    case T::kCommitFailed:
      return "fail the commit of";
    case T::kRollback:
      return "roll back";
    case T::kLoadAttached:
      return "attach the pages of";
    case T::kLoadAttachFailed:
      return "fail the attach of";
    case T::kFailureSettled:
      return "settle the failure of";
    case T::kFinish:
      return "finish";
  }
  return "unknown";
}

}  // namespace hicache
