#include "daemon/engine/op_lifecycle.h"

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using S = OpState;
using T = OpTrigger;

constexpr S kBackupStates[] = {
    S::kPrepared, S::kAttached,       S::kCommitted,     S::kRolledBack,
    S::kFailed,   S::kFailedAttached, S::kFailedReleased};
constexpr S kLoadStates[] = {S::kLoading,    S::kLoaded,        S::kLoadFailing,
                             S::kLoadFailed, S::kLoadAbandoned, S::kFinished};

std::vector<T> AllTriggers() {
  std::vector<T> all;
  for (int t = 0; t < kNumOpTriggers; ++t) all.push_back(static_cast<T>(t));
  return all;
}

// The model: every legal move written out by hand, apart from the
// implementation's switch. Anything not listed is refused.
using Move = std::tuple<OpKind, S, T>;
const std::map<Move, S>& LegalMoves() {
  static const auto* moves = new std::map<Move, S>{
      // Backups.
      {{OpKind::kBackup, S::kPrepared, T::kAttach}, S::kAttached},
      {{OpKind::kBackup, S::kPrepared, T::kCopyFailed}, S::kFailed},
      {{OpKind::kBackup, S::kPrepared, T::kRollback}, S::kRolledBack},
      {{OpKind::kBackup, S::kAttached, T::kCopyFailed}, S::kFailedAttached},
      {{OpKind::kBackup, S::kAttached, T::kCommitFailed}, S::kFailedAttached},
      {{OpKind::kBackup, S::kAttached, T::kCommit}, S::kCommitted},
      {{OpKind::kBackup, S::kAttached, T::kRollback}, S::kRolledBack},
      {{OpKind::kBackup, S::kRolledBack, T::kCopyFailed}, S::kRolledBack},
      {{OpKind::kBackup, S::kRolledBack, T::kRollback}, S::kRolledBack},
      {{OpKind::kBackup, S::kFailed, T::kCopyFailed}, S::kFailed},
      {{OpKind::kBackup, S::kFailed, T::kRollback}, S::kFailedReleased},
      {{OpKind::kBackup, S::kFailedAttached, T::kCopyFailed},
       S::kFailedAttached},
      {{OpKind::kBackup, S::kFailedAttached, T::kRollback}, S::kFailedReleased},
      {{OpKind::kBackup, S::kFailedReleased, T::kCopyFailed},
       S::kFailedReleased},
      {{OpKind::kBackup, S::kFailedReleased, T::kRollback}, S::kFailedReleased},
      // Loads.
      {{OpKind::kLoad, S::kLoading, T::kCopyFailed}, S::kLoadFailing},
      {{OpKind::kLoad, S::kLoading, T::kLoadAttached}, S::kLoaded},
      {{OpKind::kLoad, S::kLoading, T::kLoadAttachFailed}, S::kLoadFailed},
      {{OpKind::kLoad, S::kLoading, T::kRollback}, S::kLoadAbandoned},
      {{OpKind::kLoad, S::kLoadFailing, T::kCopyFailed}, S::kLoadFailing},
      {{OpKind::kLoad, S::kLoadFailing, T::kFailureSettled}, S::kLoadFailed},
      {{OpKind::kLoad, S::kLoadFailing, T::kRollback}, S::kLoadAbandoned},
      {{OpKind::kLoad, S::kLoadFailed, T::kCopyFailed}, S::kLoadFailed},
      {{OpKind::kLoad, S::kLoadFailed, T::kRollback}, S::kLoadAbandoned},
      {{OpKind::kLoad, S::kLoaded, T::kFinish}, S::kFinished},
      {{OpKind::kLoad, S::kLoadAbandoned, T::kCopyFailed}, S::kLoadAbandoned},
      {{OpKind::kLoad, S::kLoadAbandoned, T::kRollback}, S::kLoadAbandoned},
  };
  return *moves;
}

TEST(OpLifecycleTest, EveryStateTimesEveryTriggerMatchesTheModel) {
  int legal = 0;
  int refused = 0;
  for (OpKind kind : {OpKind::kBackup, OpKind::kLoad}) {
    for (int st = 0; st < kNumOpStates; ++st) {
      const S state = static_cast<S>(st);
      for (T trigger : AllTriggers()) {
        SCOPED_TRACE(testing::Message()
                     << (kind == OpKind::kBackup ? "backup " : "load ")
                     << OpStateName(state) << " x " << OpTriggerName(trigger));
        absl::StatusOr<S> next = NextOpState(kind, state, trigger);
        if (!OpStateOf(kind, state)) {
          // A state of the other kind: an engine bug, never a client's.
          EXPECT_EQ(next.status().code(), absl::StatusCode::kInternal);
          continue;
        }
        auto it = LegalMoves().find({kind, state, trigger});
        if (it != LegalMoves().end()) {
          ASSERT_TRUE(next.ok()) << next.status();
          EXPECT_EQ(*next, it->second);
          ++legal;
          continue;
        }
        ++refused;
        ASSERT_FALSE(next.ok()) << "moved to " << OpStateName(*next);
        // Attaching a failed backup is ABORTED (roll it back); every other
        // refusal is FAILED_PRECONDITION, and names the state.
        const bool failed_backup = kind == OpKind::kBackup && OpFailed(state);
        EXPECT_EQ(next.status().code(),
                  failed_backup && trigger == T::kAttach
                      ? absl::StatusCode::kAborted
                      : absl::StatusCode::kFailedPrecondition);
        if (next.status().code() == absl::StatusCode::kFailedPrecondition) {
          EXPECT_NE(std::string(next.status().message())
                        .find(std::string(OpStateName(state))),
                    std::string::npos)
              << next.status();
        }
      }
    }
  }
  EXPECT_EQ(legal, static_cast<int>(LegalMoves().size()));
  EXPECT_EQ(legal + refused, 7 * kNumOpTriggers + 6 * kNumOpTriggers);
}

TEST(OpLifecycleTest, EndsAreTerminal) {
  for (T trigger : AllTriggers()) {
    EXPECT_FALSE(NextOpState(OpKind::kBackup, S::kCommitted, trigger).ok());
    EXPECT_FALSE(NextOpState(OpKind::kLoad, S::kFinished, trigger).ok());
  }
}

TEST(OpLifecycleTest, InitialStates) {
  EXPECT_EQ(InitialOpState(OpKind::kBackup), S::kPrepared);
  EXPECT_EQ(InitialOpState(OpKind::kBackup, /*attached=*/true), S::kAttached);
  EXPECT_EQ(InitialOpState(OpKind::kLoad), S::kLoading);
}

TEST(OpLifecycleTest, EveryStateIsReachableFromAnInitialState) {
  std::set<std::pair<OpKind, S>> reached;
  std::vector<std::pair<OpKind, S>> frontier = {
      {OpKind::kBackup, InitialOpState(OpKind::kBackup)},
      {OpKind::kBackup, InitialOpState(OpKind::kBackup, true)},
      {OpKind::kLoad, InitialOpState(OpKind::kLoad)}};
  while (!frontier.empty()) {
    auto [kind, state] = frontier.back();
    frontier.pop_back();
    if (!reached.insert({kind, state}).second) continue;
    for (T trigger : AllTriggers()) {
      absl::StatusOr<S> next = NextOpState(kind, state, trigger);
      if (next.ok()) frontier.push_back({kind, *next});
    }
  }
  for (S s : kBackupStates) {
    EXPECT_TRUE(reached.contains({OpKind::kBackup, s})) << OpStateName(s);
  }
  for (S s : kLoadStates) {
    EXPECT_TRUE(reached.contains({OpKind::kLoad, s})) << OpStateName(s);
  }
  EXPECT_EQ(reached.size(), std::size(kBackupStates) + std::size(kLoadStates));
}

// The predicates the engine asks, state by state: the six flags the op
// record used to carry, which these replace.
TEST(OpLifecycleTest, PredicatesMatchTheFlagsTheyReplace) {
  struct Flags {
    S state;
    bool failed, given_up, in_flight;
  };
  const Flags table[] = {
      {S::kPrepared, false, false, true},
      {S::kAttached, false, false, true},
      {S::kCommitted, false, false, false},
      {S::kRolledBack, false, true, false},
      {S::kFailed, true, true, false},
      {S::kFailedAttached, true, true, false},
      {S::kFailedReleased, true, true, false},
      {S::kLoading, false, false, true},
      {S::kLoaded, false, false, false},
      {S::kLoadFailing, true, false, false},
      {S::kLoadFailed, true, false, false},
      {S::kLoadAbandoned, false, true, false},
      {S::kFinished, false, false, false},
  };
  ASSERT_EQ(std::size(table), static_cast<size_t>(kNumOpStates));
  for (const Flags& f : table) {
    SCOPED_TRACE(OpStateName(f.state));
    EXPECT_EQ(OpFailed(f.state), f.failed);
    EXPECT_EQ(OpGivenUp(f.state), f.given_up);
    EXPECT_EQ(OpEnding(f.state), f.failed || f.given_up);
    EXPECT_EQ(OpInFlight(f.state), f.in_flight);
  }
}

TEST(OpLifecycleTest, NamesAreDistinct) {
  std::set<std::string_view> states, triggers;
  for (int s = 0; s < kNumOpStates; ++s) {
    states.insert(OpStateName(static_cast<S>(s)));
  }
  for (T t : AllTriggers()) triggers.insert(OpTriggerName(t));
  EXPECT_EQ(states.size(), static_cast<size_t>(kNumOpStates));
  EXPECT_EQ(triggers.size(), static_cast<size_t>(kNumOpTriggers));
  EXPECT_FALSE(states.contains("unknown"));
}

}  // namespace
}  // namespace hicache
